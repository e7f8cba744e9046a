# --task=listops: their listops(-mlm).yaml: 6 layers, width 512, 8 heads, MLP x4, batch 32, 100 / 100
# epochs, warmup 2000. lr and mask ratio were set on their command line, not checkable (the yaml's
# lr 0.05 was surely overridden).
pixel_encoder = "token"
depth, n_embd, n_head, ffn_mult, lr, batch_size = 6, 512, 8, 4, 1e-4, 32
pretrain_epochs, epochs, pretrain_warmup_steps, warmup_steps, mask_ratio = 100, 100, 2000, 2000, 0.10
