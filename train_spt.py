"""
Self-pretraining (SPT) then finetuning, with every ablation of "Towards
Understanding Self-Pretraining for Sequence Classification" (Coser et al. 2026).

    python train_spt.py --task=synthetic                          # SPT, then finetune (minutes on a CPU)
    python train_spt.py --task=synthetic --pretrain_epochs=0      # from scratch
    python train_spt.py --task=synthetic --pretrain_epochs=0 --freeze=attn   # keep random attention
    python train_spt.py --task=synthetic --init_params=qk --init_from=out/x/spt_best.pt
    python train_spt.py --task=pathfinder --depth=1               # LRA, Amos et al.'s one-GPU settings
    python train_spt.py --task=image --pretrain_task=pathfinder   # data-source swap
    python train_spt.py --report=out                              # table of all runs under out/
    torchrun --standalone --nproc_per_node=2 train_spt.py --task=synthetic

Phase 1 (SPT): masked-token reconstruction on the task's own training split
(Amos et al. 2024): hide a random mask_ratio of the real tokens, predict them,
loss only at the hidden positions. Phase 2: classification, starting from the
best-validation SPT weights (all of them, or only the group --init_params).
Every run writes config.json, log.jsonl, summary.json, checkpoints and PNG
plots into out_dir, with the proximity statistics of the attention: the mass
within |i-j| <= w, and how Toeplitz (a function of i - j only) the position-only
score matrix (PE W_Q)(PE W_K)^T is.

Read top to bottom: the flags (DEFAULTS, TASKS: Amos et al.'s configs, PRESETS),
the data, the two objectives (MaskedReconstruction is SPT), hybrid initialisation
and freezing, train_phase (one phase: the loop, then its helpers), attention
analysis, main. Every key of DEFAULTS is a --key=value flag; --help lists them.

What a run folder promises (training.RunFolder): a run refuses an out_dir that
holds another run (--overwrite=True replaces it) or anything else, and writes
nothing there until its flags, data and model have been checked.
--init_from=resume continues the run in --out_dir, wherever that folder now is,
exactly (same batches, masks and losses); flags in RESUME_SAFE may change on
resume, any other that differs is refused. A NaN or inf loss or gradient stops
the run; checkpoints only ever hold finite weights. Errors are one line;
--debug=True shows the traceback.
"""

import hashlib
import math
import os
import shlex
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

import analysis
import cost
import synthetic
from configurator import (check_memory, check_ranges, configure, flag_value, given_keys, parse_int_list, resume_config,
                          run_cli)
from model import PARAM_GROUPS, Transformer, TransformerConfig, select_params
from training import (RunFolder, RunLog, append_text, close_ddp, data_fingerprint, grad_sync, interrupted,
                      last_good_checkpoint, load_checkpoint, load_state, lr_at, record_fingerprint, save_checkpoint,
                      setup_runtime, to_json, weights_finite)

# -----------------------------------------------------------------------------
# Defaults. Task-specific ones come from TASKS (Amos et al.'s configs).

DEFAULTS = dict(
    task="pathfinder",       # synthetic, listops, text, retrieval, image, pathfinder, pathx
    pretrain_task="",        # "" = the task itself; else pretrain on another task's data
    data_dir="data",
    data_source="auto",      # auto | generated | release  (listops, pathfinder, pathx)
    n_generate=0,            # size of a generated dataset, all splits (0 = the release size)
    difficulty="contour_length_14",  # pathfinder/pathx: baseline, contour_length_9, contour_length_14
    max_len=0,               # text, retrieval, listops: longest sequence (0 = LRA's: 4096, 4000, 2000)
    n_train=0,               # use only the first n training examples (0 = all)
    n_eval=0,                # use only the first n val/test examples (0 = all)
    out_dir="",              # "" = out/<task>_d<depth>_<pretrain_epochs>ep[_<flags that differ>]
    overwrite=False,         # replace the results of an earlier run in out_dir
    seed=0,
    # model
    pos_enc="sinusoidal", pool="mean", dropout=0.0,
    init="torch",            # torch: PyTorch's layer defaults; gpt2: N(0, 0.02); amos: PyTorch's with
                             # W_Q = W_K = W_V = W_O at the start (Amos et al.'s code: the LRA tasks')
    pixel_encoder="token",   # token: one embedding per grey level; linear: Amos et al.'s grey value in
                             # [-1, 1] and a mask flag through nn.Linear(2, d) (image, pathfinder, pathx)
    # self-pretraining
    spt_objective="masked",  # masked | causal (next-token)
    save_epochs="1,10,50,100,200",   # also keep the SPT weights after these epochs
    # finetuning and the ablations
    init_from="",            # "" = this run's best SPT checkpoint | resume | a checkpoint path
    init_params="all",       # which groups to take from the SPT checkpoint (qk, qkv, attn, mlp, emb, all)
    freeze="none",           # keep these groups fixed while finetuning (attn, qk, ...): at their
                             # random init from scratch, at the SPT values after SPT
    patience=0,              # early stopping: epochs without a better val accuracy (0 = off, as Amos et al.)
    max_hours=24.0,          # wall-time cap of each phase (Amos et al.: 24 h on one GPU)
    # optimisation (AdamW)
    weight_decay=0.0, schedule="constant", grad_clip=0.0, grad_accum=1,
    warmup_steps=0,          # linear warmup of the finetuning phase, in optimizer steps...
    pretrain_warmup_steps=0, # ... and of the SPT phase
    warmup_frac=0.0,         # or: warmup over this fraction of each phase (used when the steps are 0)
    pretrain_lr=0.0,         # 0 = same as lr
    pretrain_schedule="",    # "" = same as schedule
    preset="",               # "", cpu or cpu_rescue: a named set of overrides, applied before the flags (PRESETS)
    # logging and analysis
    log_every=10, ckpt_every=0,   # steps (ckpt_every 0 = end of each epoch only)
    snapshot_attn_every=0,   # steps; save layer-0 attention maps to plot their evolution
    halt_after_steps=0,      # stop as if killed after this many steps (to test resume)
    report="",               # comma list of folders: gather their summary.json into a table (written into
                             # the first folder, or --out_dir, or out/spt_report when the first is a run)
    # system
    device="auto", dtype="auto",   # auto: bf16 on a GPU that has it, else float32; fast: bf16 where native
    compile=False, num_workers=0, debug=False,
)

# Amos et al.'s configs (IdoAmos/not-from-scratch, configs/experiment/lra/transformer-lra-
# <task>[-mlm].yaml: "-mlm" is their SPT phase). Where a value is not in those files it says so.
# Every LRA task: init="amos", their attention (mhfa: src/models/sequence/mha.py, MultiheadAttention-
# Flash, whose clones(nn.Linear(d, d), 4) starts W_Q = W_K = W_V = W_O). Pixel tasks: their
# `encoder: linear` (configs/pipeline/{cifar,pathfinder}[-lm].yaml). SPT learning rate: their -mlm
# files have the finetuning one (PathFinder 5e-4 / 5e-4, Image 1e-3 / 1e-3), so pretrain_lr stays
# 0 (= lr); the per-task SPT rates said to be in their paper's hyper-parameter table (PathFinder
# 1e-3, ListOps 1e-3) are unverified here and not adopted.
TASKS = {   # depth = n_layer
    "synthetic": dict(   # ours (the task is ours): the CPU recipe of REPORT.md's synthetic tables
        depth=1, n_embd=64, n_head=4, ffn_mult=2, lr=1e-3, batch_size=64, pretrain_epochs=10, epochs=20,
        mask_ratio=0.15, schedule="cosine", warmup_frac=0.05, grad_clip=1.0, patience=20),
    "listops": dict(     # listops(-mlm).yaml: 6/512/8 heads, ffn x4, batch 32, 100/100 epochs, warmup 2000
        depth=6, n_embd=512, n_head=8, ffn_mult=4, batch_size=32, pretrain_epochs=100, epochs=100,
        warmup_steps=2000, pretrain_warmup_steps=2000, init="amos",
        lr=1e-4,         # not checkable: the yaml says 0.05, surely overridden on their command line
        mask_ratio=0.10),   # set on their command line, not checkable in the yaml
    "text": dict(        # imdb(-mlm).yaml: weight decay 0.1, 32/65 epochs, warmup 5000 (SPT) / 2000
        depth=6, n_embd=512, n_head=8, ffn_mult=4, batch_size=32, pretrain_epochs=32, epochs=65,
        weight_decay=0.1, warmup_steps=2000, pretrain_warmup_steps=5000, init="amos",
        lr=1e-4, mask_ratio=0.15),   # not checkable, as for listops
    "retrieval": dict(   # aan(-mlm).yaml: 4/128/4 heads, ffn x4, 32/32 epochs, warmup 2000 (SPT) / 5000
        depth=4, n_embd=128, n_head=4, ffn_mult=4, batch_size=32, pretrain_epochs=32, epochs=32,
        warmup_steps=5000, pretrain_warmup_steps=2000, init="amos",
        lr=1e-4, mask_ratio=0.15),   # not checkable, as for listops
    "image": dict(       # cifar(-mlm).yaml: 3/64/4 heads, ffn x2, lr 1e-3, 50/200 epochs, warmup 2500 / 2000,
        depth=3, n_embd=64, n_head=4, ffn_mult=2, lr=1e-3, batch_size=50,   # finetuning batch 50 (SPT: 32)
        pretrain_epochs=50, epochs=200, warmup_steps=2000, pretrain_warmup_steps=2500, mask_ratio=0.50,
        init="amos", pixel_encoder="linear"),
    "pathfinder": dict(  # pathfinder(-mlm).yaml: 4/128/8 heads, ffn x1, lr 5e-4, batch 32, 50/200 epochs
        depth=4, n_embd=128, n_head=8, ffn_mult=1, lr=5e-4, batch_size=32, pretrain_epochs=50, epochs=200,
        warmup_steps=5000, pretrain_warmup_steps=2500, mask_ratio=0.50, init="amos", pixel_encoder="linear"),
    "pathx": dict(       # pathx-small.yaml: 4 heads, max pooling, batch 32, 200 epochs, warmup 5000
        depth=4, n_embd=128, n_head=4, ffn_mult=1, lr=5e-4, batch_size=32, pool="max", epochs=200,
        warmup_steps=5000, pretrain_warmup_steps=5000, mask_ratio=0.50, init="amos", pixel_encoder="linear",
        pretrain_epochs=50),   # not checked: their PathX SPT config was not read; PathFinder's value
}

# Named sets of overrides (--preset=...), applied after the task's defaults and before
# the command line: "*" for every task, then the task's own. Ours, not Amos et al.'s:
# see REPORT.md's departures table and its CPU-scale LRA setting.
PRESETS = {
    "": {},
    "cpu": {
        # Runs of a few epochs: a warmup of 5% of the phase and a cosine decay instead of
        # thousands of warmup steps at a constant rate; clipping and early stopping. dtype
        # fast: bf16 autocast where the CPU computes bf16 (0.87-0.88 of the float32 step at
        # depth 1 and 4 on such a CPU), float32 where it would be emulated (an AVX2-only CPU:
        # 5x slower in bf16). Every core by default when a run is alone.
        "*": dict(schedule="cosine", warmup_steps=0, pretrain_warmup_steps=0, warmup_frac=0.05,
                  grad_clip=1.0, patience=20, dtype="fast"),
        # About 56 min on one core of our 2-core box at depth 1 (SPT 12 epochs + finetuning 5 on
        # 8,000 images of 1,024 pixels); SPT at a higher lr, as it must get below the pixels'
        # unigram entropy (0.79 nats) to teach anything. --depth=4 is about 4x slower.
        "pathfinder": dict(difficulty="baseline", n_generate=10_000, depth=1, n_embd=64, n_head=4,
                           lr=1e-3, pretrain_lr=3e-3, batch_size=32, pretrain_epochs=12, epochs=5,
                           save_epochs="1,2,5,10"),
        # About an hour at depth 1 (2 s a step on one core): 4,800 training expressions of
        # 500-2,000 tokens, SPT 6 + finetuning 4 epochs; 250 val and 250 test expressions (the
        # 2% splits of 12,500, cut by n_train), as 100 would leave +-4 points of sampling noise.
        "listops": dict(n_generate=12_500, n_train=4_800, depth=1, n_embd=64, n_head=4, ffn_mult=2, lr=1e-3,
                        pretrain_lr=3e-3, batch_size=32, pretrain_epochs=6, epochs=4, save_epochs="1,2,5"),
    },
    # SPT against scratch on PathFinder in hours of one core (tools/lra_rescue.py runs its
    # arms; REPORT.md, A9, says why each value): a low-data regime (4,000 training images
    # of LRA's 160,000), one layer (LRA's own PathFinder Transformer), batch 8 (a fifth of
    # batch 32's step time on a CPU), constant rates after a 5% warmup, so that a longer
    # from-scratch run starts as the shorter one. SPT 2,000 steps, finetuning 500.
    "cpu_rescue": {
        "*": dict(schedule="constant", pretrain_schedule="constant", warmup_steps=0, pretrain_warmup_steps=0,
                  warmup_frac=0.05, grad_clip=1.0, patience=0, dtype="fast"),
        "pathfinder": dict(difficulty="baseline", n_generate=10_000, n_train=4_000, depth=1, n_embd=64,
                           n_head=4, lr=1e-3, pretrain_lr=3e-3, batch_size=8, pretrain_epochs=4, epochs=1,
                           save_epochs="1,2,3,4"),
    },
}


def preset_values(preset, task):
    """The overrides --preset=<preset> makes for --task=<task>."""
    return {**PRESETS[preset].get("*", {}), **PRESETS[preset].get(task, {})}


RESUME_SAFE = ("lr", "pretrain_lr", "grad_clip", "max_hours", "patience", "log_every", "ckpt_every",
               "halt_after_steps", "device", "dtype", "compile", "num_workers", "debug")


def flag_scope(cfg):
    """Where each flag that not every run reads applies: flag -> (does it apply to this
    run?, where it applies). A flag given on the command line where it does not apply
    is refused (check_config), so no flag is ever silently ignored."""
    tasks = {cfg["task"], cfg["pretrain_task"] or cfg["task"]}
    on = lambda *names: (bool(tasks & set(names)), "--task=" + "|".join(names))
    given_weights = cfg["init_from"] not in ("", "resume")
    spt = (cfg["pretrain_epochs"] > 0 and not given_weights, "a run with an SPT phase (--pretrain_epochs > 0 "
                                                                "and no --init_from checkpoint)")
    return dict(
        max_len=on("listops", "text", "retrieval"), n_generate=on("listops", "pathfinder", "pathx"),
        data_source=on("listops", "pathfinder", "pathx"), difficulty=on("pathfinder", "pathx"),
        data_dir=(tasks != {"synthetic"}, "the LRA tasks (the synthetic task is made in memory)"),
        pretrain_task=spt, spt_objective=spt, mask_ratio=spt, pretrain_lr=spt, pretrain_schedule=spt,
        pretrain_warmup_steps=spt, save_epochs=spt,
        init_params=(spt[0] or given_weights, "finetuning from SPT weights (an SPT phase or --init_from=CHECKPOINT)"),
        pretrain_epochs=(cfg["pretrain_epochs"] == 0 or not given_weights,
                         "a run that pretrains itself; --init_from=CHECKPOINT finetunes from that checkpoint instead"))


def get_config(argv):
    """Two passes: --task picks the task's defaults, then every --key=value applies."""
    task = flag_value(argv, "task", DEFAULTS["task"])
    if task not in TASKS:
        raise ValueError(f"--task={task} is unknown; choose one of {list(TASKS)}")
    preset = flag_value(argv, "preset", DEFAULTS["preset"])
    if preset not in PRESETS:
        raise ValueError(f"--preset={preset} is unknown; choose one of {[p for p in PRESETS if p]}")
    cfg = configure({**DEFAULTS, **TASKS[task], **preset_values(preset, task)}, argv, __doc__)
    return check_config(cfg, given_keys(argv))


def check_config(cfg, given=()):
    """Refuse bad values before any work is done, naming what is allowed. `given`: the
    keys on the command line (a flag that does not apply to this run is refused)."""
    if cfg["report"] and set(given) - {"report", "out_dir", "debug"}:
        raise ValueError(f"--report gathers finished runs and takes no other flag but --out_dir (got "
                         f"{', '.join('--' + k for k in given if k not in ('report', 'out_dir', 'debug'))})")
    schedules = ("cosine", "linear", "constant")   # training.lr_at's
    choices = dict(pretrain_task=("",) + tuple(TASKS), spt_objective=("masked", "causal"),
                   data_source=("auto", "generated", "release"),
                   schedule=schedules, pretrain_schedule=("",) + schedules)
    for key, allowed in choices.items():
        if cfg[key] not in allowed:
            raise ValueError(f"--{key}={cfg[key]} is not one of {allowed}")
    groups = set(PARAM_GROUPS) | {"all"}
    for key in ("freeze", "init_params"):
        bad = [g for g in cfg[key].split(",") if g.strip() not in groups | {"none"}]
        if bad:
            raise ValueError(f"--{key}={cfg[key]}: unknown parameter group {bad[0]!r}; choose from "
                             f"{sorted(groups)}, a comma list of them, or none")
    check_ranges(cfg, positive=("depth", "n_embd", "n_head", "ffn_mult", "lr", "batch_size", "grad_accum",
                                "epochs", "log_every", "max_hours"),
                 nonnegative=("pretrain_epochs", "n_generate", "max_len", "n_train", "n_eval", "patience",
                              "weight_decay", "grad_clip", "pretrain_lr", "ckpt_every", "warmup_steps",
                              "pretrain_warmup_steps",
                              "snapshot_attn_every", "halt_after_steps", "num_workers"),
                 fractions=("dropout", "warmup_frac"))
    TransformerConfig(n_layer=cfg["depth"], n_head=cfg["n_head"], n_embd=cfg["n_embd"],   # model flags,
                      ffn_mult=cfg["ffn_mult"], pos_enc=cfg["pos_enc"], pool=cfg["pool"],   # before
                      init=cfg["init"], pixel_encoder=cfg["pixel_encoder"])            # the data
    if cfg["pixel_encoder"] == "linear" and cfg["task"] not in IMAGE_TASKS:   # (a pretraining task is
        raise ValueError(f"--pixel_encoder=linear reads grey levels: it applies only to "   # one of them too:
                         f"{', '.join(IMAGE_TASKS)}; use --pixel_encoder=token here")        # check_data)
    if not 0 < cfg["mask_ratio"] < 1:
        raise ValueError(f"--mask_ratio={cfg['mask_ratio']} must be between 0 and 1")
    parse_int_list("save_epochs", cfg["save_epochs"])
    for key, (applies, where) in flag_scope(cfg).items():
        if key in given and not applies and cfg["init_from"] != "resume":
            raise ValueError(f"--{key}={cfg[key]} does not apply to --task={cfg['task']} here: it applies only "
                             f"to {where}; leave it out")
    if "all" in cfg["freeze"].split(","):
        raise ValueError("--freeze=all leaves nothing to train; freeze a group: attn, qk, qkv, mlp, emb")
    d, depth = cfg["n_embd"], cfg["depth"]
    check_memory(depth * (4 + 2 * cfg["ffn_mult"]) * d * d, cfg["device"])    # the blocks alone: a lower bound
    if cfg["pretrain_task"] not in ("", cfg["task"]) and task_vocabulary(cfg["pretrain_task"]) != \
            task_vocabulary(cfg["task"]):
        raise ValueError(vocabulary_mismatch(cfg, task_vocabulary(cfg["pretrain_task"]), task_vocabulary(cfg["task"])))
    if cfg["n_generate"] and cfg["task"] in ("listops", "pathfinder", "pathx"):
        import data_lra
        data_lra.check_generate(cfg["task"], cfg["n_generate"])
    if cfg["init_from"] not in ("", "resume"):
        if not os.path.exists(cfg["init_from"]):
            raise FileNotFoundError(f"--init_from={cfg['init_from']}: no such checkpoint")
        given_ckpt = load_checkpoint(cfg["init_from"])
        if not weights_finite(given_ckpt["model"]):
            raise ValueError(f"--init_from={cfg['init_from']} holds NaN or inf weights (its run diverged); "
                             f"finetune from an earlier checkpoint of it")
        check_shape_of(given_ckpt, cfg)
    return cfg


def check_shape_of(ckpt, cfg, keys=("depth", "n_embd", "n_head", "ffn_mult")):
    """An --init_from checkpoint is a train_spt.py model of this run's shape (before anything is written)."""
    theirs = ckpt.get("config") if isinstance(ckpt.get("config"), dict) else {}
    if "task" not in theirs:
        raise ValueError(f"--init_from={cfg['init_from']} was not written by train_spt.py (no task in its config); "
                         f"finetune from a train_spt.py checkpoint such as RUN/spt_best.pt")
    differ = [f"--{k}={theirs.get(k)} there, {cfg[k]} here" for k in keys if theirs.get(k) != cfg[k]]
    if differ:
        raise ValueError(f"--init_from={cfg['init_from']} is a model of another shape ({'; '.join(differ)}); "
                         f"give this run the same model flags")


def default_out_dir(cfg):
    """out/<task>_d<depth>_<pretrain_epochs>ep, plus every other flag that differs
    from the task's defaults, so two different runs never share a folder."""
    base = {**DEFAULTS, **TASKS[cfg["task"]], **preset_values(cfg["preset"], cfg["task"])}
    skip = {"task", "depth", "pretrain_epochs", "out_dir", "overwrite", "device", "dtype", "compile",
            "num_workers", "debug", "log_every", "halt_after_steps"}
    extra = "".join(f"_{k}-{cfg[k]}" for k in base if k not in skip and cfg[k] != base[k])
    extra = extra.replace("/", "-").replace(",", "+")
    if len(extra) > 100:                                  # long: keep it unique, not readable
        extra = extra[:80] + "_" + hashlib.sha1(extra.encode()).hexdigest()[:10]
    return os.path.join("out", f"{cfg['task']}_d{cfg['depth']}_{cfg['pretrain_epochs']}ep{extra}")



# -----------------------------------------------------------------------------
# Data: synthetic.py or data_lra.py, one interface

def load_data(task, split, cfg):
    if task == "synthetic":
        ds = synthetic.load_split(split, seed=cfg["seed"])
    else:
        import data_lra   # imported here so the synthetic task needs nothing else
        options = {}
        if task in ("listops", "pathfinder", "pathx"):
            options["data_source"] = cfg["data_source"]
            if cfg["n_generate"]:
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


def task_vocabulary(task):
    """(vocab size, pad id, mask id) of a task, known without reading its data."""
    if task == "synthetic":
        ds = synthetic.load_split("val", n=2)                     # made in memory: instant
        return ds.vocab_size, ds.pad_id, ds.mask_id
    import data_lra
    if task == "listops":
        return data_lra.LISTOPS_VOCAB, data_lra.LISTOPS_PAD, data_lra.LISTOPS_MASK
    return data_lra.BYTE_VOCAB, data_lra.BYTE_PAD, data_lra.BYTE_MASK


def vocabulary_mismatch(cfg, pre, task):
    return (f"--pretrain_task={cfg['pretrain_task']} has vocabulary (size, pad, mask) {pre} but "
            f"--task={cfg['task']} has {task}: its token ids would mean other tokens here. Pretrain on a task "
            f"with the same vocabulary (image, pathfinder and pathx share one), or copy only weights that do "
            f"not read tokens from its checkpoint: --init_from=RUN/spt_best.pt --init_params=attn")


def check_data(cfg, rt, splits):
    """Every split holds examples, the training sets at least one global batch, and a
    pretraining task speaks the task's vocabulary (else its ids would alias silently)."""
    vocab = lambda ds: (ds.vocab_size, ds.pad_id, ds.mask_id)
    if vocab(splits["pretrain"]) != vocab(splits["train"]):
        raise ValueError(vocabulary_mismatch(cfg, vocab(splits["pretrain"]), vocab(splits["train"])))
    G = cfg["batch_size"] * cfg["grad_accum"] * rt.world_size
    for name, ds in splits.items():
        if len(ds) == 0:
            raise ValueError(f"the {name} split of --task={cfg['task']} is empty (data under "
                             f"{cfg['data_dir']}); check the files or --n_train/--n_eval")
        if name in ("train", "pretrain") and len(ds) < G:
            raise ValueError(f"the {name} split has {len(ds)} examples, fewer than one global batch "
                             f"of {G}; lower --batch_size or --grad_accum")


# Seeds. Each random stream has its own seed derived from --seed, so changing one
# thing (the number of epochs, the mask ratio) never shifts another stream.
BATCH_SEED_STRIDE = 100_003   # a prime above 2 x any epoch count: (seed, epoch, phase) never collide
MASK_SEED_OFFSET = 7          # the SPT masks' stream: apart from the model init, which uses --seed itself
VAL_MASK_SEED = 1234          # validation masks: the same every epoch and every seed, so SPT val losses compare


def batch_order_seed(seed, epoch, spt):
    """The seed of one epoch's batch order in one phase: a function of (seed, epoch, phase) only."""
    return seed * BATCH_SEED_STRIDE + 2 * epoch + int(spt)


def epoch_batches(n, cfg, rt, seed):
    """This rank's micro-batches (lists of indices) for one epoch. The order depends
    only on `seed`, so a resumed run sees the same batches. Optimizer step s uses
    global batch perm[s*G:(s+1)*G], G = batch_size * grad_accum * world_size, split
    into equal micro-batches across ranks and accumulation steps: a run on W processes
    equals a single process with W times the batch size (exactly for classification;
    for SPT each micro-batch averages over its own hidden positions, as BERT does)."""
    G = cfg["batch_size"] * cfg["grad_accum"] * rt.world_size
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    batches = []
    for s in range(n // G):
        chunk = perm[s * G:(s + 1) * G]
        for k in range(cfg["grad_accum"]):
            start = (k * rt.world_size + rt.rank) * cfg["batch_size"]
            batches.append(chunk[start:start + cfg["batch_size"]])
    return batches


def loader(ds, batches, cfg, rt):
    return torch.utils.data.DataLoader(ds, batch_sampler=batches, collate_fn=ds.collate,
                                       num_workers=cfg["num_workers"], pin_memory=rt.device_type == "cuda")


def to_device(batch, rt):
    tokens, pad_mask, labels = batch
    move = lambda t: None if t is None else t.to(rt.device, non_blocking=True)
    return move(tokens), move(pad_mask), move(labels)


# -----------------------------------------------------------------------------
# The two objectives, as modules so that DDP and torch.compile see one forward

class MaskedReconstruction(nn.Module):
    """SPT objective (Amos et al. 2024): x~ = x with a random set M of real positions
    replaced by [MASK];  L = -(1/|M|) sum_{i in M} log p(x_i | x~)  (loss only on M).
    Retrieval pairs (B, 2, T) are two sequences each. causal=True: next-token loss
    -(1/T) sum_t log p(x_{t+1} | x_<=t) instead."""

    def __init__(self, model, mask_id, causal=False):
        super().__init__()
        self.model, self.mask_id, self.causal = model, mask_id, causal

    def forward(self, tokens, pad_mask, hide):
        if tokens.dim() == 3:                                       # two documents each
            tokens, hide = tokens.flatten(0, 1), hide.flatten(0, 1)
            pad_mask = None if pad_mask is None else pad_mask.flatten(0, 1)
        if self.causal:
            logits = self.model.reconstruct(tokens, pad_mask, causal=True)[:, :-1]
            targets = tokens[:, 1:]
            if pad_mask is not None:
                targets = targets.masked_fill(pad_mask[:, 1:], -100)
        else:
            logits = self.model.reconstruct(tokens.masked_fill(hide, self.mask_id), pad_mask)
            targets = tokens.masked_fill(~hide, -100)               # read only the hidden ones
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100)


class Classification(nn.Module):
    """Supervised objective: cross-entropy of the pooled classifier's logits."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, tokens, pad_mask, labels):
        logits = self.model.classify(tokens, pad_mask)
        return F.cross_entropy(logits.float(), labels), logits


def mask_generator(cfg):
    """The SPT masks' random stream: a function of --seed alone (the data never is)."""
    return torch.Generator().manual_seed(cfg["seed"] + MASK_SEED_OFFSET)


def draw_hidden(shape, ratio, generator):
    """i.i.d. Bernoulli(ratio) candidate positions to hide."""
    return torch.rand(shape, generator=generator) < ratio


def only_real(hide, pad_mask):
    """Never hide padding; hide at least one position per batch."""
    if pad_mask is not None:
        hide = hide & ~pad_mask.cpu()
    if not hide.any():
        hide.view(-1)[0] = True
    return hide


class MaskStream:
    """The positions SPT hides at each optimizer step, drawn for the whole global batch
    at once, so they do not depend on how it is split over ranks and micro-batches."""

    def __init__(self, cfg, rt, max_len):
        self.cfg, self.rt, self.max_len, self.gen = cfg, rt, max_len, mask_generator(cfg)
        self.global_batch = cfg["batch_size"] * cfg["grad_accum"] * rt.world_size

    def hide(self, micro, tokens, pad_mask):
        """This micro-batch's slice of the step's mask (drawn at its first micro-batch)."""
        k = micro % self.cfg["grad_accum"]
        if k == 0:
            self.step_hide = draw_hidden((self.global_batch, *tokens.shape[1:-1], self.max_len),
                                         self.cfg["mask_ratio"], self.gen)
        start = (k * self.rt.world_size + self.rt.rank) * self.cfg["batch_size"]
        hide = self.step_hide[start:start + len(tokens), ..., :tokens.size(-1)]
        return only_real(hide, pad_mask).to(self.rt.device)


# -----------------------------------------------------------------------------
# Building the model, hybrid initialisation and freezing

def build_model(cfg, datasets):
    """One model for every dataset it will see (the pretraining task may differ)."""
    ds = datasets[0]
    pair = ds[0][0].dim() == 2
    conf = TransformerConfig(
        vocab_size=max(d.vocab_size for d in datasets), n_classes=ds.n_classes,
        max_len=max(d.max_len for d in datasets), n_layer=cfg["depth"], n_head=cfg["n_head"],
        n_embd=cfg["n_embd"], ffn_mult=cfg["ffn_mult"], dropout=cfg["dropout"],
        pos_enc=cfg["pos_enc"], pool=cfg["pool"], pair=pair, init=cfg["init"],
        pixel_encoder=cfg["pixel_encoder"], mask_id=ds.mask_id)
    torch.manual_seed(cfg["seed"])
    return Transformer(conf)


def hybrid_init(model, ckpt_path, which):
    """Copy only the parameter group `which` from an SPT checkpoint; the rest stay
    at their random init (claim 5). Returns the names copied."""
    state = load_checkpoint(ckpt_path)["model"]
    names = select_params(model, which)
    missing = [k for k in names if k not in state]
    if missing:
        raise ValueError(f"{ckpt_path} lacks {missing}; was it saved by a model of this shape?")
    mixed = {k: state[k] if k in names else v for k, v in model.state_dict().items()}
    load_state(model, mixed)
    return names


def freeze(model, which):
    """requires_grad=False for a group: it stays bit-identical at its starting value.
    From scratch, that is the random init (claim 4)."""
    if which == "none":
        return []
    names = select_params(model, which)
    for name, p in model.named_parameters():
        if name in names:
            p.requires_grad_(False)
    return names


# -----------------------------------------------------------------------------
# One training phase (SPT or finetuning): the loop, then the helpers it calls

def train_phase(phase, model, train_ds, val_ds, cfg, rt, log, clock, resume=None):
    """Train `model` in place. phase='spt': masked reconstruction, best = lowest val
    loss. phase='finetune': classification, best = highest val accuracy. Returns the
    path of the best checkpoint and the phase's state (best score, steps, ...)."""
    spt = phase == "spt"
    hp = phase_settings(phase, cfg, len(train_ds), rt)
    objective, train_obj, optimizer, params = make_objective(phase, model, train_ds.mask_id, cfg, rt)
    masks = MaskStream(cfg, rt, train_ds.max_len)
    state = dict(epoch=0, step_in_epoch=0, step=0, best=None, best_epoch=-1, bad_epochs=0)
    rng = None                                            # the torch RNG to rewind to, where the loop resumes
    if resume is not None and resume["phase"] == phase:
        optimizer.load_state_dict(resume["optimizer"])
        state.update({k: resume[k] for k in state if k in resume})
        masks.gen.set_state(resume["mask_gen"])
        rng = resume["torch_rng"]
    guard = NonFiniteGuard(rt, phase, os.path.join(cfg["out_dir"], "ckpt.pt"))
    save = lambda: save_resume_point(phase, model, optimizer, masks, cfg, rt, state, guard, clock)
    announce(phase, hp, len(train_ds), len(val_ds), params, rt)
    t0 = time.time()
    while state["epoch"] < hp["epochs"]:
        seed = batch_order_seed(cfg["seed"], state["epoch"], spt)
        batches = epoch_batches(len(train_ds), cfg, rt, seed)[state["step_in_epoch"] * cfg["grad_accum"]:]
        bar = tqdm(total=hp["steps_per_epoch"], initial=state["step_in_epoch"], disable=not rt.master,
                   desc=f"{phase} epoch {state['epoch'] + 1}/{hp['epochs']}", leave=False)
        epoch_data, rng = resumed_iterator(loader(train_ds, batches, cfg, rt), rng, state["step_in_epoch"])
        for micro, batch in enumerate(epoch_data):
            tokens, pad_mask, labels = to_device(batch, rt)
            last_micro = (micro + 1) % cfg["grad_accum"] == 0
            with grad_sync(train_obj, rt, last_micro), rt.autocast():
                if spt:                                                  # hide, then reconstruct
                    loss = train_obj(tokens, pad_mask, masks.hide(micro, tokens, pad_mask))
                else:                                                    # classify
                    loss, _ = train_obj(tokens, pad_mask, labels)
            (loss / cfg["grad_accum"]).backward()
            if not last_micro:
                continue
            for group in optimizer.param_groups:                         # warmup, then decay
                group["lr"] = lr_at(state["step"], hp["total_steps"], hp["lr"], hp["warmup"], hp["schedule"])
            gnorm = torch.nn.utils.clip_grad_norm_(params, cfg["grad_clip"] or float("inf"))
            guard.record(loss, gnorm, state["step"] + 1)                 # on a CPU: stops before the update
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            state["step"] += 1
            state["step_in_epoch"] += 1
            bar.update(1)
            after_step(phase, state, loss, gnorm, optimizer, model, val_ds, cfg, rt, log, guard, bar, t0, hp)
            if cfg["ckpt_every"] and state["step"] % cfg["ckpt_every"] == 0:
                save()
            clock.tick(bar)
        bar.close()
        stop = end_of_epoch(phase, objective, model, val_ds, cfg, rt, log, state, guard, t0)
        save()
        if stop:
            break
    for p in (model.head if spt else model.lm_head).parameters():       # the other phase's head
        p.requires_grad_(True)
    return os.path.join(cfg["out_dir"], f"{phase}_best.pt"), state


def resumed_iterator(data_loader, rng, step_in_epoch):
    """The epoch's batch iterator, with the torch RNG (dropout's) rewound to the
    checkpoint's state `rng` (if any) where the uninterrupted run stood: a DataLoader
    iterator draws its seed from that RNG when it is made, so a checkpoint saved
    mid-epoch holds the state after that draw (rewound after making the iterator), one
    saved at an epoch's end the state before it (rewound before). Returns (iterator, None)."""
    if rng is not None and step_in_epoch == 0:
        torch.set_rng_state(rng)
    batches = iter(data_loader)
    if rng is not None and step_in_epoch > 0:
        torch.set_rng_state(rng)
    return batches, None


def phase_settings(phase, cfg, n_train, rt):
    """The phase's epochs, lr, schedule, warmup and step counts."""
    spt = phase == "spt"
    epochs = cfg["pretrain_epochs"] if spt else cfg["epochs"]
    steps_per_epoch = n_train // (cfg["batch_size"] * cfg["grad_accum"] * rt.world_size)
    total = epochs * steps_per_epoch
    warmup = cfg["pretrain_warmup_steps" if spt else "warmup_steps"] or int(cfg["warmup_frac"] * total)
    return dict(epochs=epochs, steps_per_epoch=steps_per_epoch, total_steps=total, warmup=warmup,
                lr=(cfg["pretrain_lr"] or cfg["lr"]) if spt else cfg["lr"],
                schedule=(cfg["pretrain_schedule"] or cfg["schedule"]) if spt else cfg["schedule"])


def make_objective(phase, model, mask_id, cfg, rt):
    """The phase's loss module (wrapped for DDP and compile when asked), its AdamW and
    the parameters it trains. The head the phase does not use is frozen meanwhile."""
    spt = phase == "spt"
    for p in (model.head if spt else model.lm_head).parameters():
        p.requires_grad_(False)
    objective = MaskedReconstruction(model, mask_id, cfg["spt_objective"] == "causal") if spt else \
        Classification(model)
    lr = (cfg["pretrain_lr"] or cfg["lr"]) if spt else cfg["lr"]
    optimizer = model.configure_optimizers(cfg["weight_decay"], lr, device_type=rt.device_type)
    train_obj = DDP(objective, device_ids=[rt.local_rank] if rt.device_type == "cuda" else None) \
        if rt.ddp else objective
    if cfg["compile"]:
        train_obj = torch.compile(train_obj)
    return objective, train_obj, optimizer, [p for p in model.parameters() if p.requires_grad]


class NonFiniteGuard:
    """The first step whose loss or gradient was NaN or inf (0 = none), kept on the
    device. On a CPU it is read every step, before the optimizer update (free there);
    on a GPU at each log step and before anything is saved. So no checkpoint ever
    holds weights that were updated with a NaN gradient."""

    def __init__(self, rt, phase, ckpt_path):
        self.at = torch.zeros((), dtype=torch.long, device=rt.device)
        self.every_step, self.phase, self.ckpt_path = rt.device_type == "cpu", phase, ckpt_path

    def record(self, loss, gnorm, step):
        finite = torch.isfinite(loss.detach()) & torch.isfinite(gnorm)
        self.at = torch.where((self.at == 0) & ~finite, step, self.at)
        if self.every_step:
            self.check()

    def mark(self, step):
        self.at.fill_(step)

    def check(self):
        step = int(self.at.item())
        if step:
            raise FloatingPointError(
                f"[{self.phase}] the loss or gradient became NaN or inf at step {step}; stopping, nothing from "
                f"that step on was saved, and {last_good_checkpoint(self.ckpt_path)}. Its weights are finite "
                f"but may already be on the way to diverging, so resuming from it with --init_from=resume "
                f"--lr=... (lower) can diverge again; if it does, start again with --overwrite=True and a lower "
                f"--lr (or set --grad_clip if it is 0)")


class RunClock:
    """The run's wall time across resumes (what the checkpoint had, plus this call's),
    and the optimizer steps this call has taken, both phases counted: after
    --halt_after_steps of them (0 = never) it stops as if killed, to test resume."""

    def __init__(self, halt_after, wall_before=0.0):
        self.halt_after, self.steps, self.start, self.before = halt_after, 0, time.time(), wall_before

    def elapsed(self):
        return self.before + time.time() - self.start

    def tick(self, bar):
        self.steps += 1
        if self.halt_after and self.steps >= self.halt_after:
            bar.close()
            raise SystemExit(f"halted after {self.steps} steps (--halt_after_steps)")


def announce(phase, hp, n_train, n_val, params, rt):
    if rt.master:
        print(f"[{phase}] {n_train} train / {n_val} val examples, {hp['epochs']} epochs x "
              f"{hp['steps_per_epoch']} steps, lr {hp['lr']:g}, {sum(p.numel() for p in params):,} trainable "
              f"parameters", flush=True)


def after_step(phase, state, loss, gnorm, optimizer, model, val_ds, cfg, rt, log, guard, bar, t0, hp):
    """Log every log_every steps (and the first), print the phase's ETA after 20 steps,
    snapshot the attention every snapshot_attn_every steps."""
    step = state["step"]
    if step % cfg["log_every"] == 0 or step == 1:
        guard.check()
        log.log(phase=phase, step=step, epoch=state["epoch"], loss=loss.item(),
                lr=optimizer.param_groups[0]["lr"], grad_norm=gnorm.item())
        bar.set_postfix(loss=f"{loss.item():.4f}")
    if rt.master and step == 20:
        eta = (time.time() - t0) / 20 * (hp["total_steps"] - 20)
        print(f"[{phase}] ~{eta / 60:.1f} min for this phase at the current speed", flush=True)
    if cfg["snapshot_attn_every"] and step % cfg["snapshot_attn_every"] == 0:
        snapshot_attention(model, val_ds, rt, cfg, phase, step)


def end_of_epoch(phase, objective, model, val_ds, cfg, rt, log, state, guard, t0):
    """Evaluate; keep the best weights (SPT: lowest val loss; finetuning: highest val
    accuracy) and the SPT weights after the epochs in --save_epochs. Returns True to
    stop: early stopping (finetuning) or the phase's wall-time cap."""
    spt, epoch = phase == "spt", state["epoch"] + 1
    guard.check()
    metrics = evaluate(objective, val_ds, cfg, rt, phase)
    if not math.isfinite(metrics["loss"]):
        guard.mark(state["step"])
        guard.check()                                                # a NaN val loss is never "best"
    score = -metrics["loss"] if spt else metrics["acc"]
    improved = state["best"] is None or score > state["best"]
    state.update(epoch=epoch, step_in_epoch=0, bad_epochs=0 if improved else state["bad_epochs"] + 1)
    log.log(phase=phase, step=state["step"], epoch=epoch, val_loss=metrics["loss"], val_acc=metrics["acc"])
    weights = dict(model=unwrap(model).state_dict(), config=cfg, epoch=epoch)
    if improved:
        state.update(best=score, best_epoch=epoch)
        if rt.master:
            save_checkpoint(os.path.join(cfg["out_dir"], f"{phase}_best.pt"), dict(**weights, **metrics))
    if rt.master and spt and epoch in parse_int_list("save_epochs", cfg["save_epochs"]):
        save_checkpoint(os.path.join(cfg["out_dir"], f"spt_epoch{epoch}.pt"), weights)
    if rt.master:
        print(f"[{phase}] epoch {epoch}/{cfg['pretrain_epochs' if spt else 'epochs']}: val loss "
              f"{metrics['loss']:.4f}" + ("" if spt else f", val acc {metrics['acc']:.4f}")
              + (" (best)" if improved else ""), flush=True)
    stop_early = not spt and cfg["patience"] and state["bad_epochs"] >= cfg["patience"]
    return bool(stop_early) or time.time() - t0 > cfg["max_hours"] * 3600


def save_resume_point(phase, model, optimizer, masks, cfg, rt, state, guard, clock):
    """ckpt.pt: everything --init_from=resume needs to continue exactly (weights,
    optimizer, mask stream, torch RNG, config, the phase's state), after checking
    that the weights were never updated with a NaN gradient."""
    guard.check()
    if rt.master:
        save_checkpoint(os.path.join(cfg["out_dir"], "ckpt.pt"), dict(
            phase=phase, model=unwrap(model).state_dict(), optimizer=optimizer.state_dict(),
            mask_gen=masks.gen.get_state(), torch_rng=torch.get_rng_state(), config=cfg,
            wall_time=clock.elapsed(), **state))


@torch.no_grad()
def evaluate(objective, ds, cfg, rt, phase):
    """Mean loss, and accuracy for the classifier, over the whole split. SPT masks
    come from a fixed generator, so the validation loss is comparable across epochs."""
    objective.eval()
    idx = list(range(rt.rank, len(ds), rt.world_size))
    batches = [idx[i:i + cfg["batch_size"]] for i in range(0, len(idx), cfg["batch_size"])]
    gen = torch.Generator().manual_seed(VAL_MASK_SEED)
    totals = torch.zeros(3, dtype=torch.float64, device=rt.device)   # loss sum, correct, count
    for batch in tqdm(loader(ds, batches, cfg, rt), desc=f"eval {phase}", leave=False, disable=not rt.master):
        tokens, pad_mask, labels = to_device(batch, rt)
        with rt.autocast():
            if phase == "spt":
                hide = only_real(draw_hidden(tokens.shape, cfg["mask_ratio"], gen), pad_mask).to(rt.device)
                loss, correct = objective(tokens, pad_mask, hide), 0.0
            else:
                loss, logits = objective(tokens, pad_mask, labels)
                correct = (logits.argmax(-1) == labels).sum()
        totals += torch.stack([loss.double() * len(labels), torch.as_tensor(correct, device=rt.device).double(),
                               torch.tensor(float(len(labels)), device=rt.device, dtype=torch.float64)])
    if rt.ddp:
        dist.all_reduce(totals)
    objective.train()
    return {"loss": (totals[0] / totals[2]).item(), "acc": (totals[1] / totals[2]).item()}


# -----------------------------------------------------------------------------
# Attention analysis (claim 6): the statistics live in analysis.py

IMAGE_TASKS = ("image", "pathfinder", "pathx")   # their sequences are square images


@torch.no_grad()
def attention_maps(model, ds, rt, n=8):
    """Attention maps of the first n examples (explicit path), one (B, H, T, T) per layer."""
    tokens, pad_mask, _ = to_device(ds.collate([ds[i] for i in range(min(n, len(ds)))]), rt)
    if tokens.dim() == 3:                                           # retrieval: first documents
        tokens, pad_mask = tokens[:, 0], None if pad_mask is None else pad_mask[:, 0]
    model.eval()
    _, maps = model.forward_with_maps(tokens, pad_mask)
    model.train()
    if model.config.pool == "cls":                                  # drop the [CLS] row/column
        maps = [m[:, :, 1:, 1:] for m in maps]
    return [m.float().cpu() for m in maps], None if pad_mask is None else pad_mask.cpu()


def proximity_report(model, ds, rt, cfg):
    """analysis.attention_report on the first validation examples: 1-D (and for images 2-D)
    proximity mass, score spread, Toeplitz score; plus the maps and position scores."""
    maps, pad_mask = attention_maps(model, ds, rt)
    side = math.isqrt(maps[0].size(-1)) if cfg["task"] in IMAGE_TASKS else None
    stats, scores = analysis.attention_report(unwrap(model), maps, pad_mask, side)
    return stats, maps, scores


class Observations:
    """The attention at the three stages of a run (init, after SPT, finetuned): the
    statistics, the position-only scores, and the maps drawn to attention_<stage>.png."""

    STAGE_TITLES = dict(init="init", spt="after SPT", finetune="finetuned")

    def __init__(self, cfg, rt):
        self.cfg, self.rt, self.reports, self.scores, self.first_maps = cfg, rt, {}, {}, {}

    def observe(self, stage, model, ds):
        if not self.rt.master:
            return
        self.reports[stage], maps, self.scores[stage] = proximity_report(model, ds, self.rt, self.cfg)
        analysis.plot_attention(maps, os.path.join(self.cfg["out_dir"], f"attention_{stage}.png"),
                                f"attention maps: {stage}")
        self.first_maps[self.STAGE_TITLES[stage]] = maps[0][0]


def snapshot_attention(model, ds, rt, cfg, phase, step):
    """Append the head-averaged layer-0 map of one example (downsampled to <= 128
    positions) and the proximity mass to out_dir/snapshots.jsonl."""
    if not rt.master:
        return
    maps, pad_mask = attention_maps(model, ds, rt, n=4)
    mass = analysis.proximity_mass(maps, pad_mask)
    m = maps[0][0].mean(0)                                           # (T, T) example 0
    factor = max(1, math.ceil(m.size(0) / 128))
    m = F.avg_pool2d(m[None, None], factor)[0, 0] if factor > 1 else m
    append_text(os.path.join(cfg["out_dir"], "snapshots.jsonl"), to_json(dict(
        phase=phase, step=step, mass=mass["layers"][0], widths=mass["widths"], uniform=mass["uniform"],
        map=np.round(m.numpy(), 4).tolist())) + "\n")


# -----------------------------------------------------------------------------
# The run: SPT, then finetuning, then the test accuracy and the figures

PHASES = ("spt", "finetune")
# The files a run writes besides training.RESULT_FILES (a folder written before run folders
# had a manifest is taken over on resume only if it holds nothing else).
RUN_FILES = ("spt_best.pt", "finetune_best.pt", "spt_epoch*.pt", "snapshots.jsonl", "curves.png",
             "attention_*.png", "proximity.png")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    cfg = get_config(argv)
    if cfg["report"]:
        return analysis.report(cfg["report"], cfg["out_dir"])
    cfg["out_dir"] = cfg["out_dir"] or default_out_dir(cfg)
    resume = cfg["init_from"] == "resume"
    master = int(os.environ.get("RANK", 0)) == 0
    with RunFolder(cfg["out_dir"], "train_spt.py", RUN_FILES, cfg["overwrite"], resume, master) as folder:
        ckpt = None
        if resume:                                  # the folder given, the checkpoint's config
            ckpt = load_checkpoint(os.path.join(cfg["out_dir"], "ckpt.pt"))
            if "task" not in ckpt["config"]:
                raise ValueError(f"{cfg['out_dir']}/ckpt.pt was not written by train_spt.py (train_flt.py's?); "
                                 f"resume it with the script that wrote it")
            cfg, changed = resume_config(ckpt["config"], cfg, given_keys(argv), RESUME_SAFE,
                                         per_call=("halt_after_steps", "debug"))
            if changed:
                print(f"resuming with changed flags (checkpoint's -> now): {changed}")
        rt = setup_runtime(cfg["device"], cfg["dtype"], cfg["seed"])
        cost.announce(cfg, rt)                                        # a long run says so first
        data = load_splits(cfg, rt)
        model = build_model(cfg, [data["train"], data["pretrain"]]).to(rt.device)
        folder.begin()                                                # every check passed: write
        log = RunLog(cfg["out_dir"], cfg, rt.master, keep=ckpt and written_before(ckpt),
                     command=shlex.join(["python", "train_spt.py", *argv]), also=("snapshots.jsonl",))
        if ckpt:
            log.log(phase=ckpt["phase"], step=ckpt["step"], event="resume", changed=cfg["resumes"][-1])
        try:
            summary = run_phases(cfg, rt, data, model, log, ckpt)
        except KeyboardInterrupt:
            raise interrupted(os.path.join(cfg["out_dir"], "ckpt.pt")) from None
        close_ddp(rt)
        return summary


def written_before(ckpt):
    """The records (log.jsonl, snapshots.jsonl) an interrupted run wrote up to its
    checkpoint, to keep on resume. A validation record at the checkpoint's step is kept
    only if the checkpoint was saved after it (its epoch count includes that epoch):
    otherwise the resumed run validates that epoch again."""
    at = (PHASES.index(ckpt["phase"]), ckpt["step"])

    def keep(r):
        here = (PHASES.index(r["phase"]), r["step"])
        if here == at and "val_loss" in r:
            return r["epoch"] <= ckpt.get("epoch", r["epoch"])
        return here <= at
    return keep


def load_splits(cfg, rt):
    """The task's train/val/test splits and the pretraining task's train/val, checked."""
    data = {s: load_data(cfg["task"], s, cfg) for s in ("train", "val", "test")}
    pre_task = cfg["pretrain_task"] or cfg["task"]
    same = pre_task == cfg["task"]
    data["pretrain"] = data["train"] if same else load_data(pre_task, "train", cfg)
    data["pretrain_val"] = data["val"] if same else load_data(pre_task, "val", cfg)
    check_data(cfg, rt, data)
    record_fingerprint(cfg, data_fingerprint(example_bytes(ds) for ds in (data["train"], data["pretrain"])))
    return data


def example_bytes(ds, n=256):
    """The size of a dataset and the bytes of n examples spread over it: enough to tell
    one training set from another (a resumed run compares them)."""
    def flat(x):
        if torch.is_tensor(x):
            return x.numpy().tobytes()
        return b"".join(flat(v) for v in x) if isinstance(x, (tuple, list)) else repr(x).encode()
    picks = np.unique(np.linspace(0, len(ds) - 1, min(n, len(ds))).astype(int))
    return str(len(ds)).encode() + b"".join(flat(ds[int(i)]) for i in picks)


def run_phases(cfg, rt, data, model, log, ckpt):
    """Phase 1 (SPT, unless finetuning from a given checkpoint), phase 2 (finetuning from
    a fresh model holding (part of) the SPT weights), then the test accuracy."""
    clock, seen = RunClock(cfg["halt_after_steps"], ckpt["wall_time"] if ckpt and "wall_time" in ckpt else 0.0), \
        Observations(cfg, rt)
    if rt.master:
        print(f"device {rt.device} ({rt.ptdtype}), world size {rt.world_size}; task {cfg['task']}: "
              f"{len(data['train'])}/{len(data['val'])}/{len(data['test'])} train/val/test; pretraining on "
              f"{cfg['pretrain_task'] or cfg['task']}; {model.num_params():,} parameters; out_dir {cfg['out_dir']}")
    seen.observe("init", model, data["val"])
    pretrain = cfg["pretrain_epochs"] > 0 and cfg["init_from"] in ("", "resume")
    spt_ckpt = None if pretrain else (cfg["init_from"] if cfg["init_from"] not in ("", "resume") else None)
    spt_state = None
    if pretrain and not (ckpt and ckpt["phase"] == "finetune"):
        if ckpt:
            load_state(model, ckpt["model"])
        spt_ckpt, spt_state = train_phase("spt", model, data["pretrain"], data["pretrain_val"], cfg, rt, log,
                                          clock, ckpt)
        ckpt = None
    elif pretrain:
        spt_ckpt = os.path.join(cfg["out_dir"], "spt_best.pt")
    if rt.ddp:
        dist.barrier()                                            # rank 0 has written the SPT checkpoint
    model = build_model(cfg, [data["train"], data["pretrain"]]).to(rt.device)
    copied = hybrid_init(model, spt_ckpt, cfg["init_params"]) if spt_ckpt else []
    if spt_ckpt:
        seen.observe("spt", model, data["val"])
        if rt.master:
            print(f"finetuning from {spt_ckpt}: copied {len(copied)} tensors ({cfg['init_params']})")
    frozen = freeze(model, cfg["freeze"])
    if ckpt:
        load_state(model, ckpt["model"])
    best_path, ft_state = train_phase("finetune", model, data["train"], data["val"], cfg, rt, log, clock, ckpt)
    if rt.ddp:
        dist.barrier()                                            # rank 0 has written the best checkpoint
    load_state(model, load_checkpoint(best_path, rt.device)["model"])
    test = evaluate(Classification(model), data["test"], cfg, rt, "finetune")
    seen.observe("finetune", model, data["val"])
    spt_loss = -spt_state["best"] if spt_state else spt_best_loss(cfg) if pretrain else None
    return summarize(cfg, rt, model, log, seen, data["val"], dict(
        pretrain_epochs=cfg["pretrain_epochs"] if pretrain else 0, best_val_acc=ft_state["best"],
        best_epoch=ft_state["best_epoch"], test_acc=test["acc"], spt_best_val_loss=spt_loss,
        frozen=len(frozen), copied=len(copied), steps=ft_state["step"], wall_time_s=clock.elapsed()))


def spt_best_loss(cfg):
    """The SPT phase's best val loss, from spt_best.pt (a run resumed in finetuning)."""
    return load_checkpoint(os.path.join(cfg["out_dir"], "spt_best.pt"))["loss"]


def summarize(cfg, rt, model, log, seen, val_ds, results):
    """summary.json (the run's flags, its results, the attention statistics at each
    stage) and the figures: curves, proximity, attention evolution, the 2-D maps."""
    summary = dict(task=cfg["task"], depth=cfg["depth"], pretrain_epochs=results.pop("pretrain_epochs"),
                   epochs=cfg["epochs"], pretrain_task=cfg["pretrain_task"] or cfg["task"],
                   init_from=cfg["init_from"], init_params=cfg["init_params"], freeze=cfg["freeze"],
                   pos_enc=cfg["pos_enc"], pool=cfg["pool"], init=cfg["init"], pixel_encoder=cfg["pixel_encoder"],
                   **results,
                   n_params=model.num_params(), world_size=rt.world_size)
    if rt.ddp:
        summary["replica_max_diff"] = replica_max_diff(model, rt)
    if not rt.master:
        return summary
    summary.update(stage_statistics(seen.reports), proximity=seen.reports)
    log.summary(summary)
    out = cfg["out_dir"]
    analysis.plot_curves(out)
    analysis.plot_proximity(seen.reports, seen.scores, os.path.join(out, "proximity.png"))
    analysis.plot_evolution_of_runs([out], os.path.join(out, "attention_evolution.png"))
    if cfg["task"] in IMAGE_TASKS:                                 # one image's pixels, 2-D
        analysis.plot_image_attention(val_ds[0][0], seen.first_maps, os.path.join(out, "attention_2d.png"))
    print(f"best val acc {summary['best_val_acc']:.4f} (epoch {summary['best_epoch']}), test acc "
          f"{summary['test_acc']:.4f}; attention mass within |i-j|<=2: init {summary['mass_w2_init']:.3f}, final "
          f"{summary['mass_w2_finetune']:.3f} (uniform {summary['mass_w2_uniform']:.3f}); files in {out}")
    return summary


def stage_statistics(reports):
    """Flat summary keys from the stage reports: mass within |i-j|<=2, Toeplitz score,
    near/far score gap, score spread, entropy, and for images the 3x3 mass."""
    w2, r1 = analysis.PROX_WIDTHS.index(2), analysis.PROX_RADII.index(1)
    out = {}
    for stage, r in reports.items():
        out[f"mass_w2_{stage}"] = r["mass"]["layers"][0][w2]
        out[f"toeplitz_{stage}"], out[f"near_far_{stage}"] = r.get("toeplitz"), r.get("near_far")
        out[f"score_std_{stage}"], out[f"entropy_{stage}"] = r["score_std"][0], r["entropy"][0]
        if "mass_2d" in r:
            out[f"mass2d_r1_{stage}"] = r["mass_2d"]["layers"][0][r1]
    if "mass_2d" in reports["init"]:
        out["mass2d_r1_uniform"] = reports["init"]["mass_2d"]["uniform"][r1]
    out["mass_w2_uniform"] = reports["init"]["mass"]["uniform"][w2]
    return out


def unwrap(model):
    """The bare model under DDP and torch.compile wrappers."""
    model = model.module if hasattr(model, "module") else model
    return getattr(model, "_orig_mod", model)


def replica_max_diff(model, rt):
    """DDP check: the largest difference between any rank's weights and rank 0's."""
    flat = torch.cat([p.detach().flatten().double() for p in model.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(rt.world_size)]
    dist.all_gather(gathered, flat)
    return max((g - gathered[0]).abs().max().item() for g in gathered)


if __name__ == "__main__":
    run_cli(main)
