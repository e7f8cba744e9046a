# --task=retrieval (AAN pairs, bytes): their aan(-mlm).yaml: 4 layers, width 128, 4 heads, MLP x4,
# 32 / 32 epochs, warmup 2000 (SPT) / 5000. lr and mask ratio: not checkable.
pixel_encoder = "token"
depth, n_embd, n_head, ffn_mult, lr, batch_size = 4, 128, 4, 4, 1e-4, 32
pretrain_epochs, epochs, pretrain_warmup_steps, warmup_steps, mask_ratio = 32, 32, 2000, 5000, 0.15
