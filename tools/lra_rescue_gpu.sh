#!/usr/bin/env bash
# The PathFinder rescue (REPORT.md, A9 and "Take-off rates") on one GPU, in calls of under
# 9 minutes each: the same train_spt.py runs as the CPU sweep (python tools/lra_rescue.py
# run), SLOTS at a time.
#
#   bash tools/lra_rescue_gpu.sh probe [SECONDS]   # how many runs at once finish the most runs
#                                                  # an hour: COUNTS (6 12 16 24), SECONDS each (75)
#   SLOTS=16 bash tools/lra_rescue_gpu.sh [SECONDS] # the plan below, as far as SECONDS go (420)
#
# The plan, in the take-off issue's order, each stage one `run` of the driver (which runs the
# SPT-alone runs before the arms that start from them, and skips a recorded run):
#   1. scratch, seeds 0-2 (the recorded control every verdict reads);
#   2. spt, qk and scratch to seeds 0-9 (spt_pretrain with them);
#   3. attn, mlp and frozen to seeds 0-9.
# ARMS and SEEDS (comma lists) run one stage of those instead.
# At the limit, `timeout` sends SIGTERM to the sweep and its runs: each saves its resume
# point and stops, and the same command, run again on the same machine, resumes them.
# Runs: out/rescue_gpu/ (one folder a run); records: results/rescue_gpu/, tabled apart from
# the CPU's (float32 on another device rounds differently).
#
# The probe starts COUNT throwaway scratch runs at once (seeds 100 and up, out/rescue_gpu/probe),
# counts the steps all of them make between WARM seconds (30: data, CUDA start) and SECONDS,
# stops them, and prints a row a count: steps a second, and runs an hour at 6,750 steps a
# run (scratch, or SPT 2,750 + finetuning 4,000). Adopt the best count as SLOTS' default below.
# Give the device tool carry=["data/generated"] so that no call spends its minutes generating.
#
# Where the device tool's $OUT is set, at most 8 files in it: the table (rescue.md), its three
# figures, the sweep's status and log, records.tar.gz (every recorded run, SPT checkpoints
# included) and probe.md.
set -uo pipefail
cd "$(dirname "$0")/.."
RUNS=out/rescue_gpu
RECORDS=results/rescue_gpu     # the GPU replica's records, tabled apart from the CPU's results/rescue
SLOTS=${SLOTS:-6}              # runs at once: 6 until the probe has measured this GPU
RUN_STEPS=6750                 # a scratch run: 27 epochs of 250 steps (the cpu_rescue preset)
mkdir -p "$RUNS"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || echo "no nvidia-smi: the runs use what device=auto finds"
start=$(date +%s)

steps_now() {   # the steps all probe runs have logged so far
  local total=0 n
  for log in "$RUNS"/probe/r*/log.jsonl; do
    n=$(grep -o '"step": [0-9]*' "$log" 2> /dev/null | tail -1 | cut -d' ' -f2)
    total=$((total + ${n:-0}))
  done
  echo "$total"
}

probe() {   # probe SECONDS: a row of probe.md per count of runs at once
  local secs=$1 warm=${WARM:-30} run=(python train_spt.py --task=pathfinder --preset=cpu_rescue
        --pretrain_epochs=0 --epochs=27 ${EXTRA:-})
  rm -rf "$RUNS/probe" && mkdir -p "$RUNS/probe"
  "${run[@]}" --seed=100 --out_dir="$RUNS/probe/warm" --halt_after_steps=1 > "$RUNS/probe/warm.out" 2>&1
  grep -q "halted after 1 steps" "$RUNS/probe/warm.out" \
      || { echo "the probe's first run failed: see $RUNS/probe/warm.out"; exit 1; }   # it made the data, once
  echo "| runs at once | steps a second, all runs | runs an hour (6,750 steps a run) |" > "$RUNS/probe.md"
  echo "|---|---|---|" >> "$RUNS/probe.md"
  for n in ${COUNTS:-6 12 16 24}; do
    rm -rf "$RUNS"/probe/r*
    for i in $(seq "$n"); do
      OMP_NUM_THREADS=1 "${run[@]}" --seed=$((100 + i)) --out_dir="$RUNS/probe/r$i" --overwrite=True \
          > "$RUNS/probe/r$i.out" 2>&1 &
    done
    sleep "$warm"; local a; a=$(steps_now)
    sleep $((secs - warm)); local b; b=$(steps_now)
    kill $(jobs -p) 2> /dev/null; wait
    awk -v n="$n" -v d=$((b - a)) -v t=$((secs - warm)) -v r=$RUN_STEPS \
        'BEGIN { printf "| %d | %.1f | %.1f |\n", n, d / t, d / t * 3600 / r }' | tee -a "$RUNS/probe.md"
  done
  grep '^| [0-9]' "$RUNS/probe.md" | sort -t'|' -k3 -g | tail -1 | awk -F'|' '{ printf "the most runs an hour: %d at once (SLOTS=%d)\n", $2, $2 }'
}

stage() {   # stage ARMS SEEDS: one run of the driver, in the time the call has left
  local left=$((LIMIT - ($(date +%s) - start)))
  [ "$left" -gt 5 ] || return 124
  echo "== stage --arms=$1 --seeds=$2, ${left} s left"
  timeout "$left" python tools/lra_rescue.py run --out="$RUNS" --results="$RECORDS" --arms="$1" --seeds="$2" \
      --extra="${EXTRA:-}" --extra_spt="${EXTRA_SPT:-}" --slots="$SLOTS" --max_core_hours=1000
}

if [ "${1:-}" = probe ]; then
  probe "${2:-75}"
else
  LIMIT=${1:-420}
  TEN=0,1,2,3,4,5,6,7,8,9
  {
    if [ -n "${ARMS:-}${SEEDS:-}" ]; then stage "${ARMS:-spt,qk,scratch}" "${SEEDS:-0,1,2}"
    else stage scratch 0,1,2 && stage spt,qk,scratch "$TEN" && stage attn,mlp,frozen "$TEN"
    fi
  } 2>&1 | tee -a "$RUNS/sweep.log"
  if [ "${PIPESTATUS[0]}" = 124 ]; then
    for _ in $(seq 60); do pgrep -f "train_spt.py.*$RUNS/" > /dev/null || break; sleep 1; done   # saving
    echo "stopped at ${LIMIT} s: run this script again on this machine to resume"
  fi
  ALL=(--out="$RUNS" --results="$RECORDS" --arms="${ARMS:-scratch,spt,qk,attn,mlp,frozen}"   # the plan's arms
       --seeds="${SEEDS:-$TEN}" --extra="${EXTRA:-}" --extra_spt="${EXTRA_SPT:-}")   # report checks these flags
  python tools/lra_rescue.py status "${ALL[@]}" --max_core_hours=1000 | tee "$RUNS/status.txt"
  python tools/lra_rescue.py report "${ALL[@]}" > /dev/null || echo "no table: see the line above"   # every record
fi

if [ -n "${OUT:-}" ]; then
  for f in rescue.md rescue_curves.png rescue_attention_2d.png rescue_take_offs.png status.txt sweep.log probe.md; do
    [ -f "$RUNS/$f" ] && cp "$RUNS/$f" "$OUT/"
  done
  [ -d "$RECORDS" ] && tar -czf "$OUT/records.tar.gz" "$RECORDS"   # commit them under results/rescue_gpu
fi
