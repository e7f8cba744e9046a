#!/usr/bin/env bash
# The looped-Transformer experiments, one run at a time (one thread each), in an order
# that completes whole seeds first. A finished run (summary.json) is skipped and a cut
# one resumed from its ckpt.pt, so the script can be stopped and started again.
#
#   bash tools/flt_map.sh map       # the stability map: bytes, 6 layers, d=64, 250 steps;
#                                   # the 1-loop reference and the five variants at K = 6, 9, 12
#   bash tools/flt_map.sh listops   # the test-time loop curve on ListOps: 2 layers, 2,000 steps;
#                                   # the 1-loop reference and FLT at K = 6, 12
#   bash tools/flt_map.sh listops_baselines   # LT and LT_i at K = 6, 12 on ListOps
#
# Environment: SEEDS (default "1 2 3"), OUT (default out/map: one folder per run), CODE
# (default this checkout: the folder whose train_flt.py runs, e.g. a frozen copy).
# Afterwards: python train_flt.py --compare=$(ls -d out/map/*/ | paste -sd,) --out_dir=out/map_figures
set -euo pipefail
cd "$(dirname "$0")/.."
CODE=${CODE:-.}
OUT=${OUT:-out/map}
SEEDS=${SEEDS:-"1 2 3"}
export OMP_NUM_THREADS=1

run() {   # run DIR FLAG...: skip it if finished, resume it if cut, else start it
  local dir=$1; shift
  if [ -f "$dir/summary.json" ]; then return 0; fi
  local how="--overwrite=True"
  if [ -f "$dir/ckpt.pt" ]; then how="--init_from=resume"; fi
  echo "$(date +%H:%M:%S) python train_flt.py $* --out_dir=$dir $how"
  python "$CODE/train_flt.py" "$@" --out_dir="$dir" "$how" > "$dir.out" 2>&1 || echo "  failed: see $dir.out"
}

MAP="--n_layer=6 --n_embd=64 --block_size=64 --batch_size=16 --max_steps=250 --eval_interval=25 --eval_batches=10"
LISTOPS="--data=listops --n_layer=2 --n_embd=64 --block_size=64 --batch_size=16 --max_steps=2000 --eval_interval=200"

grid() {   # grid FLAGS PREFIX "K..." "VARIANT...": per seed, the 1-loop reference, then every (K, variant)
  local flags=$1 prefix=$2 Ks=$3 variants=$4
  for seed in $SEEDS; do
    local ref=$OUT/${prefix}ref_K1_s$seed
    run "$ref" $flags --n_loops=1 --seed=$seed
    for K in $Ks; do for v in $variants; do
      run "$OUT/${prefix}${v}_K${K}_s$seed" $flags --variant=$v --n_loops=$K --seed=$seed --reference="$ref"
    done; done
  done
}

mkdir -p "$OUT"
case "${1:-}" in
  map) grid "$MAP" "" "6 9 12" "LT LT_i LT_ia FLT_res FLT" ;;
  listops) grid "$LISTOPS" "lo_" "6 12" "FLT" ;;
  listops_baselines) grid "$LISTOPS" "lo_" "6 12" "LT LT_i" ;;
  *) echo "usage: bash tools/flt_map.sh map | listops | listops_baselines" >&2; exit 2 ;;
esac
