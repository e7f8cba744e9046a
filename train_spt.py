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
the attention's proximity statistics (analysis.py). The flags, Amos et al.'s
per-task values and the named presets are in spt_settings.py (--help lists them).

Read top to bottom: the data, the two objectives (MaskedReconstruction is SPT),
hybrid initialisation and freezing, train_phase (the loop) and the Phase it hangs
on, evaluate, main. A run refuses an out_dir that holds another run
(training.RunFolder); --init_from=resume continues it exactly; a NaN or inf loss
or gradient stops it, and checkpoints hold finite weights only.
"""

import math
import os
import shlex
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

import analysis
import cost
import synthetic
from configurator import given_keys, parse_int_list, resume_config, run_cli
from model import Transformer, TransformerConfig, select_params
from spt_settings import IMAGE_TASKS, RESUME_SAFE, check_data, default_out_dir, get_config
from training import (NonFiniteGuard, RunClock, RunFolder, RunLog, append_text, close_ddp, data_fingerprint,
                      example_bytes, grad_sync, interrupted, load_checkpoint, load_state, lr_at, record_fingerprint,
                      replica_max_diff, save_checkpoint, setup_runtime, to_json, unwrap)

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
# One training phase (SPT or finetuning): the loop, then what it hangs on

def train_phase(name, model, train_ds, val_ds, run, resume=None):
    """Train `model` in place. name='spt': masked reconstruction, best = lowest val
    loss. name='finetune': classification, best = highest val accuracy. Returns the
    Phase: its best checkpoint (best_path) and state (best score, steps, ...)."""
    cfg, rt, accum = run.cfg, run.rt, run.cfg["grad_accum"]
    p = Phase(name, model, train_ds, val_ds, run)
    p.restore(resume)
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
                    start = (k * rt.world_size + rt.rank) * cfg["batch_size"]
                    hide = only_real(step_hide[start:start + len(tokens), ..., :tokens.size(-1)], pad_mask)
                    loss = p.train_obj(tokens, pad_mask, hide.to(rt.device))
                else:                                                    # classify
                    loss, _ = p.train_obj(tokens, pad_mask, labels)
            (loss / accum).backward()
            if k < accum - 1:
                continue
            for group in p.optimizer.param_groups:                       # warmup, then decay
                group["lr"] = lr_at(p.state["step"], p.total_steps, p.lr, p.warmup, p.schedule)
            gnorm = torch.nn.utils.clip_grad_norm_(p.params, cfg["grad_clip"] or float("inf"))
            p.guard.record(loss, gnorm, p.state["step"] + 1)             # on a CPU: stops before the update
            p.optimizer.step()
            p.optimizer.zero_grad(set_to_none=True)
            p.after_step(loss, gnorm)              # log, ETA, attention snapshots, ckpt_every, halt
        if p.end_of_epoch():                       # evaluate, keep the best, save ckpt.pt; True: stop
            break
    for param in (model.head if p.spt else model.lm_head).parameters():   # the other phase's head
        param.requires_grad_(True)
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
        self.warmup = cfg["pretrain_warmup_steps" if self.spt else "warmup_steps"] or \
            int(cfg["warmup_frac"] * self.total_steps)
        self.lr = (cfg["pretrain_lr"] or cfg["lr"]) if self.spt else cfg["lr"]
        self.schedule = (cfg["pretrain_schedule"] or cfg["schedule"]) if self.spt else cfg["schedule"]
        for p in (model.head if self.spt else model.lm_head).parameters():   # unused by this phase
            p.requires_grad_(False)
        self.objective = MaskedReconstruction(model, train_ds.mask_id, cfg["spt_objective"] == "causal") \
            if self.spt else Classification(model)
        self.optimizer = model.configure_optimizers(cfg["weight_decay"], self.lr, device_type=rt.device_type)
        self.train_obj = DDP(self.objective, device_ids=[rt.local_rank] if rt.device_type == "cuda" else None) \
            if rt.ddp else self.objective
        self.train_obj = torch.compile(self.train_obj) if cfg["compile"] else self.train_obj
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.mask_gen, self.rng = mask_generator(cfg), None
        self.state = dict(epoch=0, step_in_epoch=0, step=0, best=None, best_epoch=-1, bad_epochs=0)
        self.guard = NonFiniteGuard(rt, name, os.path.join(cfg["out_dir"], "ckpt.pt"))
        self.best_path = os.path.join(cfg["out_dir"], f"{name}_best.pt")
        if rt.master:
            print(f"[{name}] {len(train_ds)} train / {len(val_ds)} val examples, {self.epochs} epochs x "
                  f"{self.steps_per_epoch} steps, lr {self.lr:g}, {sum(p.numel() for p in self.params):,} "
                  f"trainable parameters", flush=True)
        self.t0 = time.time()

    def restore(self, resume):
        """Continue from ckpt.pt if it was saved in this phase: optimizer, state, mask
        stream, and the torch RNG to rewind to where the loop resumes."""
        if resume is None or resume["phase"] != self.name:
            return
        self.optimizer.load_state_dict(resume["optimizer"])
        self.state.update({k: resume[k] for k in self.state if k in resume})
        self.mask_gen.set_state(resume["mask_gen"])
        self.rng = resume["torch_rng"]

    def epoch_batches(self, train_ds):
        """This epoch's micro-batches from where the phase stands, with a progress bar.
        A DataLoader iterator draws its seed from the torch RNG when it is made: a resumed
        run rewinds that RNG (dropout's) to the checkpoint's state, before making the
        iterator if the checkpoint was saved at an epoch's end, after it if mid-epoch."""
        cfg, rt, state = self.run.cfg, self.run.rt, self.state
        seed = batch_order_seed(cfg["seed"], state["epoch"], self.spt)
        batches = epoch_batches(len(train_ds), cfg, rt, seed)[state["step_in_epoch"] * cfg["grad_accum"]:]
        self.bar = tqdm(total=self.steps_per_epoch, initial=state["step_in_epoch"], disable=not rt.master,
                        desc=f"{self.name} epoch {state['epoch'] + 1}/{self.epochs}", leave=False)
        if self.rng is not None and state["step_in_epoch"] == 0:
            torch.set_rng_state(self.rng)
        data = iter(loader(train_ds, batches, cfg, rt))
        if self.rng is not None and state["step_in_epoch"] > 0:
            torch.set_rng_state(self.rng)
        self.rng = None
        return data

    def after_step(self, loss, gnorm):
        """Count the step; log every log_every steps (and the first), print the phase's
        ETA after 20 steps, snapshot the attention every snapshot_attn_every steps, save
        ckpt.pt every ckpt_every steps, and halt after --halt_after_steps."""
        cfg, rt, state = self.run.cfg, self.run.rt, self.state
        state["step"] += 1
        state["step_in_epoch"] += 1
        step = state["step"]
        self.bar.update(1)
        if step % cfg["log_every"] == 0 or step == 1:
            self.guard.check()
            self.run.log.log(phase=self.name, step=step, epoch=state["epoch"], loss=loss.item(),
                             lr=self.optimizer.param_groups[0]["lr"], grad_norm=gnorm.item())
            self.bar.set_postfix(loss=f"{loss.item():.4f}")
        if rt.master and step == 20:
            eta = (time.time() - self.t0) / 20 * (self.total_steps - 20)
            print(f"[{self.name}] ~{eta / 60:.1f} min for this phase at the current speed", flush=True)
        if cfg["snapshot_attn_every"] and step % cfg["snapshot_attn_every"] == 0 and rt.master:
            record = analysis.attention_snapshot(self.model, self.val_ds, rt.device)
            append_text(os.path.join(cfg["out_dir"], "snapshots.jsonl"),
                        to_json(dict(phase=self.name, step=step, **record)) + "\n")
        if cfg["ckpt_every"] and step % cfg["ckpt_every"] == 0:
            self.save()
        self.run.clock.tick(self.bar)

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
        self.run.log.log(phase=self.name, step=state["step"], epoch=epoch, val_loss=metrics["loss"],
                         val_acc=metrics["acc"], **({} if self.spt else {"val_loss_se": metrics["loss_se"]}))
        weights = dict(model=unwrap(self.model).state_dict(), config=cfg, epoch=epoch)
        if improved:
            state.update(best=score, best_epoch=epoch)
            if rt.master:
                save_checkpoint(self.best_path, dict(**weights, **metrics))
        if rt.master and self.spt and epoch in parse_int_list("save_epochs", cfg["save_epochs"]):
            save_checkpoint(os.path.join(cfg["out_dir"], f"spt_epoch{epoch}.pt"), weights)
        if rt.master:
            print(f"[{self.name}] epoch {epoch}/{self.epochs}: val loss {metrics['loss']:.4f}"
                  + ("" if self.spt else f", val acc {metrics['acc']:.4f}") + (" (best)" if improved else ""),
                  flush=True)
        self.save()
        stop_early = not self.spt and cfg["patience"] and state["bad_epochs"] >= cfg["patience"]
        return bool(stop_early) or time.time() - self.t0 > cfg["max_hours"] * 3600

    def save(self):
        """ckpt.pt: everything --init_from=resume needs to continue exactly (weights,
        optimizer, mask stream, torch RNG, config, the phase's state), after checking
        that the weights were never updated with a NaN gradient."""
        self.guard.check()
        if self.run.rt.master:
            save_checkpoint(os.path.join(self.run.cfg["out_dir"], "ckpt.pt"), dict(
                phase=self.name, model=unwrap(self.model).state_dict(), optimizer=self.optimizer.state_dict(),
                mask_gen=self.mask_gen.get_state(), torch_rng=torch.get_rng_state(), config=self.run.cfg,
                wall_time=self.run.clock.elapsed(), **self.state))


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
    for batch in tqdm(loader(ds, batches, cfg, rt), desc=f"eval {phase}", leave=False, disable=not rt.master):
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


@dataclass
class Run:
    """What both phases share: the config, the runtime, the log, the clock and the
    attention observations."""
    cfg: dict
    rt: object
    log: RunLog
    clock: RunClock
    seen: analysis.Observations


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    cfg = get_config(argv)
    if cfg["report"]:
        return analysis.report(cfg["report"], cfg["out_dir"])
    cfg["out_dir"] = cfg["out_dir"] or default_out_dir(cfg)
    resume = cfg["init_from"] == "resume"
    with RunFolder(cfg["out_dir"], "train_spt.py", cfg["overwrite"], resume) as folder:
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
        log = RunLog(cfg["out_dir"], cfg, keep=ckpt and written_before(ckpt),
                     command=shlex.join(["python", "train_spt.py", *argv]), also=("snapshots.jsonl",))
        if ckpt:
            log.log(phase=ckpt["phase"], step=ckpt["step"], event="resume", changed=cfg["resumes"][-1])
        run = Run(cfg, rt, log, RunClock(cfg["halt_after_steps"], ckpt.get("wall_time", 0.0) if ckpt else 0.0),
                  analysis.Observations(cfg["out_dir"], cfg["task"] in IMAGE_TASKS, rt.master))
        try:
            summary = run_phases(run, data, model, ckpt)
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


def run_phases(run, data, model, ckpt):
    """Phase 1 (SPT, unless finetuning from a given checkpoint), phase 2 (finetuning from
    a fresh model holding (part of) the SPT weights), then the test accuracy."""
    cfg, rt = run.cfg, run.rt
    if rt.master:
        print(f"device {rt.device} ({rt.ptdtype}), world size {rt.world_size}; task {cfg['task']}: "
              f"{len(data['train'])}/{len(data['val'])}/{len(data['test'])} train/val/test; pretraining on "
              f"{cfg['pretrain_task'] or cfg['task']}; {model.num_params():,} parameters; out_dir {cfg['out_dir']}")
    run.seen.observe("init", model, data["val"], rt.device)
    given = cfg["init_from"] not in ("", "resume")
    pretrain = cfg["pretrain_epochs"] > 0 and not given
    spt_ckpt, spt = (cfg["init_from"] if given else None), None
    if pretrain and not (ckpt and ckpt["phase"] == "finetune"):
        if ckpt:
            load_state(model, ckpt["model"])
        spt = train_phase("spt", model, data["pretrain"], data["pretrain_val"], run, ckpt)
        spt_ckpt, ckpt = spt.best_path, None
    elif pretrain:
        spt_ckpt = os.path.join(cfg["out_dir"], "spt_best.pt")
    if rt.ddp:
        dist.barrier()                                            # rank 0 has written the SPT checkpoint
    model = build_model(cfg, [data["train"], data["pretrain"]]).to(rt.device)
    copied = hybrid_init(model, spt_ckpt, cfg["init_params"]) if spt_ckpt else []
    if spt_ckpt:
        run.seen.observe("spt", model, data["val"], rt.device)
        if rt.master:
            print(f"finetuning from {spt_ckpt}: copied {len(copied)} tensors ({cfg['init_params']})")
    frozen = freeze(model, cfg["freeze"])
    if ckpt:
        load_state(model, ckpt["model"])
    ft = train_phase("finetune", model, data["train"], data["val"], run, ckpt)
    if rt.ddp:
        dist.barrier()                                            # rank 0 has written the best checkpoint
    load_state(model, load_checkpoint(ft.best_path, rt.device)["model"])
    test = evaluate(Classification(model), data["test"], cfg, rt, "finetune")
    run.seen.observe("finetune", model, data["val"], rt.device)
    spt_loss = -spt.state["best"] if spt else spt_best_loss(cfg) if pretrain else None
    return summarize(run, model, data["val"], dict(
        pretrain_epochs=cfg["pretrain_epochs"] if pretrain else 0, best_val_acc=ft.state["best"],
        best_epoch=ft.state["best_epoch"], test_acc=test["acc"], spt_best_val_loss=spt_loss,
        frozen=len(frozen), copied=len(copied), steps=ft.state["step"], wall_time_s=run.clock.elapsed()))


def spt_best_loss(cfg):
    """The SPT phase's best val loss, from spt_best.pt (a run resumed in finetuning)."""
    return load_checkpoint(os.path.join(cfg["out_dir"], "spt_best.pt"))["loss"]


def summarize(run, model, val_ds, results):
    """summary.json (the run's flags, its results, the attention statistics at each
    stage) and the figures: curves, proximity, attention evolution, the 2-D maps."""
    cfg, rt = run.cfg, run.rt
    summary = dict(task=cfg["task"], depth=cfg["depth"], pretrain_epochs=results.pop("pretrain_epochs"),
                   epochs=cfg["epochs"], pretrain_task=cfg["pretrain_task"] or cfg["task"],
                   init_from=cfg["init_from"], init_params=cfg["init_params"], freeze=cfg["freeze"],
                   pos_enc=cfg["pos_enc"], pool=cfg["pool"], init=cfg["init"], pixel_encoder=cfg["pixel_encoder"],
                   **results, n_params=model.num_params(), world_size=rt.world_size)
    if rt.ddp:
        summary["replica_max_diff"] = replica_max_diff(model, rt)
    if not rt.master:
        return summary
    summary.update(analysis.stage_statistics(run.seen.reports), proximity=run.seen.reports)
    run.log.summary(summary)
    run.seen.plot(val_ds[0][0])
    print(f"best val acc {summary['best_val_acc']:.4f} (epoch {summary['best_epoch']}), test acc "
          f"{summary['test_acc']:.4f}; attention mass within |i-j|<=2: init {summary['mass_w2_init']:.3f}, final "
          f"{summary['mass_w2_finetune']:.3f} (uniform {summary['mass_w2_uniform']:.3f}); files in {cfg['out_dir']}")
    return summary


if __name__ == "__main__":
    run_cli(main)
