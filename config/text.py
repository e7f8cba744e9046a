# --task=text (IMDb, bytes): their imdb(-mlm).yaml: 6 layers, width 512, 8 heads, MLP x4, weight decay
# 0.1, 32 SPT / 65 finetuning epochs, warmup 5000 (SPT) / 2000. lr and mask ratio: not checkable.
pixel_encoder = "token"
depth, n_embd, n_head, ffn_mult, lr, batch_size, weight_decay = 6, 512, 8, 4, 1e-4, 32, 0.1
pretrain_epochs, epochs, pretrain_warmup_steps, warmup_steps, mask_ratio = 32, 65, 5000, 2000, 0.15
