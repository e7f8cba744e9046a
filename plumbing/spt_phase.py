"""
The bookkeeping around train_spt.py's loop, so that the script shows only the loop
(batch -> loss -> backward -> clip -> update) and the objectives:

  PhaseLedger     one phase's plan (epochs, lr, schedule), counters, progress bar, log
                  lines, best checkpoint and resume point; written_before: which records
                  an interrupted run keeps when it resumes
  rank_batches    an epoch's micro-batches, the same on resume and on any number of GPUs
  micro_row       the first row of a micro-batch in its step's batch (examples and masks)
"""

import math
import os
import time

import torch
from tqdm import tqdm

import analysis
from plumbing.training import NonFiniteGuard, Schedule

# The batch order's stream, one of train_spt.py's seeded streams (its "Seeds" comment).
BATCH_SEED_STRIDE = 100_003   # a prime above 2 x any epoch count: (seed, epoch, phase) never collide
PHASES = ("spt", "finetune")


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
    """The first row of this rank's micro-batch k in its step's batch: its examples, its mask rows."""
    return (k * rt.world_size + rt.rank) * cfg["batch_size"]


class PhaseLedger:
    """One phase's plan and state, and the bookkeeping around its loop: the batches of
    each epoch (a resumed run sees the same ones), the log after a step, the best
    checkpoint at an epoch's end, the resume point. p.state holds epoch, step and the
    best val metric so far (best_metric: SPT's lowest val loss, finetuning's highest val
    accuracy) with its epoch."""

    def __init__(self, name, run, n_train):
        cfg, rt = run.cfg, run.rt
        self.name, self.spt, self.run, self.n_train = name, name == "spt", run, n_train
        self.global_batch = cfg["batch_size"] * cfg["grad_accum"] * rt.world_size
        self.epochs = cfg["pretrain_epochs"] if self.spt else cfg["epochs"]
        self.steps_per_epoch = n_train // self.global_batch
        self.total_steps = self.epochs * self.steps_per_epoch
        warmup = cfg["pretrain_warmup_steps" if self.spt else "warmup_steps"] or \
            int(cfg["warmup_frac"] * self.total_steps)
        self.lr = (cfg["pretrain_lr"] or cfg["lr"]) if self.spt else cfg["lr"]
        self.schedule = Schedule((cfg["pretrain_schedule"] or cfg["schedule"]) if self.spt else cfg["schedule"],
                                 self.total_steps, warmup)
        self.state = dict(epoch=0, step_in_epoch=0, step=0, best_metric=None, best_epoch=-1, bad_epochs=0)
        self.guard = NonFiniteGuard(run, name)
        self.best_path = os.path.join(cfg["out_dir"], f"{name}_best.pt")
        self.rng = None

    def attach(self, model, optimizer, mask_gen, val_ds):
        """The objects the resume point holds, restored from ckpt.pt when this phase resumes;
        prints the phase's header line."""
        run = self.run
        self.model, self.optimizer, self.mask_gen, self.val_ds = model, optimizer, mask_gen, val_ds
        if run.ckpt and run.ckpt["phase"] == self.name:                  # continue from ckpt.pt
            run.restore(model, [optimizer], rng=False)                   # epoch_batches sets the RNG
            if "best" in run.ckpt:            # written before best_metric: SPT's "best" was minus its loss
                run.ckpt["best_metric"] = run.ckpt["best"] if run.ckpt["best"] is None or not self.spt \
                    else -run.ckpt["best"]
            self.state.update({k: run.ckpt[k] for k in self.state})
            mask_gen.set_state(run.ckpt["mask_gen"])
            self.rng = run.ckpt["rng"]
        if run.rt.master:
            print(f"[{self.name}] {self.n_train} train / {len(val_ds)} val examples, {self.epochs} epochs "
                  f"x {self.steps_per_epoch} steps, lr {self.lr:g}, "
                  f"{sum(p.numel() for p in model.parameters() if p.requires_grad):,} trainable parameters", flush=True)
        self.t0 = time.time()
        run.saver = self.save                        # Ctrl-C or SIGTERM: save the resume point, then stop
        return [p for p in model.parameters() if p.requires_grad]

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

    def end_of_epoch(self, evaluate):
        """Close the epoch: metrics = evaluate(); keep the best weights (SPT: lowest val
        loss; finetuning: highest val accuracy) and the SPT weights after the epochs in
        --save_epochs; save ckpt.pt. True: stop (early stopping, or the wall-time cap)."""
        cfg, rt, state = self.run.cfg, self.run.rt, self.state
        self.bar.close()
        epoch = state["epoch"] + 1
        self.guard.check()
        metrics = evaluate()
        if not math.isfinite(metrics["loss"]):
            self.guard.mark(state["step"])
            self.guard.check()                                           # a NaN val loss is never "best"
        metric, best = metrics["loss"] if self.spt else metrics["acc"], state["best_metric"]
        improved = best is None or (metric < best if self.spt else metric > best)
        state.update(epoch=epoch, step_in_epoch=0, bad_epochs=0 if improved else state["bad_epochs"] + 1)
        self.run.log(phase=self.name, step=state["step"], epoch=epoch, val_loss=metrics["loss"],
                     val_acc=metrics["acc"], **({} if self.spt else {"val_loss_se": metrics["loss_se"]}))
        if improved:
            state.update(best_metric=metric, best_epoch=epoch)
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

    @staticmethod
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
