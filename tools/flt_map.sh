#!/usr/bin/env bash
# The looped-Transformer experiments, one run at a time (one thread each), in an order that
# completes whole seeds first. A finished run (summary.json) is skipped and a cut one resumed
# from its ckpt.pt, so the script can be stopped and started again.
#
#   bash tools/flt_map.sh map       # the stability map: bytes, 6 layers, d=64, 250 steps;
#                                   # the 1-loop reference and the five variants at K = 6, 9, 12
#   bash tools/flt_map.sh listops   # the test-time loop curve on ListOps: 2 layers, 2,000 steps;
#                                   # the 1-loop reference and FLT at K = 6, 12
#   bash tools/flt_map.sh window    # the map's model at the authors' diagnostic length, 2,000 steps:
#                                   # the 1-loop reference, then FLT, LT_ia, LT_i, FLT_res, LT at K=12
#   bash tools/flt_map.sh ladder    # 2,000 steps: LT_ia and FLT at K = 24, then 16; then LT_i at both
#   KS="6 32" VARIANTS="LT FLT" bash tools/flt_map.sh rungs   # any rungs of the ladder (KS="": the reference)
#
# Environment: SEEDS (default "1 2 3"), OUT (default out/map: one folder per run), CODE (default
# this checkout: the folder whose train_flt.py runs, e.g. a frozen copy), RESULTS (window, ladder
# and rungs: results/flt_window; map and listops: none): where each finished run's record goes
# (summary.json, config.json, command.txt, log.jsonl, gzipped over 1 MB), to commit; a recorded
# run is not run again, and a recorded reference is read from its record. EXTRA: more flags for
# every run (a smoke test's tiny size). Two seeds can run at once: SEEDS=1 bash ... & SEEDS=2 bash ...
# Afterwards: python tools/flt_compare.py --runs=$(ls -d out/map/*/ | paste -sd,) --out=out/map_figures
set -euo pipefail
cd "$(dirname "$0")/.."
CODE=${CODE:-.} OUT=${OUT:-out/map} SEEDS=${SEEDS:-"1 2 3"}
export OMP_NUM_THREADS=1

recorded() { [ -n "${RESULTS:-}" ] && [ -f "$RESULTS/$(basename "$1")/summary.json" ]; }

record() {   # record DIR: its record under $RESULTS, whole (into .partial, then renamed)
  local dest=$RESULTS/$(basename "$1")
  rm -rf "$dest.partial" && mkdir -p "$dest.partial"
  cp "$1/summary.json" "$1/config.json" "$1/command.txt" "$dest.partial/"
  if [ "$(stat -c %s "$1/log.jsonl")" -gt 1000000 ]; then gzip -c "$1/log.jsonl" > "$dest.partial/log.jsonl.gz"
  else cp "$1/log.jsonl" "$dest.partial/"; fi
  rm -rf "$dest" && mv "$dest.partial" "$dest" && echo "  recorded: $dest (commit it)"
}

run() {   # run DIR FLAG...: skip it if recorded, resume it if cut, else start it; then record it
  local dir=$1; shift
  if recorded "$dir"; then return 0; fi
  if [ ! -f "$dir/summary.json" ]; then
    local how="--overwrite=True"
    if [ -f "$dir/ckpt.pt" ]; then how="--init_from=resume"; fi
    echo "$(date +%H:%M:%S) python train_flt.py $* --out_dir=$dir $how"
    python "$CODE/train_flt.py" "$@" --out_dir="$dir" "$how" >> "$dir.out" 2>&1 || { echo "  failed: see $dir.out"; return 0; }
  fi
  if [ -n "${RESULTS:-}" ]; then record "$dir"; fi
}

where() { if recorded "$1"; then echo "$RESULTS/$(basename "$1")"; else echo "$1"; fi; }   # a run's record, or its folder

MAP="--n_layer=6 --n_embd=64 --block_size=64 --batch_size=16 --max_steps=250 --eval_interval=25 --eval_batches=10"
WINDOW="${MAP/--max_steps=250/--max_steps=2000}"
LISTOPS="--data=listops --n_layer=2 --n_embd=64 --block_size=64 --batch_size=16 --max_steps=2000 --eval_interval=200"

grid() {   # grid FLAGS PREFIX "K..." "VARIANT...": per seed, the 1-loop reference, then every (K, variant)
  local flags=$1 prefix=$2 Ks=$3 variants=$4
  for seed in $SEEDS; do
    local ref=$OUT/${prefix}ref_K1_s$seed
    run "$ref" $flags ${EXTRA:-} --n_loops=1 --seed=$seed
    for K in $Ks; do for v in $variants; do
      run "$OUT/${prefix}${v}_K${K}_s$seed" $flags ${EXTRA:-} --variant=$v --n_loops=$K --seed=$seed --reference="$(where "$ref")"
    done; done
  done
}

case "${1:-}" in
  map|listops|window|ladder|rungs) mkdir -p "$OUT" ;;
  *) echo "usage: bash tools/flt_map.sh map | listops | window | ladder | rungs" >&2; exit 2 ;;
esac
case "$1" in
  map) grid "$MAP" "" "6 9 12" "LT LT_i LT_ia FLT_res FLT" ;;
  listops) grid "$LISTOPS" "lo_" "6 12" "FLT" ;;
  window|ladder|rungs) RESULTS=${RESULTS-results/flt_window}; mkdir -p "$RESULTS" ;;&
  window) grid "$WINDOW" "w_" "12" "FLT LT_ia LT_i FLT_res LT" ;;
  ladder) grid "$WINDOW" "w_" "24 16" "LT_ia FLT"; grid "$WINDOW" "w_" "24 16" "LT_i" ;;   # LT_ia and FLT first
  rungs) grid "$WINDOW" "w_" "${KS-24 16}" "${VARIANTS-LT_ia FLT LT_i}" ;;
esac
