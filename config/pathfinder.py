# --task=pathfinder: DEFAULTS are already Amos et al.'s PathFinder run (IdoAmos/not-from-scratch,
# configs/experiment/lra/transformer-lra-pathfinder(-mlm).yaml: width 128, 8 heads, MLP x1, lr 5e-4,
# batch 32, 50 SPT / 200 finetuning epochs, warmup 2500 / 5000), with one layer: --depth=4 is theirs.
task = "pathfinder"
