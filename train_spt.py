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
Amos et al.'s per-task values and the named presets are in spt_settings.py.

Read top to bottom: the flags, the data, the two objectives (MaskedReconstruction is
SPT), hybrid initialisation and freezing, train_phase (the loop) and its Phase, evaluate,
main. The run itself is training.Run's: a folder holding another run is refused, a stop
signal saves the resume point, --init_from=resume continues exactly, a NaN stops the run.
"""

import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from tqdm import tqdm

import analysis
import cost
import spt_report
import synthetic
from configurator import run_cli
from model import Transformer, TransformerConfig, select_params
from spt_settings import IMAGE_TASKS, check_data, get_config, resume_config
from training import NonFiniteGuard, Run, Schedule, grad_sync, load_checkpoint, load_weights, wrap

# -----------------------------------------------------------------------------
# The flags: every key is a --key=value flag (--help lists them). --task=NAME starts from
# Amos et al.'s values for that task and --preset=NAME applies a named set of overrides
# (spt_settings.py: TASKS, PRESETS, and the checks that refuse a bad flag before any work).

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
    mask_ratio=0.15,         # the share of real tokens SPT hides (per task: spt_settings.TASKS; Amos et al.'s)
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
    preset="",               # "", cpu or cpu_rescue: overrides applied before the flags (spt_settings.PRESETS)
    # logging and analysis
    log_every=10, ckpt_every=0,   # steps (ckpt_every 0 = end of each epoch only)
    snapshot_attn_every=0,   # steps; save layer-0 attention maps to plot their evolution
    halt_after_steps=0,      # stop as if killed after this many steps (to test resume)
    report="",               # comma list of folders: their summary.json as one table (spt_report.report)
    # system
    device="auto", dtype="auto",   # auto: bf16 on a GPU that has it, else float32; fast: timed (cost.choose_dtype)
    compile=False, num_workers=0, debug=False,
)

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


# Seeds. Each random stream has its own seed derived from --seed, so changing one
# thing (the number of epochs, the mask ratio) never shifts another stream.
BATCH_SEED_STRIDE = 100_003   # a prime above 2 x any epoch count: (seed, epoch, phase) never collide
MASK_SEED_OFFSET = 7          # the SPT masks' stream: apart from the model init, which uses --seed itself
VAL_MASK_SEED = 1234          # validation masks: the same every epoch and every seed, so SPT val losses compare


def batch_order_seed(seed, epoch, spt):
    """The seed of one epoch's batch order in one phase: a function of (seed, epoch, phase) only."""
    return seed * BATCH_SEED_STRIDE + 2 * epoch + int(spt)


def rank_batches(n, cfg, rt, seed):
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
        batches += [chunk[micro_row(k, cfg, rt):][:cfg["batch_size"]] for k in range(cfg["grad_accum"])]
    return batches


def micro_row(k, cfg, rt):
    """The first row of this rank's micro-batch k in the step's batch (its examples, its mask rows)."""
    return (k * rt.world_size + rt.rank) * cfg["batch_size"]


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
    Phase: its best checkpoint (best_path) and state (best score, steps, ...)."""
    cfg, rt, accum = run.cfg, run.rt, run.cfg["grad_accum"]
    p = Phase(name, model, train_ds, val_ds, run)
    run.saver = p.save                          # Ctrl-C or SIGTERM: save the resume point, then stop
    while p.state["epoch"] < p.epochs:
        for micro, batch in enumerate(p.epoch_batches(train_ds)):
            tokens, pad_mask, labels = to_device(batch, rt)
            k = micro % accum                                            # micro-batch k of this step
            with grad_sync(p.train_obj, rt, last_micro=k == accum - 1), rt.autocast():
                if p.spt:
                    # SPT: hide a random mask_ratio of the real tokens and reconstruct them. The
                    # mask is drawn once for the whole global batch, then this micro-batch takes
                    # its rows: the masks do not depend on the number of GPUs or micro-batches.
                    if k == 0:
                        step_hide = draw_hidden((p.global_batch, *tokens.shape[1:-1], train_ds.max_len),
                                                cfg["mask_ratio"], p.mask_gen)
                    start = micro_row(k, cfg, rt)
                    hide = only_real(step_hide[start:start + len(tokens), ..., :tokens.size(-1)], pad_mask)
                    loss = p.train_obj(tokens, pad_mask, hide.to(rt.device))
                else:                                                    # classify
                    loss, _ = p.train_obj(tokens, pad_mask, labels)
            (loss / accum).backward()
            if k < accum - 1:
                continue
            for group in p.optimizer.param_groups:                       # warmup, then decay
                group["lr"] = p.schedule.lr(p.state["step"], p.lr)
            gnorm = torch.nn.utils.clip_grad_norm_(p.params, cfg["grad_clip"] or float("inf"))
            p.guard.record(loss, gnorm, p.state["step"] + 1)             # on a CPU: stops before the update
            p.optimizer.step()
            p.optimizer.zero_grad(set_to_none=True)
            p.after_step(loss, gnorm)              # log, ETA, attention snapshots, ckpt_every
            run.tick()                             # a signal or --halt_after_steps stops here
        if p.end_of_epoch():                       # evaluate, keep the best, save ckpt.pt; True: stop
            break
    run.saver = None
    trainable((model.head if p.spt else model.lm_head).parameters(), True)   # the other phase's head
    return p


class Phase:
    """One phase's settings (epochs, lr, schedule, warmup), objective, optimizer and
    state, and what the loop does around the step: the batches of each epoch, the
    logging after a step, the evaluation at an epoch's end, the resume point."""

    def __init__(self, name, model, train_ds, val_ds, run):
        cfg, rt = run.cfg, run.rt
        self.name, self.spt, self.model, self.val_ds, self.run = name, name == "spt", model, val_ds, run
        self.global_batch = cfg["batch_size"] * cfg["grad_accum"] * rt.world_size
        self.epochs = cfg["pretrain_epochs"] if self.spt else cfg["epochs"]
        self.steps_per_epoch = len(train_ds) // self.global_batch
        self.total_steps = self.epochs * self.steps_per_epoch
        warmup = cfg["pretrain_warmup_steps" if self.spt else "warmup_steps"] or \
            int(cfg["warmup_frac"] * self.total_steps)
        self.lr = (cfg["pretrain_lr"] or cfg["lr"]) if self.spt else cfg["lr"]
        self.schedule = Schedule((cfg["pretrain_schedule"] or cfg["schedule"]) if self.spt else cfg["schedule"],
                                 self.total_steps, warmup)
        trainable((model.head if self.spt else model.lm_head).parameters(), False)   # unused by this phase
        self.objective = MaskedReconstruction(model, train_ds.mask_id, cfg["spt_objective"] == "causal") \
            if self.spt else Classification(model)
        self.optimizer = model.configure_optimizers(cfg["weight_decay"], self.lr, device_type=rt.device_type)
        self.train_obj = wrap(self.objective, rt, cfg["compile"])        # DDP, torch.compile
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.mask_gen, self.rng = mask_generator(cfg), None
        self.state = dict(epoch=0, step_in_epoch=0, step=0, best=None, best_epoch=-1, bad_epochs=0)
        self.guard = NonFiniteGuard(run, name)
        self.best_path = os.path.join(cfg["out_dir"], f"{name}_best.pt")
        if run.ckpt and run.ckpt["phase"] == name:                       # continue from ckpt.pt
            run.restore(model, [self.optimizer], rng=False)              # epoch_batches sets the RNG
            self.state.update({k: run.ckpt[k] for k in self.state})
            self.mask_gen.set_state(run.ckpt["mask_gen"])
            self.rng = run.ckpt["rng"]
        if rt.master:
            print(f"[{name}] {len(train_ds)} train / {len(val_ds)} val examples, {self.epochs} epochs x "
                  f"{self.steps_per_epoch} steps, lr {self.lr:g}, {sum(p.numel() for p in self.params):,} "
                  f"trainable parameters", flush=True)
        self.t0 = time.time()

    def epoch_batches(self, train_ds):
        """This epoch's micro-batches from where the phase stands, with a progress bar.
        A DataLoader iterator draws its seed from the torch RNG when it is made: a resumed
        run rewinds that RNG (dropout's) to the checkpoint's state, before making the
        iterator if the checkpoint was saved at an epoch's end, after it if mid-epoch."""
        cfg, rt, state = self.run.cfg, self.run.rt, self.state
        seed = batch_order_seed(cfg["seed"], state["epoch"], self.spt)
        batches = rank_batches(len(train_ds), cfg, rt, seed)[state["step_in_epoch"] * cfg["grad_accum"]:]
        self.bar = tqdm(total=self.steps_per_epoch, initial=state["step_in_epoch"], disable=not rt.master,
                        desc=f"{self.name} epoch {state['epoch'] + 1}/{self.epochs}", leave=False)
        if self.rng is not None and state["step_in_epoch"] == 0:
            torch.set_rng_state(self.rng)
        data = iter(rt.loader(train_ds, batches, cfg["num_workers"]))
        if self.rng is not None and state["step_in_epoch"] > 0:
            torch.set_rng_state(self.rng)
        self.rng = None
        return data

    def after_step(self, loss, gnorm):
        """Count the step; log every log_every steps (and the first), print the phase's
        ETA after 20 steps, snapshot the attention every snapshot_attn_every steps, and
        save ckpt.pt every ckpt_every steps."""
        cfg, rt, state = self.run.cfg, self.run.rt, self.state
        state["step"] += 1
        state["step_in_epoch"] += 1
        step = state["step"]
        self.bar.update(1)
        if step % cfg["log_every"] == 0 or step == 1:
            self.guard.check()
            self.run.log(phase=self.name, step=step, epoch=state["epoch"], loss=loss.item(),
                         lr=self.optimizer.param_groups[0]["lr"], grad_norm=gnorm.item())
            self.bar.set_postfix(loss=f"{loss.item():.4f}")
        if rt.master and step == 20:
            eta = (time.time() - self.t0) / 20 * (self.total_steps - 20)
            print(f"[{self.name}] ~{eta / 60:.1f} min for this phase at the current speed", flush=True)
        if cfg["snapshot_attn_every"] and step % cfg["snapshot_attn_every"] == 0 and rt.master:
            record = analysis.attention_snapshot(self.model, self.val_ds, rt.device)
            self.run.log("snapshots.jsonl", phase=self.name, step=step, **record)
        if cfg["ckpt_every"] and step % cfg["ckpt_every"] == 0:
            self.save()

    def end_of_epoch(self):
        """Evaluate; keep the best weights (SPT: lowest val loss; finetuning: highest val
        accuracy) and the SPT weights after the epochs in --save_epochs; save ckpt.pt.
        Returns True to stop: early stopping (finetuning) or the phase's wall-time cap."""
        cfg, rt, state = self.run.cfg, self.run.rt, self.state
        self.bar.close()
        epoch = state["epoch"] + 1
        self.guard.check()
        metrics = evaluate(self.objective, self.val_ds, cfg, rt, self.name)
        if not math.isfinite(metrics["loss"]):
            self.guard.mark(state["step"])
            self.guard.check()                                           # a NaN val loss is never "best"
        score = -metrics["loss"] if self.spt else metrics["acc"]
        improved = state["best"] is None or score > state["best"]
        state.update(epoch=epoch, step_in_epoch=0, bad_epochs=0 if improved else state["bad_epochs"] + 1)
        self.run.log(phase=self.name, step=state["step"], epoch=epoch, val_loss=metrics["loss"],
                     val_acc=metrics["acc"], **({} if self.spt else {"val_loss_se": metrics["loss_se"]}))
        if improved:
            state.update(best=score, best_epoch=epoch)
            self.run.save_weights(self.best_path, self.model, epoch=epoch, **metrics)
        if self.spt and epoch in {int(e) for e in cfg["save_epochs"].split(",") if e.strip()}:
            self.run.save_weights(os.path.join(cfg["out_dir"], f"spt_epoch{epoch}.pt"), self.model, epoch=epoch)
        if rt.master:
            print(f"[{self.name}] epoch {epoch}/{self.epochs}: val loss {metrics['loss']:.4f}"
                  + ("" if self.spt else f", val acc {metrics['acc']:.4f}") + (" (best)" if improved else ""),
                  flush=True)
        self.save()
        stop_early = not self.spt and cfg["patience"] and state["bad_epochs"] >= cfg["patience"]
        return bool(stop_early) or time.time() - self.t0 > cfg["max_hours"] * 3600

    def save(self):
        """ckpt.pt, the resume point (training.Run.save_resume), after checking that the
        weights were never updated with a NaN gradient: the phase's state, its mask
        stream and optimizer with the weights, the RNG and the config."""
        self.guard.check()
        self.run.save_resume(self.model, [self.optimizer], phase=self.name, mask_gen=self.mask_gen.get_state(),
                             **self.state)


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

PHASES = ("spt", "finetune")


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
        run.begin(keep=ckpt and written_before(ckpt), at=ckpt and dict(phase=ckpt["phase"], step=ckpt["step"]),
                  also=("snapshots.jsonl",))
        seen = analysis.Observations(run.cfg["out_dir"], run.cfg["task"] in IMAGE_TASKS, run.rt.master)
        return run_phases(run, data, model, seen)


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


def load_splits(run):
    """The task's train/val/test splits and the pretraining task's train/val, checked."""
    cfg = run.cfg
    data = {s: load_data(cfg["task"], s, cfg) for s in ("train", "val", "test")}
    pre_task = cfg["pretrain_task"] or cfg["task"]
    same = pre_task == cfg["task"]
    data["pretrain"] = data["train"] if same else load_data(pre_task, "train", cfg)
    data["pretrain_val"] = data["val"] if same else load_data(pre_task, "val", cfg)
    check_data(cfg, run.rt, data)
    run.fingerprint(data["train"], data["pretrain"])              # a resumed run: the same data
    return data


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
    if spt_ckpt:
        seen.observe("spt", model, data["val"], rt.device)
        if rt.master:
            print(f"finetuning from {spt_ckpt}: copied {len(copied)} tensors ({cfg['init_params']})")
    frozen = freeze(model, cfg["freeze"])
    ft = train_phase("finetune", model, data["train"], data["val"], run)
    if rt.ddp:
        dist.barrier()                                            # rank 0 has written the best checkpoint
    load_weights(model, ft.best_path)
    test = evaluate(Classification(model), data["test"], cfg, rt, "finetune")
    seen.observe("finetune", model, data["val"], rt.device)
    spt_loss = -spt.state["best"] if spt else load_checkpoint(spt_ckpt)["loss"] if pretrain else None
    return summarize(run, seen, model, data["val"], dict(
        pretrain_epochs=cfg["pretrain_epochs"] if pretrain else 0, best_val_acc=ft.state["best"],
        best_epoch=ft.state["best_epoch"], test_acc=test["acc"], spt_best_val_loss=spt_loss,
        frozen=len(frozen), copied=len(copied), steps=ft.state["step"], wall_time_s=run.elapsed()))


def spt_only(run, seen, model, val_ds, spt):
    """The summary of a run that stops after SPT (--epochs=0): its checkpoints are its product;
    another run's `--init_from=RUN/spt_best.pt` finetunes from them as phase 2 of an SPT run does."""
    load_weights(model, spt.best_path)
    seen.observe("spt", model, val_ds, run.rt.device)
    return summarize(run, seen, model, val_ds, dict(
        pretrain_epochs=run.cfg["pretrain_epochs"], spt_best_val_loss=-spt.state["best"],
        spt_best_epoch=spt.state["best_epoch"], steps=0, spt_steps=spt.state["step"], wall_time_s=run.elapsed()))


def summarize(run, seen, model, val_ds, results):
    """summary.json (the run's flags, its results, the attention statistics at each
    stage) and the figures: curves, proximity, attention evolution, the 2-D maps."""
    cfg, rt = run.cfg, run.rt
    summary = dict(task=cfg["task"], depth=cfg["depth"], pretrain_epochs=results.pop("pretrain_epochs"),
                   epochs=cfg["epochs"], pretrain_task=cfg["pretrain_task"] or cfg["task"],
                   init_from=cfg["init_from"], init_params=cfg["init_params"], freeze=cfg["freeze"],
                   pos_enc=cfg["pos_enc"], pool=cfg["pool"], init=cfg["init"], pixel_encoder=cfg["pixel_encoder"],
                   **results, n_params=model.num_params(), world_size=rt.world_size)
    if rt.ddp:
        summary["replica_max_diff"] = run.replica_max_diff(model)
    if not rt.master:
        return summary
    summary.update(analysis.stage_statistics(seen.reports), proximity=seen.reports)
    run.write_summary(summary)
    seen.plot(val_ds[0][0])
    spt_report.plot_run(cfg["out_dir"])
    last = "finetune" if "test_acc" in summary else "spt"                 # "spt": SPT alone (--epochs=0)
    done = ("best val acc {best_val_acc:.4f} (epoch {best_epoch}), test acc {test_acc:.4f}" if last == "finetune"
            else "SPT best val loss {spt_best_val_loss:.4f} (epoch {spt_best_epoch})").format(**summary)
    print(f"{done}; attention mass within |i-j|<=2: init {summary['mass_w2_init']:.3f}, final "
          f"{summary['mass_w2_' + last]:.3f} (uniform {summary['mass_w2_uniform']:.3f}); files in {cfg['out_dir']}")
    return summary


if __name__ == "__main__":
    run_cli(main)
