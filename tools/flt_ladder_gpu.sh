#!/usr/bin/env bash
# Paper B's loop ladder on one GPU, in one call of under 9 minutes (REPORT.md, "The map at
# 2,000 steps"): the window's model (tools/flt_map.sh: 6 layers, d=64, T=64, batch 16, 2,000
# steps) at K = 16, 24, 32, 9, 6, every variant, 3 seeds, against each seed's 1-loop
# reference; then the README's main command, timed for about a minute.
#
#   bash tools/flt_ladder_gpu.sh [SECONDS]    # the ladder's time limit, default 400
#
# First the three references, then one process per (seed, K), PAR at a time (default 15), each
# running the five variants at its K through `flt_map.sh rungs`. At the limit every run gets
# SIGTERM, saves its resume point and stops; the same command, run again on the same machine,
# resumes them. Records: results/flt_window_gpu/ (a GPU replica, tabled apart). Then
# `python train_spt.py --task=pathfinder --depth=1` with its GPU settings for MAIN_SECONDS (60):
# its cost lines and the measured steps a second, with the full run's time at that rate
# (main_command.txt). Where $OUT is set (the device tool's folder): compare.md, the figures,
# both logs and records.tar.gz go there. The CPU smoke test (tests/test_tools.py) sets EXTRA
# (a tiny model), KS, SEEDS, MAIN_FLAGS and MAIN_SECONDS.
set -uo pipefail
cd "$(dirname "$0")/.."
DEVICE_OUT=${OUT:-} LIMIT=${1:-400} RUNS=${RUNS:-out/flt_gpu} RESULTS=${RESULTS:-results/flt_window_gpu}
KS=${KS:-"16 24 32 9 6"} SEEDS=${SEEDS:-"1 2 3"} PAR=${PAR:-15}
export PYTHONUNBUFFERED=1 OUT=$RUNS RESULTS VARIANTS="LT_ia FLT LT_i FLT_res LT"   # OUT: flt_map.sh's runs folder
mkdir -p "$RUNS" "$RESULTS"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || echo "no nvidia-smi: the runs use what device=auto finds"
start=$(date +%s)

ladder() {   # the references, then every (seed, K): a process each, PAR at a time
  for s in $SEEDS; do KS="" SEEDS=$s bash tools/flt_map.sh rungs & done; wait
  for K in $KS; do for s in $SEEDS; do echo "$s $K"; done; done | xargs -P "$PAR" -n 2 sh -c 'SEEDS=$0 KS=$1 bash tools/flt_map.sh rungs'
}
setsid bash -c "$(declare -f ladder); SEEDS='$SEEDS' KS='$KS' PAR=$PAR ladder" > "$RUNS/ladder.log" 2>&1 &
leader=$!
while kill -0 "$leader" 2> /dev/null && [ $(( $(date +%s) - start )) -lt "$LIMIT" ]; do sleep 2; done
if kill -0 "$leader" 2> /dev/null; then
  kill -TERM -- "-$leader" 2> /dev/null                 # every run saves its resume point
  for _ in $(seq 60); do pgrep -f "train_flt.py.*$RUNS/" > /dev/null || break; sleep 1; done
  echo "stopped at ${LIMIT} s: run this script again on this machine to resume" | tee -a "$RUNS/ladder.log"
fi
echo "ladder: $(ls -d "$RESULTS"/*/ 2> /dev/null | wc -l) records in $RESULTS after $(( $(date +%s) - start )) s"
records=$(ls -d "$RESULTS"/*/ 2> /dev/null | paste -sd, -)
[ -n "$records" ] && python tools/flt_compare.py --runs="$records" --out="$RUNS/figures" > /dev/null

main=$RUNS/main_command        # the README's main command with its GPU settings: the rate it reaches
rm -rf "$main"
timeout -s TERM "${MAIN_SECONDS:-60}" python train_spt.py --task=pathfinder --depth=1 --compile=True \
    --data_dir="$RUNS/data" --out_dir="$main" ${MAIN_FLAGS:-} > "$main.log" 2>&1
python - "$main" <<'EOF' | tee "$main.txt"
import re, sys
import train_spt
log = open(sys.argv[1] + ".log", errors="replace").read()
rates = [float(r) for r in re.findall(r"([\d.]+)it/s", log)] + [1 / float(r) for r in re.findall(r"([\d.]+)s/it", log)]
print("\n".join(x for x in log.splitlines()[:12] if "hour" in x or "day" in x or " min" in x) or "(no cost line)")
plan = re.search(r"\[spt\] (\d+) train .*?, (\d+) epochs x (\d+) steps", log)
if rates and plan:                                       # the bar's rate at the end of the minute
    epochs = train_spt.DEFAULTS["pretrain_epochs"] + train_spt.DEFAULTS["epochs"]    # SPT + finetuning, same split
    steps = epochs * int(plan[3])
    print(f"measured: {rates[-1]:.1f} steps a second; the full run's {steps:,} steps ({epochs} epochs x {plan[3]}): "
          f"{steps / rates[-1] / 3600:.2f} h at that rate (evaluations not counted)")
else:
    print("no training step was reached in the time given")
EOF

if [ -n "$DEVICE_OUT" ]; then
  cp "$RUNS/ladder.log" "$main.txt" "$main.log" "$RUNS/figures/compare.md" "$RUNS/figures/"*.png "$DEVICE_OUT/" 2> /dev/null
  tar -czf "$DEVICE_OUT/records.tar.gz" "$RESULTS"      # commit them under results/flt_window_gpu
fi
