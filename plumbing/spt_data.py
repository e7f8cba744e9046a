"""
train_spt.py's one interface over its two data files: synthetic.py (the length-100 task,
made in memory) and data_lra.py (the LRA tasks, generated or read from the release).

  load_splits   the task's train/val/test and the pretraining task's train/val, checked
  load_data     one split of one task, cut to --n_train / --n_eval
"""

import torch

import synthetic
from plumbing.spt_settings import check_data


def load_data(task, split, cfg):
    """One split of `task` as a Dataset (tokens, pad_mask, label; vocab_size, collate, ...),
    with the data flags of cfg; the first --n_train (train) or --n_eval examples."""
    if task == "synthetic":
        ds = synthetic.load_split(split, seed=cfg["seed"])
    else:
        import data_lra   # imported here so the synthetic task needs nothing else
        options = {}
        if task in ("listops", "pathfinder", "pathx"):
            options["data_source"] = cfg["data_source"]
        if task in ("listops", "pathfinder", "pathx", "photos") and cfg["n_generate"]:
            options["n"] = cfg["n_generate"]
        if task in ("pathfinder", "pathx"):
            options["difficulty"] = cfg["difficulty"]
        if task in ("listops", "text", "retrieval") and cfg["max_len"]:
            options["max_len"] = cfg["max_len"]
        ds = data_lra.load_task(task, split, cfg["data_dir"], **options)
    n = cfg["n_train"] if split == "train" else cfg["n_eval"]
    return Subset(ds, n) if 0 < n < len(ds) else ds


class Subset(torch.utils.data.Dataset):
    """The first n examples of a dataset, keeping its attributes (vocab_size, collate, ...)."""

    def __init__(self, ds, n):
        self.ds, self.n = ds, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.ds[i]

    def __getattr__(self, name):
        return getattr(self.ds, name)


def load_splits(run):
    """{train, val, test, pretrain, pretrain_val}: the task's splits and the pretraining
    task's (the same objects when it is the task itself), checked (check_data), and
    their fingerprint recorded so that a resumed run refuses other data."""
    cfg = run.cfg
    data = {s: load_data(cfg["task"], s, cfg) for s in ("train", "val", "test")}
    pre_task = cfg["pretrain_task"] or cfg["task"]
    same = pre_task == cfg["task"]
    data["pretrain"] = data["train"] if same else load_data(pre_task, "train", cfg)
    data["pretrain_val"] = data["val"] if same else load_data(pre_task, "val", cfg)
    check_data(cfg, run.rt, data)
    run.fingerprint(data["train"], data["pretrain"])              # a resumed run: the same data
    return data
