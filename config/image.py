# --task=image: their cifar(-mlm).yaml: 3 layers, width 64, 4 heads, MLP x2, lr 1e-3, finetuning batch
# 50 (SPT: 32), 50 SPT / 200 finetuning epochs, warmup 2500 (SPT) / 2000.
depth, n_embd, n_head, ffn_mult, lr, batch_size = 3, 64, 4, 2, 1e-3, 50
pretrain_epochs, epochs, pretrain_warmup_steps, warmup_steps, mask_ratio = 50, 200, 2500, 2000, 0.50
