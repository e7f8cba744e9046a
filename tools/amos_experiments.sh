#!/usr/bin/env bash
# The long CPU runs on Amos et al.'s tied attention init (--init=amos), two at a time,
# one thread each. Run from the repository root, one experiment per call:
#
#   tools/amos_experiments.sh synthetic        # the synthetic table under --init=amos, 3 seeds:
#                                              # scratch, frozen attention, SPT, W_Q/W_K, attention, MLP
#   tools/amos_experiments.sh plateau          # PathFinder, depth 1: steps until the SPT val loss
#                                              # leaves its plateau, amos vs torch, 2 seeds
#   tools/amos_experiments.sh depth2 [INIT]    # PathFinder, depth 2: SPT until its val loss < 0.70
#                                              # (at most 3,000 steps), then 3,000 steps of finetuning,
#                                              # against scratch with the same total and the same
#                                              # finetuning steps; INIT amos (default) or torch, 2 seeds
#
# Restartable: a run whose folder has summary.json is skipped, a killed one resumes from its
# checkpoint (or starts again when it had none), and each folder gets the command that made it
# (the run writes command.txt; its stdout goes to FOLDER.log). DRY=1 prints the commands instead.
# SLOTS (default 2) runs go at once.
# OUT (default out/amos) is where the folders go; PY (default python) the interpreter; EXTRA
# flags are added to every run (last flag wins: EXTRA="--n_train=64" shrinks them, for a test).
set -uo pipefail
export OMP_NUM_THREADS=1
OUT=${OUT:-out/amos}
PY=${PY:-python}
DRY=${DRY:-0}
EXTRA=${EXTRA:-}
SEEDS_SYNTHETIC="0 1 2"
SEEDS_PATHFINDER="0 1"
EPOCHS_1_TO_12=1,2,3,4,5,6,7,8,9,10,11,12   # 250 steps each: 8,000 training images, batch 32

run() {   # run FOLDER FLAGS...: one train_spt.py run, unless it is finished
    local dir=$1; shift
    set -- "$@" $EXTRA
    if [ "$DRY" = 1 ]; then echo "$PY train_spt.py $* --out_dir=$dir"; return; fi
    if [ -f "$dir/summary.json" ]; then echo "finished already: $dir"; return; fi
    mkdir -p "$dir"
    if [ -f "$dir/ckpt.pt" ] && [[ "$*" != *--init_from=* ]]; then
        "$PY" train_spt.py --out_dir="$dir" --init_from=resume >> "$dir.log" 2>&1
    else
        "$PY" train_spt.py "$@" --out_dir="$dir" --overwrite=True >> "$dir.log" 2>&1
    fi
    [ -f "$dir/summary.json" ] && echo "done: $dir" || echo "FAILED: $dir (see $dir.log)"
}

slot() {   # wait until fewer than SLOTS runs of ours are going
    while [ "$(jobs -rp | wc -l)" -ge "${SLOTS:-2}" ]; do wait -n; done
}

synthetic() {
    local d=$OUT/synthetic base="--task=synthetic --init=amos"
    for s in $SEEDS_SYNTHETIC; do
        slot; run "$d/spt_s$s" $base --seed="$s" &
        slot; run "$d/scratch_s$s" $base --seed="$s" --pretrain_epochs=0 &
        slot; run "$d/frozen_attn_s$s" $base --seed="$s" --pretrain_epochs=0 --freeze=attn &
    done
    wait
    for s in $SEEDS_SYNTHETIC; do
        for group in qk attn mlp; do
            slot; run "$d/init_${group}_s$s" $base --seed="$s" --init_from="$d/spt_s$s/spt_best.pt" \
                --init_params=$group &
        done
    done
    wait
    [ "$DRY" = 1 ] || "$PY" train_spt.py --report="$d"
}

pathfinder_base() {   # --preset=cpu (baseline difficulty, 10k images, d=64, SPT lr 3e-3), constant lr
    echo "--task=pathfinder --preset=cpu --schedule=constant --pretrain_schedule=constant --patience=0"
}

plateau() {
    local d=$OUT/plateau runs=""
    for s in $SEEDS_PATHFINDER; do
        for init in amos torch; do
            slot; run "$d/${init}_s$s" $(pathfinder_base) --depth=1 --init=$init --seed="$s" --pretrain_epochs=12 \
                --epochs=1 --save_epochs=$EPOCHS_1_TO_12 &
            runs="$runs,$d/${init}_s$s"
        done
    done
    wait
    [ "$DRY" = 1 ] || "$PY" tools/spt_plateau.py --runs="${runs#,}" | tee "$d/plateau.md"
}

first_epoch_below() {   # first_epoch_below RUN: the SPT epoch whose checkpoint the finetuning starts from
    if [ "$DRY" = 1 ]; then echo K; else "$PY" tools/spt_plateau.py --runs="$1" --threshold=0.70 --epoch_only=True; fi
}

depth2_finetune() {   # depth2_finetune FOLDER SEED: the three 3,000-step finetuning arms of one seed
    local d=$1 s=$2 base k
    base="$(pathfinder_base) --depth=2 --init=$INIT --seed=$s"
    k=$(first_epoch_below "$d/spt_s$s")
    run "$d/spt_finetune_s$s" $base --init_from="$d/spt_s$s/spt_epoch$k.pt" --epochs=12
    run "$d/scratch_steps_s$s" $base --pretrain_epochs=0 --epochs=12
    run "$d/scratch_compute_s$s" $base --pretrain_epochs=0 --epochs=$([ "$k" = K ] && echo "12+K" || echo $((12 + k)))
}

depth2() {
    INIT=${1:-amos}
    local d=$OUT/depth2_$INIT
    for s in $SEEDS_PATHFINDER; do   # SPT, 12 epochs kept one by one (the 1 epoch of finetuning is unused)
        slot; run "$d/spt_s$s" $(pathfinder_base) --depth=2 --init=$INIT --seed="$s" --pretrain_epochs=12 \
            --epochs=1 --save_epochs=$EPOCHS_1_TO_12 &
    done
    wait
    for s in $SEEDS_PATHFINDER; do
        slot; depth2_finetune "$d" "$s" &
    done
    wait
    [ "$DRY" = 1 ] || { "$PY" tools/spt_plateau.py --runs="$d/spt_s0,$d/spt_s1" | tee "$d/plateau.md";
                        "$PY" train_spt.py --report="$d"; }
}

case "${1:-}" in
    synthetic) synthetic ;;
    plateau) plateau ;;
    depth2) depth2 "${2:-amos}" ;;
    *) echo "usage: tools/amos_experiments.sh synthetic | plateau | depth2 [amos|torch]" >&2; exit 2 ;;
esac
