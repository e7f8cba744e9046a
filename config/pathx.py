# --task=pathx: their pathx-small.yaml: 4 layers, 4 heads, max pooling, batch 32, warmup 5000.
# The SPT epochs are PathFinder's (their PathX SPT config was not read).
depth, n_head, pool, pretrain_warmup_steps = 4, 4, "max", 5000
