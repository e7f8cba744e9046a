# --task=listops --preset=cpu (ours): about an hour at depth 1 (2 s a step on one core): 4,800 training
# expressions of 500-2,000 tokens, SPT 6 + finetuning 4 epochs; 250 val and 250 test expressions.
schedule, warmup_steps, pretrain_warmup_steps, warmup_frac, grad_clip, patience, dtype = "cosine", 0, 0, 0.05, 1.0, 20, "fast"
n_generate, n_train, depth, n_embd, n_head, ffn_mult = 12_500, 4_800, 1, 64, 4, 2
lr, pretrain_lr, batch_size, pretrain_epochs, epochs, save_epochs = 1e-3, 3e-3, 32, 6, 4, "1,2,5"
