"""
Self-pretraining (SPT) then finetuning, with every ablation of "Towards
Understanding Self-Pretraining for Sequence Classification" (Coser et al. 2026).

    python train_spt.py --task=synthetic                          # SPT, then finetune (minutes on a CPU)
    python train_spt.py --task=synthetic --pretrain_epochs=0      # from scratch
    python train_spt.py --task=synthetic --pretrain_epochs=0 --freeze=attn   # keep random attention
    python train_spt.py --task=synthetic --init_params=qk --init_from=out/x/spt_best.pt
    python train_spt.py --task=pathfinder --depth=1               # LRA, Amos et al.'s one-GPU settings
    python train_spt.py --report=out                              # table of all runs under out/
    torchrun --standalone --nproc_per_node=2 train_spt.py --task=synthetic

Phase 1 (SPT): masked-token reconstruction on the task's own training split
(Amos et al. 2024). Phase 2: classification, starting from the best-validation
SPT weights (all of them, or only the group --init_params). Every run writes
config.json, log.jsonl, summary.json, checkpoints and figures into out_dir, with
the attention's proximity statistics (analysis.py). The flags are DEFAULTS below;
Amos et al.'s per-task values and the named presets are in plumbing/spt_settings.py.

Read top to bottom: the flags, the seeds, the two objectives (MaskedReconstruction is
SPT) and the mask, hybrid initialisation and freezing, train_phase (the loop), evaluate,
main and run_phases. The data come through plumbing/spt_data.py (synthetic.py, data_lra.py);
the bookkeeping around the loop is plumbing/spt_phase.py's, the run itself training.Run's:
a folder holding another run is refused, a stop signal saves the resume point,
--init_from=resume continues exactly, a NaN stops the run.
"""

import math
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from tqdm import tqdm

import analysis
from configurator import run_cli
from model import Transformer, TransformerConfig, select_params
from plumbing import cost, spt_report
from plumbing.spt_data import load_splits
from plumbing.spt_phase import PhaseLedger, micro_row
from plumbing.spt_settings import IMAGE_TASKS, get_config, resume_config
from plumbing.training import Run, grad_sync, load_checkpoint, load_weights, wrap

# -----------------------------------------------------------------------------
# The flags that shape the experiment, each a --key=value flag. These DEFAULTS are the
# experiment of the README's main command, `python train_spt.py --task=pathfinder --depth=1`:
# Amos et al.'s PathFinder run (IdoAmos/not-from-scratch, configs/experiment/lra/
# transformer-lra-pathfinder[-mlm].yaml; "-mlm" is their SPT phase) with one layer, as the
# paper studies it. --task=NAME changes only what another task sets (spt_settings.TASKS),
# --preset=NAME applies a named set of overrides (spt_settings.PRESETS; --help lists them
# all), and the flags apply last. The run's plumbing flags (out_dir, device, dtype, logging,
# checkpoints) are spt_settings.RUN_DEFAULTS: they change no result.

DEFAULTS = dict(
    task="pathfinder",       # synthetic, listops, text, retrieval, image, pathfinder, pathx
    pretrain_task="",        # "" = the task itself; else pretrain on another task's data
    data_dir="data",
    data_source="auto",      # auto | generated | release  (listops, pathfinder, pathx)
    n_generate=0,            # size of a generated dataset, all splits (0 = the release size)
    difficulty="contour_length_14",  # pathfinder/pathx: baseline, contour_length_9, contour_length_14 (LRA's)
    max_len=0,               # text, retrieval, listops: longest sequence (0 = LRA's: 4096, 4000, 2000)
    n_train=0,               # use only the first n training examples (0 = all)
    n_eval=0,                # use only the first n val/test examples (0 = all)
    seed=0,
    # model: their PathFinder model (width 128, 8 heads, MLP x1) with one layer
    depth=1,                 # the paper's one-layer model (their PathFinder config has 4: --depth=4)
    n_embd=128, n_head=8, ffn_mult=1,
    pos_enc="sinusoidal", pool="mean", dropout=0.0,
    init="amos",             # PyTorch's layer defaults, then W_Q = W_K = W_V = W_O: their attention's
                             # clones(nn.Linear(d, d), 4) (src/models/sequence/mha.py), so attention does
                             # not start uniform; torch: PyTorch's defaults alone; gpt2: N(0, 0.02)
    pixel_encoder="linear",  # their `encoder: linear`: the grey value in [-1, 1] and a mask flag through
                             # nn.Linear(2, d); token: one embedding per grey level (the text tasks')
    # self-pretraining
    pretrain_epochs=50,      # 0 = from scratch
    spt_objective="masked",  # masked | causal (next-token)
    mask_ratio=0.50,         # the share of real pixels SPT hides (theirs for the image tasks; text: 0.15)
    save_epochs="1,10,50,100,200",   # also keep the SPT weights after these epochs
    # finetuning and the ablations
    epochs=200,              # finetuning epochs (0 = SPT alone: its checkpoints are the product)
    init_from="",            # "" = this run's best SPT checkpoint | resume | a checkpoint path
    init_params="all",       # which groups to take from the SPT checkpoint (qk, qkv, attn, mlp, emb, all)
    freeze="none",           # keep these groups fixed while finetuning (attn, qk, ...): at their
                             # random init from scratch, at the SPT values after SPT
    patience=0,              # early stopping: epochs without a better val accuracy (0 = off, as theirs)
    max_hours=24.0,          # wall-time cap of each phase (theirs: 24 h on one GPU)
    # optimisation (AdamW)
    lr=5e-4, batch_size=32,
    weight_decay=0.0, schedule="constant", grad_clip=0.0, grad_accum=1,
    warmup_steps=5000,       # linear warmup of the finetuning phase, in optimizer steps...
    pretrain_warmup_steps=2500,   # ... and of the SPT phase
    warmup_frac=0.0,         # or: warmup over this fraction of each phase (used when the steps are 0)
    pretrain_lr=0.0,         # 0 = same as lr (their -mlm file has the finetuning one)
    pretrain_schedule="",    # "" = same as schedule
    preset="",               # "", cpu or cpu_rescue: overrides applied before the flags (spt_settings.PRESETS)
)

# Seeds. Each random stream has its own seed derived from --seed, so changing one
# thing (the number of epochs, the mask ratio) never shifts another stream.
MASK_SEED_OFFSET = 7          # the SPT masks' stream: apart from the model init, which uses --seed itself
VAL_MASK_SEED = 1234          # validation masks: the same every epoch and every seed, so SPT val losses compare
# (the batch order's stream: spt_phase.batch_order_seed)


def to_device(batch, rt):
    """(tokens, pad_mask, labels) on the run's device; a missing pad_mask stays None."""
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


# -----------------------------------------------------------------------------
# Building the model, hybrid initialisation and freezing

def build_model(cfg, datasets):
    """One model for every dataset it will see (the pretraining task may differ)."""
    ds = datasets[0]
    conf = TransformerConfig(
        vocab_size=max(d.vocab_size for d in datasets), n_classes=ds.n_classes,
        max_len=max(d.max_len for d in datasets), n_layer=cfg["depth"], n_head=cfg["n_head"],
        n_embd=cfg["n_embd"], ffn_mult=cfg["ffn_mult"], dropout=cfg["dropout"],
        pos_enc=cfg["pos_enc"], pool=cfg["pool"], pair=ds[0][0].dim() == 2, init=cfg["init"],
        pixel_encoder=cfg["pixel_encoder"], mask_id=ds.mask_id)
    torch.manual_seed(cfg["seed"])
    return Transformer(conf)


def hybrid_init(model, ckpt_path, which):
    """Copy only the parameter group `which` from an SPT checkpoint; the rest stay
    at their random init (claim 5). Returns the names copied."""
    names = select_params(model, which)
    load_weights(model, ckpt_path, names)
    return names


def freeze(model, which):
    """requires_grad=False for a group: it stays bit-identical at its starting value.
    From scratch, that is the random init (claim 4)."""
    if which == "none":
        return []
    names = select_params(model, which)
    trainable([p for name, p in model.named_parameters() if name in names], False)
    return names


def trainable(params, on):
    """The one place requires_grad is switched (freeze; the head a phase does not use)."""
    for p in params:
        p.requires_grad_(on)


# -----------------------------------------------------------------------------
# One training phase (SPT or finetuning): the loop, then what it hangs on

def train_phase(name, model, train_ds, val_ds, run):
    """Train `model` in place. name='spt': masked reconstruction, best = lowest val
    loss. name='finetune': classification, best = highest val accuracy. Returns the
    phase's ledger: its best checkpoint (best_path) and state (best score, steps, ...)."""
    cfg, rt, accum, spt = run.cfg, run.rt, run.cfg["grad_accum"], name == "spt"
    p = PhaseLedger(name, run, len(train_ds))    # epochs, lr, schedule; counters, log, checkpoints
    trainable((model.head if spt else model.lm_head).parameters(), False)     # the head this phase does not use
    objective = MaskedReconstruction(model, train_ds.mask_id, cfg["spt_objective"] == "causal") if spt \
        else Classification(model)
    train_obj = wrap(objective, rt, cfg["compile"])                          # DDP, torch.compile
    optimizer = model.configure_optimizers(cfg["weight_decay"], p.lr, device_type=rt.device_type)
    mask_gen = mask_generator(cfg)
    params = p.attach(model, optimizer, mask_gen, val_ds)                    # resumed from ckpt.pt if any
    while p.state["epoch"] < p.epochs:
        for micro, batch in enumerate(p.epoch_batches(train_ds)):
            tokens, pad_mask, labels = to_device(batch, rt)
            k = micro % accum                                                # micro-batch k of this step
            with grad_sync(train_obj, rt, last_micro=k == accum - 1), rt.autocast():
                if spt:
                    # SPT: hide a random mask_ratio of the real tokens and reconstruct them. The
                    # mask is drawn once for the whole global batch, then this micro-batch takes
                    # its rows: the masks do not depend on the number of GPUs or micro-batches.
                    if k == 0:
                        step_hide = draw_hidden((p.global_batch, *tokens.shape[1:-1], train_ds.max_len),
                                                cfg["mask_ratio"], mask_gen)
                    start = micro_row(k, cfg, rt)
                    hide = only_real(step_hide[start:start + len(tokens), ..., :tokens.size(-1)], pad_mask)
                    loss = train_obj(tokens, pad_mask, hide.to(rt.device))
                else:                                                        # classify
                    loss, _ = train_obj(tokens, pad_mask, labels)
            (loss / accum).backward()
            if k < accum - 1:
                continue
            for group in optimizer.param_groups:                             # warmup, then decay
                group["lr"] = p.schedule.lr(p.state["step"], p.lr)
            gnorm = torch.nn.utils.clip_grad_norm_(params, cfg["grad_clip"] or float("inf"))
            p.guard.record(loss, gnorm, p.state["step"] + 1)                 # on a CPU: stops before the update
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            p.after_step(loss, gnorm)              # log, ETA, attention snapshots, ckpt_every
            run.tick()                             # a signal or --halt_after_steps stops here
        if p.end_of_epoch(lambda: evaluate(objective, val_ds, cfg, rt, name)):   # best kept, ckpt.pt; True: stop
            break
    run.saver = None
    trainable((model.head if spt else model.lm_head).parameters(), True)      # the other phase's head
    return p


@torch.no_grad()
def evaluate(objective, ds, cfg, rt, phase):
    """Mean loss, and for the classifier its accuracy and the standard error of the mean
    loss (sd of the per-example losses / sqrt(n): the noise a take-off must clear).
    SPT masks come from a fixed generator, so the validation loss compares across epochs."""
    objective.eval()
    idx = list(range(rt.rank, len(ds), rt.world_size))
    batches = [idx[i:i + cfg["batch_size"]] for i in range(0, len(idx), cfg["batch_size"])]
    gen = torch.Generator().manual_seed(VAL_MASK_SEED)
    totals = torch.zeros(4, dtype=torch.float64, device=rt.device)   # loss sum, correct, count, squares
    for batch in tqdm(rt.loader(ds, batches, cfg["num_workers"]), desc=f"eval {phase}", leave=False,
                      disable=not rt.master):
        tokens, pad_mask, labels = to_device(batch, rt)
        with rt.autocast():
            if phase == "spt":
                hide = only_real(draw_hidden(tokens.shape, cfg["mask_ratio"], gen), pad_mask).to(rt.device)
                loss, correct, squares = objective(tokens, pad_mask, hide), 0.0, 0.0
            else:
                loss, logits = objective(tokens, pad_mask, labels)
                correct = (logits.argmax(-1) == labels).sum()
                squares = (F.cross_entropy(logits.float(), labels, reduction="none") ** 2).sum()
        as_double = lambda x: torch.as_tensor(x, device=rt.device).double()
        totals += torch.stack([loss.double() * len(labels), as_double(correct), as_double(float(len(labels))),
                               as_double(squares)])
    if rt.ddp:
        dist.all_reduce(totals)
    objective.train()
    mean, n = (totals[0] / totals[2]).item(), totals[2].item()
    se = math.sqrt(max(totals[3].item() / n - mean ** 2, 0.0) / n) if phase != "spt" else None
    return {"loss": mean, "acc": (totals[1] / totals[2]).item(), "loss_se": se}


# -----------------------------------------------------------------------------
# The run: SPT, then finetuning, then the test accuracy and the figures

def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    cfg = get_config(DEFAULTS, argv, __doc__)
    if cfg["report"]:
        return spt_report.report(cfg["report"], cfg["out_dir"])
    # The run folder: a run refuses an out_dir that holds another run's results (--overwrite=True
    # replaces them) and writes nothing there until its flags, data and model have been checked.
    with Run(cfg, "train_spt.py", argv, resume_config) as run:
        cost.announce(run.cfg, run.rt)                                # a long run says so first
        data = load_splits(run)
        model = build_model(run.cfg, [data["train"], data["pretrain"]]).to(run.rt.device)
        cost.choose_dtype(run, model, lambda: model.classify(data["train"].collate([data["train"][0]])[0]).sum())
        ckpt = run.ckpt
        run.begin(keep=ckpt and PhaseLedger.written_before(ckpt),
                  at=ckpt and dict(phase=ckpt["phase"], step=ckpt["step"]),
                  also=("snapshots.jsonl",))
        seen = analysis.Observations(run.cfg["out_dir"], run.cfg["task"] in IMAGE_TASKS, run.rt.master)
        return run_phases(run, data, model, seen)


def run_phases(run, data, model, seen):
    """Phase 1 (SPT, unless finetuning from a given checkpoint), phase 2 (finetuning from
    a fresh model holding (part of) the SPT weights), then the test accuracy."""
    cfg, rt, ckpt = run.cfg, run.rt, run.ckpt
    if rt.master:
        print(f"device {rt.device} ({rt.ptdtype}), world size {rt.world_size}; task {cfg['task']}: "
              f"{len(data['train'])}/{len(data['val'])}/{len(data['test'])} train/val/test; pretraining on "
              f"{cfg['pretrain_task'] or cfg['task']}; {model.num_params():,} parameters; out_dir {cfg['out_dir']}")
    seen.observe("init", model, data["val"], rt.device)
    given = cfg["init_from"] not in ("", "resume")
    pretrain = cfg["pretrain_epochs"] > 0 and not given
    spt_ckpt, spt = (cfg["init_from"] if given else None), None
    if pretrain and not (ckpt and ckpt["phase"] == "finetune"):
        spt = train_phase("spt", model, data["pretrain"], data["pretrain_val"], run)
        spt_ckpt = spt.best_path
    elif pretrain:
        spt_ckpt = os.path.join(cfg["out_dir"], "spt_best.pt")
    if rt.ddp:
        dist.barrier()                                            # rank 0 has written the SPT checkpoint
    if cfg["epochs"] == 0:                      # SPT alone: its checkpoints are what other runs finetune from
        return spt_only(run, seen, model, data["val"], spt)
    model = build_model(cfg, [data["train"], data["pretrain"]]).to(rt.device)
    copied = hybrid_init(model, spt_ckpt, cfg["init_params"]) if spt_ckpt else []
    if spt_ckpt:                                # "start": the model finetuning starts from, after the copy
        seen.observe("start", model, data["val"], rt.device)
        if rt.master:
            print(f"finetuning from {spt_ckpt}: copied {len(copied)} tensors ({cfg['init_params']})")
    frozen = freeze(model, cfg["freeze"])
    ft = train_phase("finetune", model, data["train"], data["val"], run)
    if rt.ddp:
        dist.barrier()                                            # rank 0 has written the best checkpoint
    load_weights(model, ft.best_path)
    test = evaluate(Classification(model), data["test"], cfg, rt, "finetune")
    seen.observe("finetune", model, data["val"], rt.device)
    spt_loss = spt.state["best_metric"] if spt else load_checkpoint(spt_ckpt)["loss"] if pretrain else None
    return spt_report.summarize(run, seen, model, data["val"], dict(
        pretrain_epochs=cfg["pretrain_epochs"] if pretrain else 0, best_val_acc=ft.state["best_metric"],
        best_epoch=ft.state["best_epoch"], test_acc=test["acc"], spt_best_val_loss=spt_loss,
        frozen=len(frozen), copied=len(copied), steps=ft.state["step"], wall_time_s=run.elapsed()))


def spt_only(run, seen, model, val_ds, spt):
    """The summary of a run that stops after SPT (--epochs=0): its checkpoints are its product;
    another run's `--init_from=RUN/spt_best.pt` finetunes from them as phase 2 of an SPT run does."""
    load_weights(model, spt.best_path)
    seen.observe("spt", model, val_ds, run.rt.device)
    return spt_report.summarize(run, seen, model, val_ds, dict(
        pretrain_epochs=run.cfg["pretrain_epochs"], spt_best_val_loss=spt.state["best_metric"],
        spt_best_epoch=spt.state["best_epoch"], steps=0, spt_steps=spt.state["step"], wall_time_s=run.elapsed()))


if __name__ == "__main__":
    run_cli(main)
