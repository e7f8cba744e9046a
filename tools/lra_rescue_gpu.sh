#!/usr/bin/env bash
# The PathFinder rescue (REPORT.md, A9) on one GPU, in one call of under 9 minutes: the
# same train_spt.py runs as the CPU sweep (python tools/lra_rescue.py run), six at a time.
# The SPT-alone runs and spt go first (the gate), then the ablation arms.
#
#   bash tools/lra_rescue_gpu.sh [SECONDS]    # the sweep's time limit, default 420
#
# At the limit, `timeout` sends SIGTERM to the sweep and its runs: each saves its resume
# point and stops, and the same command, run again on the same machine, resumes them.
# Runs: out/rescue_gpu/ (one folder a run); records: results/rescue_gpu/ (ARMS and SEEDS
# pick the arms and seeds: by default every arm but attn, seeds 0-2). Where the device
# tool's $OUT is set, at most 8 files in it: the table (rescue.md), its two figures, the
# sweep's status and log, and records.tar.gz (every recorded run, SPT checkpoints included).
# A GPU replica, not more seeds of the CPU sweep: float32 on another device rounds
# differently, so its runs are tabled apart from the CPU's.
set -uo pipefail
cd "$(dirname "$0")/.."
LIMIT=${1:-420}
RUNS=out/rescue_gpu
RECORDS=results/rescue_gpu     # the GPU replica's records, tabled apart from the CPU's results/rescue
mkdir -p "$RUNS"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || echo "no nvidia-smi: the runs use what device=auto finds"

ARGS=(--out="$RUNS" --results="$RECORDS" --arms="${ARMS:-spt,qk,mlp,short1,short5,cross,frozen}" --seeds="${SEEDS:-0,1,2}"
      --extra="${EXTRA:-}" --extra_spt="${EXTRA_SPT:-}")    # report checks each record against these flags
timeout "$LIMIT" python tools/lra_rescue.py run "${ARGS[@]}" --slots=6 --max_core_hours=100 2>&1 | tee "$RUNS/sweep.log"
if [ "${PIPESTATUS[0]}" = 124 ]; then
    for _ in $(seq 60); do pgrep -f "train_spt.py.*$RUNS/" > /dev/null || break; sleep 1; done   # saving
    echo "stopped at ${LIMIT} s: run this script again on this machine to resume"
fi
python tools/lra_rescue.py status "${ARGS[@]}" --max_core_hours=100 | tee "$RUNS/status.txt"
python tools/lra_rescue.py report "${ARGS[@]}" > /dev/null || echo "no table: see the line above"

if [ -n "${OUT:-}" ]; then
    for f in rescue.md rescue_curves.png rescue_attention_2d.png status.txt sweep.log; do
        [ -f "$RUNS/$f" ] && cp "$RUNS/$f" "$OUT/"
    done
    [ -d "$RECORDS" ] && tar -czf "$OUT/records.tar.gz" "$RECORDS"   # commit them under results/rescue_gpu
fi
