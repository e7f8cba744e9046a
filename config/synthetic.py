# --task=synthetic: ours (synthetic.py, the length-100 local task), the CPU recipe of REPORT.md's
# synthetic tables: a small 1-layer model, PyTorch's default init, a cosine schedule.
depth, n_embd, n_head, ffn_mult, lr, batch_size = 1, 64, 4, 2, 1e-3, 64
pretrain_epochs, epochs, mask_ratio, init, pixel_encoder = 10, 20, 0.15, "torch", "token"
schedule, warmup_steps, pretrain_warmup_steps, warmup_frac, grad_clip, patience = "cosine", 0, 0, 0.05, 1.0, 20
