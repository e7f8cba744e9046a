# --task=pathfinder --preset=cpu_rescue (ours; REPORT.md, A9, says why each value): SPT against scratch
# on PathFinder on a CPU. Two layers: joining two markers means chaining local hops along a contour,
# and one attention layer makes one hop. 10,000 images at the baseline difficulty, constant rates
# after a 5% warmup, SPT 11 epochs at 3e-3, finetuning 16 at 1e-3, float32 on every machine.
# About 3 h a run on one core (REPORT.md, take-off rates).
schedule, pretrain_schedule, warmup_steps, pretrain_warmup_steps, warmup_frac = "constant", "constant", 0, 0, 0.05
grad_clip, patience, dtype, difficulty, n_generate = 1.0, 0, "float32", "baseline", 10_000
depth, n_embd, n_head, lr, pretrain_lr, batch_size = 2, 64, 4, 1e-3, 3e-3, 32
pretrain_epochs, epochs, save_epochs = 11, 16, "1,5,11"
