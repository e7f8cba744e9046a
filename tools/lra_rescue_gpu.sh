#!/usr/bin/env bash
# The PathFinder rescue (REPORT.md, A9 and "Take-off rates") on one GPU, in calls of under
# 9 minutes each: the same train_spt.py runs as the CPU sweep, the lines of
# `python tools/lra_rescue.py commands` run SLOTS at a time (default 6) by xargs, wave by wave.
#
#   SLOTS=16 bash tools/lra_rescue_gpu.sh [SECONDS]   # the plan below, as far as SECONDS go (420)
#
# The plan, in the take-off issue's order: 1. scratch, seeds 0-2 (the recorded control every
# verdict reads); 2. spt, qk and scratch to seeds 0-9; 3. attn, mlp and frozen to seeds 0-9.
# ARMS and SEEDS (comma lists) run one stage of those instead. At the limit every run gets
# SIGTERM, saves its resume point and stops; the same command, run again on the same machine,
# resumes them. Runs: out/rescue_gpu/; records: results/rescue_gpu/, tabled apart from the CPU's
# (float32 on another device rounds differently). Give the device tool carry=["data/generated"]
# so that no call spends its minutes generating. Where $OUT is set (the device tool's folder):
# the table (rescue.md), its figures, the status, the log and records.tar.gz go there.
set -uo pipefail
cd "$(dirname "$0")/.."
RUNS=out/rescue_gpu RECORDS=results/rescue_gpu SLOTS=${SLOTS:-6} LIMIT=${1:-420} TEN=0,1,2,3,4,5,6,7,8,9
mkdir -p "$RUNS"
export PYTHONUNBUFFERED=1 RUNS RECORDS SLOTS
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || echo "no nvidia-smi: the runs use what device=auto finds"
start=$(date +%s)

stage() {   # stage ARMS SEEDS: the unrecorded runs, wave by wave, SLOTS at a time
  echo "== stage --arms=$1 --seeds=$2"
  for w in 1 2 3; do
    python tools/lra_rescue.py commands --out="$RUNS" --results="$RECORDS" --arms="$1" --seeds="$2" \
        --extra="${EXTRA:-}" --extra_spt="${EXTRA_SPT:-}" --wave=$w | OMP_NUM_THREADS=1 xargs -d '\n' -P "$SLOTS" -I{} sh -c '{}'
  done
}
plan() {
  if [ -n "${ARMS:-}${SEEDS:-}" ]; then stage "${ARMS:-spt,qk,scratch}" "${SEEDS:-0,1,2}"
  else stage scratch 0,1,2 && stage spt,qk,scratch "$TEN" && stage attn,mlp,frozen "$TEN"; fi
}
setsid bash -c "$(declare -f stage plan); TEN=$TEN plan" >> "$RUNS/sweep.log" 2>&1 &   # its own group: one kill reaches every run
leader=$!
while kill -0 "$leader" 2> /dev/null && [ $(( $(date +%s) - start )) -lt "$LIMIT" ]; do sleep 2; done
if kill -0 "$leader" 2> /dev/null; then
  kill -TERM -- "-$leader" 2> /dev/null                                          # each run saves its resume point
  for _ in $(seq 60); do pgrep -f "train_spt.py.*$RUNS/" > /dev/null || break; sleep 1; done
  echo "stopped at ${LIMIT} s: run this script again on this machine to resume" | tee -a "$RUNS/sweep.log"
fi
ALL=(--out="$RUNS" --results="$RECORDS" --arms="${ARMS:-scratch,spt,qk,attn,mlp,frozen}" --seeds="${SEEDS:-$TEN}")
echo "recorded: $(ls "$RECORDS"/*/summary.json 2> /dev/null | wc -l) runs in $RECORDS" | tee "$RUNS/status.txt"
python tools/lra_rescue.py commands "${ALL[@]}" 2>> "$RUNS/status.txt" | sed 's/.*--run=/left: /' >> "$RUNS/status.txt"
python tools/lra_rescue.py report "${ALL[@]}" > /dev/null || echo "no table: see the line above"   # every record

if [ -n "${OUT:-}" ]; then
  for f in rescue.md rescue_curves.png rescue_attention_2d.png rescue_take_offs.png status.txt sweep.log; do
    [ -f "$RUNS/$f" ] && cp "$RUNS/$f" "$OUT/"
  done
  [ -d "$RECORDS" ] && tar -czf "$OUT/records.tar.gz" "$RECORDS"   # commit them under results/rescue_gpu
fi
