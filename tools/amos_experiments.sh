#!/usr/bin/env bash
# The synthetic table under Amos et al.'s tied attention init (--init=amos), 3 seeds: scratch,
# frozen attention, SPT, and a random init given SPT's W_Q/W_K, attention or MLP; then its table
# (tools/spt_report.py). SLOTS (default 2) runs at once, one thread each. Run from the repository root:
#
#   tools/amos_experiments.sh synthetic        # writes out/amos/synthetic/, then its table
#
# Restartable: a run whose folder has summary.json is skipped, a killed one resumes from its
# checkpoint; a run's stdout goes to FOLDER.log. DRY=1 prints the commands instead. OUT (default
# out/amos) is where the folders go; EXTRA flags are added to every run (EXTRA="--n_train=64": a test).
set -uo pipefail
export OMP_NUM_THREADS=1
OUT=${OUT:-out/amos}
[ "${1:-}" = synthetic ] || { echo "usage: tools/amos_experiments.sh synthetic" >&2; exit 2; }

run() {   # run FOLDER FLAGS...: one train_spt.py run, unless it is finished
    local dir=$1; shift
    set -- "$@" ${EXTRA:-}
    if [ "${DRY:-0}" = 1 ]; then echo "python train_spt.py $* --out_dir=$dir"; return; fi
    if [ -f "$dir/summary.json" ]; then echo "finished already: $dir"; return; fi
    mkdir -p "$dir"
    if [ -f "$dir/ckpt.pt" ]; then python train_spt.py --out_dir="$dir" --init_from=resume >> "$dir.log" 2>&1
    else python train_spt.py "$@" --out_dir="$dir" --overwrite=True >> "$dir.log" 2>&1; fi
    [ -f "$dir/summary.json" ] && echo "done: $dir" || echo "FAILED: $dir (see $dir.log)"
}
slot() { while [ "$(jobs -rp | wc -l)" -ge "${SLOTS:-2}" ]; do wait -n; done; }   # fewer than SLOTS going

d=$OUT/synthetic base="--task=synthetic --init=amos"
for s in 0 1 2; do
    slot; run "$d/spt_s$s" $base --seed="$s" &
    slot; run "$d/scratch_s$s" $base --seed="$s" --pretrain_epochs=0 &
    slot; run "$d/frozen_attn_s$s" $base --seed="$s" --pretrain_epochs=0 --freeze=attn &
done
wait
for s in 0 1 2; do
    for group in qk attn mlp; do
        slot; run "$d/init_${group}_s$s" $base --seed="$s" --init_from="$d/spt_s$s/spt_best.pt" --init_params=$group &
    done
done
wait
[ "${DRY:-0}" = 1 ] || python tools/spt_report.py --runs="$d" --out="$d"
