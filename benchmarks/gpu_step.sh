#!/usr/bin/env bash
# Issue 61's device check in one call (DEVELOPERS.md): bench_gpu.py's table on real CIFAR-10 with the compiled
# step's profile, then the CUDA tests; every output to $OUT as it comes.
#
#   bash benchmarks/gpu_step.sh           # the device machine (carry .gpu-data, either pack): ~6 min
#   SMOKE=1 bash benchmarks/gpu_step.sh   # here, any CPU: the same steps on bench_gpu.py --smoke
set -uo pipefail
python=${PYTHON:-python3}
out=${OUT:-/tmp/gpu-step}
data=${STUDY_DATA:-../shared/datasets/cifar10}
mkdir -p "$out"
export PYTHONPATH=src PYTHONUNBUFFERED=1
if [ -n "${SMOKE:-}" ]; then
    bench=(--smoke)
    tests=(tests/test_randaugment.py)
else
    [ -d "$data/train" ] || "$python" benchmarks/cifar_pack.py unpack .gpu-data "$data" || exit 2  # its line says why
    nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,memory.used --format=csv >"$out/smi.txt"
    bench=(--data "cifar10:$data" --budget "${BUDGET:-200}" --variants train train-cudagraphs compile compile-no-randaugment
        compile-flash-attention compile-math-attention compile-cudagraphs eager eager-no-randaugment compile-two-models)
    # the new GPU test first: a call cut short has run it
    tests=(tests/test_cuda.py::test_randaugment_gives_the_same_images_on_cuda_as_on_the_cpu_without_waiting_for_the_gpu
        tests/test_cuda.py tests/test_randaugment.py)
fi
"$python" -c "import torch, timm, PIL; print('torch', torch.__version__, 'timm', timm.__version__, 'Pillow', PIL.__version__)" |
    tee "$out/versions.txt"
timeout "${BENCH_SECONDS:-330}" "$python" benchmarks/bench_gpu.py "${bench[@]}" --profile "$out/kernels.txt" \
    --json "$out/bench.json" 2>&1 | tee "$out/bench.log"
timeout "${TEST_SECONDS:-150}" "$python" -m pytest -q -p no:cacheprovider "${tests[@]}" 2>&1 | tail -25 |
    tee "$out/tests.txt"
