"""
What train_flt.py's run does around its loop, so that the script shows the loop
(batch -> loss -> backward -> clip -> update) and the evaluation:

  load_data_rank0_first  corpora.load_data, rank 0 before the other DDP ranks
  StepLedger             the steps to run, progress bar, NaN guard, ETA, checkpoints, signals
  finish                 summary.json (train_flt.summarize), the last line, a sample, the figures
  evaluate_checkpoint    --evaluate: the test-time loop curve of a finished run
"""

import json
import math
import os
import time

import torch
import torch.distributed as dist
from tqdm import tqdm

from corpora import eval_set, load_data
from looped import LoopedConfig, LoopedTransformer
from plumbing import flt_report
from plumbing.flt_settings import model_args
from plumbing.training import NonFiniteGuard, load_checkpoint, load_weights, setup_runtime

def load_data_rank0_first(cfg, rt):
    """corpora.load_data, run by rank 0 before the other DDP ranks (it may build a
    cache they then read). Refuses byte or token streams too short for one window."""
    if rt.ddp and not rt.master:
        dist.barrier()
    train, val, vocab, is_bytes = load_data(cfg)
    if rt.ddp and rt.master:
        dist.barrier()
    if train.ndim == 1 and min(len(train), len(val)) <= cfg["block_size"] + 1:
        raise ValueError(f"the data is too short for block_size={cfg['block_size']}: "
                         f"{len(train)} train and {len(val)} val tokens")
    return train, val, vocab, is_bytes


# --- the loop's bookkeeping --------------------------------------------------------------

class StepLedger:
    """The steps to run (resume point to max_steps or --stop_step), with a progress bar;
    mean_over_ranks(): a step's loss and residual norms over DDP ranks;
    diverged(): a NaN or inf, stop before the update; logged(): count the step, ETA;
    end_of_step(): ckpt.pt every ckpt_interval steps, a stop signal stops here."""

    def __init__(self, run, raw, optimizers):
        cfg, rt = run.cfg, run.rt
        self.run, self.raw, self.optimizers = run, raw, optimizers
        self.done = self.first = run.ckpt["step"] if run.ckpt else 0
        self.last = min(cfg["max_steps"], cfg["stop_step"]) if cfg["stop_step"] > 0 else cfg["max_steps"]
        self.guard, self.t0 = NonFiniteGuard(run, cfg["variant"]), time.time()
        run.saver = lambda: run.save_resume(raw, optimizers, step=self.done)   # Ctrl-C or SIGTERM: save, stop
        self.bar = tqdm(range(self.first, self.last), initial=self.first, total=self.last, disable=not rt.master,
                        desc=cfg["variant"])

    def __iter__(self):
        yield from self.bar
        self.bar.close()
        self.run.saver = None

    def diverged(self, it, loss, g_total, res_norms):
        """True when the step's loss, gradient norm or residual stream is NaN or inf: the
        run stops there, before the update, and says so."""
        stream = math.inf if not torch.isfinite(res_norms).all() else g_total   # an inf residual stream too
        try:
            self.guard.record(torch.tensor(loss), torch.tensor(stream), it + 1)
            self.guard.check()
        except FloatingPointError as e:
            self.run.say(f"stopping: the loss is {loss}, the gradient norm {g_total} and the residual norms "
                         f"{res_norms.tolist()}: the run diverged. {e}")
            return True
        return False

    def logged(self, loss, res_norms):
        """The step is done: count it, show it on the bar, print the ETA after 5 steps."""
        self.done += 1
        self.bar.set_postfix(loss=f"{loss:.3f}", res=f"{res_norms[-1].item():.1f}")
        if self.done - self.first == 5:
            per_step = (time.time() - self.t0) / 5
            self.run.say(f"{per_step:.2f} s/step; ETA {per_step * (self.last - self.done) / 60:.1f} min "
                         f"for {self.last - self.done} more steps")
        return self.done

    def end_of_step(self):
        """ckpt.pt every ckpt_interval steps and at the last; a signal stops the run here."""
        if self.done % self.run.cfg["ckpt_interval"] == 0 or self.done == self.last:
            self.run.save_resume(self.raw, self.optimizers, step=self.done)
        self.run.tick()

    def mean_over_ranks(self, loss, res_norms):
        """The step's loss (float) and per-loop residual norms (tensor), averaged over
        DDP ranks (unchanged without DDP)."""
        rt = self.run.rt
        if not rt.ddp:
            return loss, res_norms
        t = torch.tensor([loss], dtype=torch.float64, device=rt.device)
        dist.all_reduce(t)
        dist.all_reduce(res_norms)
        return t.item() / rt.world_size, res_norms / rt.world_size


# --- after the loop ----------------------------------------------------------------------

def finish(run, raw, data, nan_stop, evaluate, summarize):
    """After the loop: a run halted by --stop_step just says how to continue. A run
    that ended (at max_steps, or stopped by a NaN) gets summary.json (train_flt.summarize's,
    with the test-time loop curve read by `evaluate`), its last line (the outcome), its
    figures and, on byte data with --sample_tokens, a sample. Returns the summary (None
    when halted)."""
    cfg, rt = run.cfg, run.rt
    if nan_stop is None and 0 < cfg["stop_step"] < cfg["max_steps"]:
        run.say(f"stopped at step {cfg['stop_step']} (--stop_step); continue with --init_from=resume")
        return None
    # the test-time loop curve: the trained model read after 1, 2, ..., n_test inference loops, default
    # max(2K, 12), so it covers the authors' budgets 1, 3, 6, 9, 12 and 2K
    n_test = max(cfg["test_loops"] or max(2 * cfg["n_loops"], 12), cfg["n_loops"])
    curve = evaluate(raw, data["eval_xy"], n_test, rt) if nan_stop is None else {}
    records = flt_report.read_run_log(cfg["out_dir"]) if rt.master else []     # the whole run, resumed or not
    summary = summarize(run, raw, data, nan_stop, curve, records)
    if rt.ddp:
        summary["ddp_replicas_identical"] = run.replica_max_diff(raw) == 0.0
    run.write_summary(summary)
    if rt.master:
        run.say(json.dumps({k: v for k, v in summary.items() if not isinstance(v, list)}))
        run.say(flt_report.verdict_line(summary))
        if data["is_bytes"] and cfg["sample_tokens"] and nan_stop is None:
            prompt = torch.tensor([list(b"The ")], device=rt.device)
            out = raw.generate(prompt, cfg["sample_tokens"], temperature=0.8, top_k=40)[0].tolist()
            run.say(bytes(out).decode("utf-8", errors="replace"))
        flt_report.plot_runs([cfg["out_dir"]], cfg["out_dir"], quiet=True)
    return summary


def evaluate_checkpoint(run_dir, test_loops, device, evaluate, defaults):
    """--evaluate: the test-time loop curve of a finished run, from its ckpt.pt and
    config: evaluate() on the run's eval set at 1..test_loops loops (0 = max(2K, 12)).
    Prints one line per loop count and returns the dict of lists. Writes nothing."""
    ckpt = load_checkpoint(os.path.join(run_dir, "ckpt.pt"))
    cfg = ckpt["config"]
    if "variant" not in cfg:
        raise ValueError(f"--evaluate={run_dir} is not a run of train_flt.py (its checkpoint has no looped model); "
                         f"evaluate only train_flt.py runs")
    missing = [k for k in defaults if k not in cfg]
    if missing:
        raise ValueError(f"--evaluate={run_dir} was written by an older train_flt.py (its config has no "
                         f"{', '.join(missing)}); train it again to evaluate it")
    rt = setup_runtime(device, "float32", cfg["seed"])
    model = LoopedTransformer(LoopedConfig(**model_args(cfg))).to(rt.device)
    load_weights(model, ckpt["model"])
    _, val, _, _ = load_data(cfg)
    n_test = max(test_loops or max(2 * cfg["n_loops"], 12), 1)
    curve = evaluate(model, eval_set(val, cfg), n_test, rt)
    print(f"{run_dir}: {cfg['variant']} trained at K={cfg['n_loops']}, step {ckpt['step']}; per inference loop count:")
    for t in range(n_test):
        print(f"  {t + 1:3d} loops: loss {curve['loss'][t]:.4f}  accuracy {curve['accuracy'][t]:.4f}  "
              f"entropy {curve['logit_entropy'][t]:.4f}  hidden norm {curve['hidden_norm'][t]:.2f}")
    return curve
