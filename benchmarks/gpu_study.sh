#!/usr/bin/env bash
# A CPU study's remaining runs on a lent GPU machine (DEVELOPERS.md), started in one call, polled in the next:
#
#   bash benchmarks/gpu_study.sh start benchmarks/study_regimes.py --part ablate --jobs 4 [--only ...]
#   bash benchmarks/gpu_study.sh poll 540      # waits up to 540 s or until the study ends; results to $OUT
#   STUDY_DOCS=none bash benchmarks/gpu_study.sh start benchmarks/gpu_table5.py --epochs 200 --eval-every 10 \
#       --inits 'mimetic[base=kaiming]' --seed 0     # a script that keeps no ledger in docs/: no --docs
#
# `start` unpacks the carried .gpu-data (cifar_pack.py's pack or ../shared/tools/gpu_data.py's) into
# ../shared/datasets/cifar10 (where CIFAR-10 lies here: the --data spec is part of a run's recipe, so the
# committed ledger's rows count only under the same spec) and copies docs/ to /tmp/study/docs (once each), so the
# study skips the runs its committed ledger already has; then runs the study in the background with --data
# cifar10:../shared/datasets/cifar10 --out /tmp/study/runs --docs /tmp/study/docs. Every poll copies to $OUT the
# log, the study's docs it changed (its ledger, once it ends, holds every run: copy it over docs/ here) and
# runs.tar.gz, each run's small files (no checkpoints), so a lost machine loses little. STUDY_WORK and STUDY_DATA
# move /tmp/study and the data; STUDY_DOCS=none leaves --docs out. Nothing is written or copied through a link:
# one in $work where the script writes is refused, and a ledger that is a link is not copied to $OUT.
set -euo pipefail
work=${STUDY_WORK:-/tmp/study}
data=${STUDY_DATA:-../shared/datasets/cifar10}
python=${PYTHON:-python3}  # the device machine's; here, for a smoke test: PYTHON=.venv/bin/python
docs=(--docs "$work/docs")
[ "${STUDY_DOCS:-}" != none ] || docs=()
refuse() {
    echo "gpu_study.sh: $1" >&2
    exit 1
}
running() { [ -f "$work/pid" ] && kill -0 "$(cat "$work/pid")" 2>/dev/null; }
wait_study() {  # until the study ends or $1 seconds pass
    local deadline=$((SECONDS + $1))
    while running && [ $SECONDS -lt $deadline ]; do sleep 2; done
}
for path in "$work" "$work/pid" "$work/rc" "$work/study.log" "$work/docs" "$work/runs"; do
    [ ! -L "$path" ] || refuse "$path is a link, and the study writes nothing through one: move it away (its target stays)"
done
if [ -f "$work/pid" ] && ! [[ $(head -c 32 "$work/pid") =~ ^[1-9][0-9]{0,8}$ ]]; then  # kill -0 0: this shell's group
    refuse "$work/pid is damaged (not a process id): remove it once no study runs"
fi
case "${1:-}" in
start)
    shift
    [ -d "$data/train" ] || "$python" benchmarks/cifar_pack.py unpack .gpu-data "$data"
    if running; then refuse "a study is still running (pid $(cat "$work/pid")): poll it first"; fi
    [ -d "$work/docs" ] || { mkdir -p "$work" && cp -r docs "$work/docs"; }  # a second study goes on from the first's
    rm -f "$work/rc"
    # shellcheck disable=SC2016  # $0 and $@ are the inner shell's: the study and its arguments
    PYTHONPATH=src setsid nohup bash -c '"$0" "$@"; echo $? > "'"$work/rc"'"' "$python" "$@" \
        --data "cifar10:$data" --out "$work/runs" "${docs[@]}" > "$work/study.log" 2>&1 < /dev/null &
    echo $! > "$work/pid"
    wait_study 60  # its first minute: a study that fails at once says why in this call
    ;;
poll)
    wait_study "${2:-540}"
    ;;
*)
    echo "usage: gpu_study.sh start STUDY.py ARGS... | gpu_study.sh poll [SECONDS]" >&2
    exit 2
    ;;
esac
out=${OUT:-/tmp/study-out}
mkdir -p "$out/docs"
cp "$work/study.log" "$out/"
for f in "$work"/docs/*-runs.jsonl "$work"/docs/*.csv; do  # those the study changed: $OUT returns 8 files at most
    if [ -f "$f" ] && [ ! -L "$f" ] && ! cmp -s "$f" "docs/$(basename "$f")"; then cp "$f" "$out/docs/"; fi
done
if [ -d "$work/runs" ]; then
    tar -czf "$out/runs.tar.gz" -C "$work/runs" --exclude='*.pt' .
fi
if running; then echo "running"; else echo "ended (exit $(cat "$work/rc" 2>/dev/null || echo '?'))"; fi
tail -5 "$work/study.log"
