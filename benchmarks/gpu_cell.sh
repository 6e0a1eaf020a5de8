#!/usr/bin/env bash
# One 200-epoch run of the paper's Table 5 cell (gpu_table5.py) on a lent GPU, started in one call and polled
# in the next (DEVELOPERS.md): at the H200's compiled pace (~3 s an epoch, docs/bench_train.md) ~10 minutes.
#
#   bash benchmarks/gpu_cell.sh start 'mimetic[base=kaiming]' 0 && bash benchmarks/gpu_cell.sh poll 500
#   bash benchmarks/gpu_cell.sh poll 540          # the next call, at once: until the run ends
#   SMOKE=1 PYTHON=.venv/bin/python bash benchmarks/gpu_cell.sh start timm 0   # here: the pipeline, ~1 min
#
# `start` unpacks the carried .gpu-data (all of CIFAR-10: `python benchmarks/cifar_pack.py pack
# ../shared/datasets/cifar10 .gpu-data` here, once) and runs gpu_table5.py in its own session, --epochs 200
# --eval-every 10, into $CELL_WORK/out; every poll copies its ledger, summary, curves and log to $OUT, so a lost
# machine loses little. Here, the files go to docs/table5/<device>-seed<n>-e200/ (regimes.md, "Next on a GPU").
set -euo pipefail
work=${CELL_WORK:-/tmp/cell}
data=${STUDY_DATA:-/tmp/cifar10}
python=${PYTHON:-python3}
wait_run() {  # until the run ends or $1 seconds pass
    local deadline=$((SECONDS + $1))
    while kill -0 "$(cat "$work/pid")" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 2; done
}
case "${1:-}" in
start)
    init=${2:?give the init label}
    seed=${3:?give the seed}
    mkdir -p "$work"
    if [ -n "${SMOKE:-}" ]; then
        run=(--smoke)
    else
        [ -d "$data/train" ] || "$python" benchmarks/cifar_pack.py unpack .gpu-data "$data"
        run=(--data "cifar10:$data" --epochs 200 --eval-every 10)
    fi
    rm -f "$work/rc"
    # shellcheck disable=SC2016  # $0 and $@ are the inner shell's
    PYTHONPATH=src setsid nohup bash -c '"$0" "$@"; echo $? > "'"$work/rc"'"' "$python" benchmarks/gpu_table5.py \
        "${run[@]}" --inits "$init" --seed "$seed" --out "$work/out" >"$work/run.log" 2>&1 </dev/null &
    echo $! >"$work/pid"
    wait_run 30 # its first seconds: a run that fails at once says why in this call
    ;;
poll)
    wait_run "${2:-540}"
    ;;
*)
    echo "usage: gpu_cell.sh start INIT SEED | gpu_cell.sh poll [SECONDS]" >&2
    exit 2
    ;;
esac
out=${OUT:-/tmp/cell-out}
mkdir -p "$out"
cp "$work/run.log" "$out/"
for f in ledger.jsonl summary.json curves.png; do [ -f "$work/out/$f" ] && cp "$work/out/$f" "$out/"; done
if kill -0 "$(cat "$work/pid")" 2>/dev/null; then echo "running"; else echo "ended (exit $(cat "$work/rc" 2>/dev/null || echo '?'))"; fi
tail -3 "$work/run.log"
