#!/usr/bin/env bash
# Paper B's loop ladder on one GPU, in one call of under 9 minutes (REPORT.md, "The map at
# 2,000 steps"): the window's model (tools/flt_map.sh: 6 layers, d=64, T=64, batch 16, 2,000
# steps) at K = 16, 24, 32, 9, 6, every variant, 3 seeds, against each seed's 1-loop
# reference; then the README's main command, timed for about a minute.
#
#   bash tools/flt_ladder_gpu.sh [SECONDS]    # the ladder's time limit, default 400
#
# The ladder: first the three references (one process a seed), then one process per
# (seed, K), PAR at a time (default 15; the GPU is lent with 16 cores), each running the
# five variants at its K through `flt_map.sh rungs`. At the limit every run gets SIGTERM,
# saves its resume point and stops; the same command, run again on the same machine,
# resumes them, and a recorded run never runs again. Records: results/flt_window_gpu/ (a
# GPU replica: another device and bf16 round differently, so it is tabled apart).
# Then `python train_spt.py --task=pathfinder --depth=1` with its GPU settings (--compile,
# bf16: dtype auto) for MAIN_SECONDS (default 60): its first lines (the cost it announces)
# and the measured steps a second, with the full run's time at that rate (main_command.txt).
# Where the device tool's $OUT is set: the table (compare.md), the figures, both logs and
# records.tar.gz go there.
#
# A CPU smoke test at a tiny size (tests/test_tools.py runs it):
#   EXTRA="--n_layer=1 --n_embd=16 --block_size=16 --max_steps=6 ..." KS=2 SEEDS=1 \
#   MAIN_FLAGS="--n_generate=200 ..." MAIN_SECONDS=20 bash tools/flt_ladder_gpu.sh 60
set -uo pipefail
cd "$(dirname "$0")/.."
DEVICE_OUT=${OUT:-}            # the device tool's folder; OUT below is flt_map.sh's runs folder
LIMIT=${1:-400}
RUNS=${RUNS:-out/flt_gpu}
RESULTS=${RESULTS:-results/flt_window_gpu}
KS=${KS:-"16 24 32 9 6"}
SEEDS=${SEEDS:-"1 2 3"}
PAR=${PAR:-15}
MAIN_SECONDS=${MAIN_SECONDS:-60}
export PYTHONUNBUFFERED=1 OUT=$RUNS RESULTS VARIANTS="LT_ia FLT LT_i FLT_res LT"
mkdir -p "$RUNS" "$RESULTS"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || echo "no nvidia-smi: the runs use what device=auto finds"
start=$(date +%s)

ladder() {   # the references, then every (seed, K): a process each, PAR at a time
  for s in $SEEDS; do KS="" SEEDS=$s bash tools/flt_map.sh rungs & done; wait
  for K in $KS; do for s in $SEEDS; do echo "$s $K"; done; done |
    xargs -P "$PAR" -n 2 sh -c 'SEEDS=$0 KS=$1 bash tools/flt_map.sh rungs'
}
setsid bash -c "$(declare -f ladder); ladder" > "$RUNS/ladder.log" 2>&1 &
leader=$!
while kill -0 "$leader" 2> /dev/null && [ $(( $(date +%s) - start )) -lt "$LIMIT" ]; do sleep 2; done
if kill -0 "$leader" 2> /dev/null; then
    kill -TERM -- "-$leader" 2> /dev/null                 # every run saves its resume point
    for _ in $(seq 60); do pgrep -f "train_flt.py.*$RUNS/" > /dev/null || break; sleep 1; done
    echo "stopped at ${LIMIT} s: run this script again on this machine to resume" | tee -a "$RUNS/ladder.log"
fi
echo "ladder: $(ls -d "$RESULTS"/*/ 2> /dev/null | wc -l) records in $RESULTS after $(( $(date +%s) - start )) s"
records=$(ls -d "$RESULTS"/*/ 2> /dev/null | paste -sd, -)
[ -n "$records" ] && python train_flt.py --compare="$records" --out_dir="$RUNS/figures" > /dev/null

# The README's main command with its GPU settings, for MAIN_SECONDS: the rate it reaches
main=$RUNS/main_command
rm -rf "$main"
timeout -s TERM "$MAIN_SECONDS" python train_spt.py --task=pathfinder --depth=1 --compile=True \
    --data_dir="$RUNS/data" --out_dir="$main" ${MAIN_FLAGS:-} > "$main.log" 2>&1
python - "$main" <<'EOF' | tee "$main.txt"
import re, sys
log = open(sys.argv[1] + ".log", errors="replace").read()
rates = [float(r) for r in re.findall(r"([\d.]+)it/s", log)] + [1 / float(r) for r in re.findall(r"([\d.]+)s/it", log)]
first = [line for line in log.splitlines()[:12] if "hour" in line or "day" in line or " min" in line]
print("\n".join(first) or "(no cost line)")
plan = re.search(r"\[spt\] (\d+) train .*?, (\d+) epochs x (\d+) steps", log)
if rates and plan:
    rate = rates[-1]                                     # the bar's rate at the end of the minute
    import train_spt
    epochs = train_spt.DEFAULTS["pretrain_epochs"] + train_spt.DEFAULTS["epochs"]    # SPT + finetuning, same split
    steps = epochs * int(plan[3])
    print(f"measured: {rate:.1f} steps a second; the full run's {steps:,} steps ({epochs} epochs x {plan[3]}): "
          f"{steps / rate / 3600:.2f} h at that rate (evaluations not counted)")
else:
    print("no training step was reached in the time given")
EOF

if [ -n "$DEVICE_OUT" ]; then
    cp "$RUNS/ladder.log" "$main.txt" "$main.log" "$DEVICE_OUT/" 2> /dev/null
    cp "$RUNS/figures/compare.md" "$RUNS/figures/"*.png "$DEVICE_OUT/" 2> /dev/null
    tar -czf "$DEVICE_OUT/records.tar.gz" "$RESULTS"      # commit them under results/flt_window_gpu
fi
