# --pretrain_task=photos: ours, crops of a photograph (data_lra.load_photos); SPT data for an image
# task, never a task to finetune on (it has no labels).
depth, n_embd, n_head, ffn_mult, lr, batch_size = 1, 64, 4, 1, 1e-3, 32
pretrain_epochs, epochs, warmup_steps, pretrain_warmup_steps = 10, 1, 0, 0
