# --task=pathfinder --preset=cpu (ours): about 40 min at depth 1 on a core that computes bf16 (1.6 h in
# float32 on an AVX2-only one): 10,000 images at the baseline difficulty, SPT 12 + finetuning 5 epochs,
# a 5% warmup then cosine, clipping, early stopping, and the faster dtype here. SPT at a higher lr, as
# it must get below the pixels' unigram entropy (0.79 nats) to teach anything.
schedule, warmup_steps, pretrain_warmup_steps, warmup_frac, grad_clip, patience, dtype = "cosine", 0, 0, 0.05, 1.0, 20, "fast"
difficulty, n_generate, depth, n_embd, n_head = "baseline", 10_000, 1, 64, 4
lr, pretrain_lr, batch_size, pretrain_epochs, epochs, save_epochs = 1e-3, 3e-3, 32, 12, 5, "1,2,5,10"
