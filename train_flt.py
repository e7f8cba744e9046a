"""
Train a looped Transformer LM (looped.py) and record the stability diagnostics of "Simply
Stabilizing the Loop via a Fully Looped Transformer": gradient norms per (loop, block), residual
norms per loop, oscillation, collapse, the test-time loop curve. Recipes, checks: flt_settings.py.

  python train_flt.py --variant=FLT --n_loops=12 --n_layer=2   # byte LM on stdlib docstrings, the authors' recipe
  python train_flt.py --data=listops --optim=adamw             # ListOps (or a text file, or a train.bin/val.bin folder)
  torchrun --standalone --nproc_per_node=2 train_flt.py ...    # DDP (gloo on CPU, nccl on GPU)
  python train_flt.py --init_from=resume --out_dir=out/flt     # continue exactly where it stopped
  python train_flt.py --compare=out/a,out/b --out_dir=assets   # figures and tables of finished runs (flt_report.py)
  python train_flt.py --evaluate=out/flt --test_loops=24       # the test-time loop curve of a checkpoint

Read top to bottom: DEFAULTS, evaluate, the schedules, BlockGradRecorder, then main ->
setup -> train (THE loop) -> finish -> summarize (its statistics: flt_report.py). The run's
folder, log, resume point and stop on a signal are training.Run's.
"""

import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

import cost
import flt_report
from configurator import run_cli
from corpora import eval_set, get_batch, load_data, unigram_entropy
from flt_settings import get_config, resume_config
from looped import LoopedConfig, LoopedTransformer
from training import NonFiniteGuard, Run, Schedule, grad_sync, load_checkpoint, load_weights, setup_runtime, wrap

# -----------------------------------------------------------------------------
# Defaults: every key is a --key=value flag (--help lists them). The optimisation keys hold
# the authors' recipe; --optim=adamw switches every key of flt_settings.RECIPES["adamw"].

DEFAULTS = dict(
    out_dir="out/flt",
    data="stdlib",           # "stdlib" (docstrings of Python's standard library, bytes), "listops" (expressions
                             # and their values, loss on the answers), a text file (bytes), or a folder with
                             # train.bin/val.bin (uint16 ids)
    listops_depth=3,         # listops only: nesting depth of the expressions
    listops_examples=20000,  # listops only: distinct training expressions
    listops_val=2000,        # listops only: distinct held-out expressions, all of them the eval set
    data_dir="data/stdlib_docstrings",   # where the stdlib corpus is cached
    vocab_size=256,          # only for train.bin/val.bin folders; byte data always uses 256
    # model (looped.py)
    variant="FLT",           # LT, LT_i, LT_ia, FLT_res, FLT
    n_loops=12, n_layer=2, n_head=4, n_embd=128, ffn_mult=4, block_size=128,
    loss_type="END",         # END, STEP, FEW
    # optimisation
    optim="muon",            # muon: the authors' (Muon on the blocks, AdamW on embedding and head); adamw: a baseline
    batch_size=16,
    grad_accum=1,            # micro-batches per optimizer step (per rank)
    max_steps=400,
    lr=0.02,                 # muon: the block matrices' lr; adamw: the lr of everything
    embedding_lr=0.2,        # muon only: AdamW lr of the token embedding, times s = (n_embd / 768) ** -0.5
    unembedding_lr=0.004,    # muon only: AdamW lr of the lm head, times s
    lr_mult=1.0,             # multiplies every lr above (the stability map's lr axis)
    warmup_steps=0,
    schedule="warmdown",     # warmdown (flat, then linear to 0 over the last warmdown_frac), cosine, linear, constant
    warmdown_frac=0.2,
    min_lr_frac=0.1,         # cosine and linear only
    weight_decay=0.0, beta1=0.8, beta2=0.95, adam_eps=1e-10,
    qk_norm=True,            # model (looped.py): QK-norm after RoPE
    softcap=15.0,            # model: logit soft cap; 0 = none
    lm_head_std=1e-3,        # model: lm head init std; 0 = zero
    grad_clip=1.0,           # 0 = no clipping
    # evaluation, diagnostics, checkpoints
    eval_interval=100,       # val loss on the eval set every this many steps (the curve the collapse rule reads)
    eval_batches=20,         # byte/token data: the eval set is eval_batches * batch_size fixed windows
    osc_steps=200,           # N of the gradient volatility and oscillation statistics
    block_grads_every=1,     # log the per-(loop, block) gradient norms every N steps (0 = never; the statistics
                             # above read every step's total norm, never these)
    reference="",            # folder of a finished 1-loop run at the same lr and budget: enables the collapse rule
    test_loops=0,            # the test-time loop curve's length (0 = max(2 * n_loops, 12); at least n_loops)
    ckpt_interval=200,
    init_from="scratch",     # scratch or resume (from out_dir/ckpt.pt)
    stop_step=0,             # stop after this many steps (checkpointed), keeping max_steps' schedule; 0 = none
    sample_tokens=0,         # print a sample of this many bytes at the end (byte data)
    # system
    seed=1337,
    device="auto",           # auto, cpu, cuda, cuda:1, mps
    dtype="auto",            # auto (bfloat16 on a capable GPU, else float32), fast (the faster of the two here,
                             # timed on this run's model: cost.choose_dtype), float32, bfloat16
    compile=False,           # torch.compile the model
    compare="",              # DIR1,DIR2,...: draw the figures of finished runs into out_dir and exit (flt_report.py)
    evaluate="",             # DIR: print the test-time loop curve of the run in DIR (its ckpt.pt) and exit
    overwrite=False,         # replace the results of an earlier run in out_dir
    debug=False,             # show the traceback of a user error
)

MUON_MOMENTUM = (0.85, 0.95, 300)   # Muon momentum warmed linearly from 0.85 to 0.95 over 300 steps
EVAL_CHUNK = 256                    # eval-set windows per forward pass (memory, not results)


@torch.no_grad()
def evaluate(model, eval_xy, n_loops, rt):
    """The model read after every loop t = 1..n_loops on the fixed eval set (x, y)
    (corpora.eval_set), as lists of n_loops floats (the authors' wiki_ppl.py
    --check-norms / --check-logits read the same):
      loss           mean cross-entropy of loop t's logits over the scored positions
                     (targets >= 0); at t = K, the val loss
      accuracy       share of scored positions whose argmax is the target (ListOps:
                     the exact-match accuracy of the answers)
      logit_entropy  mean entropy (nats) of loop t's output distribution, scored positions
      hidden_norm    mean token L2 norm of x_L^(t), the residual stream before the
                     final norm, over every position (as the training log's residual_norms)"""
    model.eval()
    sums = {k: torch.zeros(n_loops, dtype=torch.float64) for k in ("loss", "accuracy", "logit_entropy", "hidden_norm")}
    n_scored = n_tokens = 0
    for i in range(0, len(eval_xy[0]), EVAL_CHUNK):
        x, y = (t[i:i + EVAL_CHUNK].to(rt.device) for t in eval_xy)
        scored = y >= 0
        with rt.autocast():
            for t, (h, x_L) in enumerate(model.loops(x, n_loops)):
                logp = F.log_softmax(model.logits(h)[scored], dim=-1)
                sums["loss"][t] += F.nll_loss(logp, y[scored], reduction="sum").item()
                sums["accuracy"][t] += (logp.argmax(-1) == y[scored]).sum().item()
                sums["logit_entropy"][t] += -(logp.exp() * logp).sum().item()
                sums["hidden_norm"][t] += x_L.float().norm(dim=-1).sum().item()
        n_scored, n_tokens = n_scored + scored.sum().item(), n_tokens + y.numel()
    model.train()
    return {k: (v / (n_tokens if k == "hidden_norm" else max(n_scored, 1))).tolist() for k, v in sums.items()}


# --- the recipe's schedules and the diagnostics ---------------------------------

def muon_momentum(it):
    """Muon's momentum at step it: 0.85 -> 0.95 linearly over the first 300 steps, then 0.95."""
    lo, hi, n = MUON_MOMENTUM
    return lo + (hi - lo) * min(it / n, 1.0)


def lr_multiplier(it, cfg):
    """The factor every base lr is multiplied by at step it (0-based): training.Schedule's
    (warmdown, the authors': flat, then linear to 0 over the last warmdown_frac)."""
    return Schedule(cfg["schedule"], cfg["max_steps"], cfg["warmup_steps"], cfg["min_lr_frac"],
                    cfg["warmdown_frac"]).lr(it, 1.0)


def set_schedules(optimizers, base_lrs, it, cfg):
    """Every group's lr = its base lr x lr_multiplier(it); Muon's momentum = muon_momentum(it)."""
    lr_now = lr_multiplier(it, cfg)
    for o, bases in zip(optimizers, base_lrs):
        for group, base in zip(o.param_groups, bases):
            group["lr"] = base * lr_now
            if isinstance(o, torch.optim.Muon):
                group["momentum"] = muon_momentum(it)


def grad_norm(parameters):
    """Total L2 norm of the gradients (what clip_grad_norm_ measures)."""
    norms = [p.grad.detach().norm() for p in parameters if p.grad is not None]
    return torch.stack(norms).norm() if norms else torch.zeros(())


class BlockGradRecorder:
    """The gradient norm of three outputs per (loop, block), as the authors'
    base_check.py logs them: the block's output ("out"), its attention's ("attn")
    and its MLP's ("mlp"). A forward hook on each of these modules registers, on
    the output y of its call in loop t (a module runs once per loop, so its call
    count gives t), a tensor hook that adds ||dL/dy||_2 over the whole micro-batch.
    norms() gives, per kind, n_loops lists of n_layer numbers averaged over the
    micro-batches; this rank's gradients (before any DDP averaging). Forwards
    without grad are skipped; with --compile nothing is recorded (enabled=False;
    the hooks would break the graph)."""

    KINDS = ("out", "attn", "mlp")

    def __init__(self, blocks, enabled=True):
        self.sums, self.enabled = None, enabled
        for i, block in enumerate(blocks):
            for kind, module in zip(self.KINDS, (block, block.attn, block.mlp)):
                module.register_forward_hook(lambda m, args, out, key=(kind, i): self._forward(key, out))

    def start(self, n_loops, n_layer, on=True):   # before each step; on=False: nothing this step
        self.sums = {k: np.zeros((n_loops, n_layer)) for k in self.KINDS} if self.enabled and on else None

    def next_micro(self):                      # before each micro-batch's forward
        self.calls = {}

    def _forward(self, key, out):
        if self.sums is None or not (torch.is_grad_enabled() and out.requires_grad):
            return
        kind, i = key
        t = self.calls.get(key, 0)
        self.calls[key] = t + 1
        if t < len(self.sums[kind]):
            out.register_hook(lambda g: self._add(kind, t, i, g))

    def _add(self, kind, t, i, g):
        self.sums[kind][t, i] += g.norm().item()

    def norms(self, n_micro):
        """{kind: n_loops lists of n_layer numbers}; {} when nothing is recorded."""
        if self.sums is None:
            return {}
        return {k: [[round(v / n_micro, 6) for v in row] for row in self.sums[k]] for k in self.KINDS}


# --- the run: set up, train, finish -------------------------------------------------------

def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    cfg = get_config(DEFAULTS, argv, __doc__)                   # one-line errors before any work
    if cfg["compare"]:
        return flt_report.compare(cfg["compare"].split(","), cfg["out_dir"] or None)
    if cfg["evaluate"]:
        return evaluate_checkpoint(cfg["evaluate"], cfg["test_loops"], cfg["device"])
    # The run folder: a run refuses an out_dir that holds another run's results (--overwrite=True
    # replaces them) and writes nothing there until its flags, data and model have been checked.
    with Run(cfg, "train_flt.py", argv, resume_config) as run:
        raw, optimizers, base_lrs, data = setup(run)
        nan_stop = train(run, raw, optimizers, base_lrs, data)
        return finish(run, raw, data, nan_stop)


def model_args(cfg):
    """looped.LoopedConfig's arguments from the flags (byte data: 256 tokens)."""
    byte_data = cfg["data"] == "stdlib" or not os.path.isdir(cfg["data"])
    return dict(vocab_size=256 if byte_data else cfg["vocab_size"], **{k: cfg[k] for k in (
        "block_size", "n_layer", "n_loops", "n_head", "n_embd", "ffn_mult", "variant", "loss_type", "qk_norm",
        "softcap", "lm_head_std")})


def setup(run):
    """Check the data and the model; build the model and the optimizers (restored from
    ckpt.pt with --init_from=resume); only then claim out_dir and start the log.
    Returns (model, optimizers, their base lrs, data: train, eval_xy, vocab, is_bytes)."""
    cfg, rt = run.cfg, run.rt
    LoopedConfig(**model_args(cfg))                  # refuses bad model flags before the data is read
    train, val, vocab, is_bytes = load_data_rank0_first(cfg, rt)
    run.fingerprint(train)                                           # resume: the same data
    raw = LoopedTransformer(LoopedConfig(**model_args(cfg))).to(rt.device)
    optimizers = build_optimizers(raw, cfg, rt)
    base_lrs = [[cfg["lr_mult"] * g["lr"] for g in o.param_groups] for o in optimizers]  # the flags, also on resume
    if run.ckpt:
        run.restore(raw, optimizers)                                 # weights, optimizers, RNG
    step = run.ckpt["step"] if run.ckpt else 0
    x, y = get_batch(train, cfg, 0, 0, rt.rank, device=rt.device)
    cost.choose_dtype(run, raw, lambda: raw(x, y)[1])                # --dtype=fast
    run.begin(keep=lambda r: r.get("step", 0) <= step, at=dict(step=step))   # checks done: write
    run.say(f"device {rt.device} ({rt.ptdtype}), world size {rt.world_size}; data: {len(train):,} train / "
            f"{len(val):,} val {'bytes' if is_bytes else 'tokens'}; {cfg['variant']} x{cfg['n_loops']} loops, "
            f"{raw.num_params():,} parameters" + (f"; resuming at step {step}" if step else ""))
    return raw, optimizers, base_lrs, dict(train=train, eval_xy=eval_set(val, cfg), vocab=vocab, is_bytes=is_bytes)


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


def build_optimizers(raw, cfg, rt):
    """The recipe's optimizers: [AdamW, Muon] for --optim=muon, [AdamW] for adamw."""
    betas = (cfg["beta1"], cfg["beta2"])
    if cfg["optim"] == "muon":
        return raw.configure_muon(cfg["lr"], cfg["embedding_lr"], cfg["unembedding_lr"], betas, cfg["adam_eps"],
                                  cfg["weight_decay"], rt.device_type)
    return [raw.configure_optimizers(cfg["weight_decay"], cfg["lr"], betas, cfg["adam_eps"], rt.device_type)]


def train(run, raw, optimizers, base_lrs, data):
    """THE training loop, from the resume point's step to max_steps (or --stop_step). One
    step: set the scheduled lr and momentum; per micro-batch, a batch, the forward pass
    and its loss, the backward pass; the gradient norm; clipping; the optimizer steps.
    Around it: diagnostics logged every step, val loss every eval_interval steps, a
    checkpoint every ckpt_interval. Returns the step whose loss or gradient was NaN/inf
    (the run stops there, nothing of that step kept), or None."""
    cfg, rt = run.cfg, run.rt
    model = wrap(raw, rt, cfg["compile"])                             # DDP, torch.compile
    params = [p for p in raw.parameters() if p.requires_grad]
    n_loops, n_micro = cfg["n_loops"], cfg["grad_accum"]
    done = first = run.ckpt["step"] if run.ckpt else 0
    last_step = min(cfg["max_steps"], cfg["stop_step"]) if cfg["stop_step"] > 0 else cfg["max_steps"]
    guard, t0 = NonFiniteGuard(run, cfg["variant"]), time.time()
    run.saver = lambda: run.save_resume(raw, optimizers, step=done)   # Ctrl-C or SIGTERM: save, then stop
    pbar = tqdm(range(first, last_step), initial=first, total=last_step, disable=not rt.master, desc=cfg["variant"])
    recorder = BlockGradRecorder(raw.blocks, enabled=not cfg["compile"])
    for it in pbar:
        set_schedules(optimizers, base_lrs, it, cfg)
        loss_sum, res_norms = 0.0, torch.zeros(n_loops, device=rt.device)
        recorder.start(n_loops, len(raw.blocks), on=cfg["block_grads_every"] > 0 and it % cfg["block_grads_every"] == 0)
        for micro in range(n_micro):
            # a pure function of (seed, step, micro-step, rank): a resumed run draws the same batches
            x, y = get_batch(data["train"], cfg, it, micro, rt.rank, device=rt.device)
            recorder.next_micro()
            with grad_sync(model, rt, last_micro=micro == n_micro - 1), rt.autocast():
                _, loss, stats = model(x, y, return_stats=True)         # forward: loss on the chosen loops
            (loss / n_micro).backward()                                 # backward
            loss_sum += loss.item() / n_micro
            res_norms += stats["residual_norms"] / n_micro
        loss_now, res_norms = mean_over_ranks(loss_sum, res_norms, rt)
        g_total = grad_norm(params).item()                              # before clipping
        stream = math.inf if not torch.isfinite(res_norms).all() else g_total   # an inf residual stream too
        try:                                                            # NaN or inf: stop before the update
            guard.record(torch.tensor(loss_now), torch.tensor(stream), it + 1)
            guard.check()
        except FloatingPointError as e:
            run.say(f"stopping: the loss is {loss_now}, the gradient norm {g_total} and the residual norms "
                    f"{res_norms.tolist()}: the run diverged. {e}")
            return it + 1
        block_norms = [grad_norm(b.parameters()).item() for b in raw.blocks]
        if cfg["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(params, cfg["grad_clip"])    # clip
        for o in optimizers:
            o.step()                                                    # update
            o.zero_grad(set_to_none=True)
        done = it + 1
        # log.jsonl, one record per step. residual_norms: per loop t, the mean over tokens of
        # ||x_L^(t)||_2, the residual stream after the last block of loop t, before the final norm;
        # {out,attn,mlp}_grad_norms: BlockGradRecorder's, per (loop, block)
        run.log(step=done, loss=loss_now, lr=cfg["lr"] * cfg["lr_mult"] * lr_multiplier(it, cfg),
                grad_norm=g_total, block_grad_norms=block_norms,
                residual_norms=[round(v, 4) for v in res_norms.tolist()],
                **{f"{k}_grad_norms": v for k, v in recorder.norms(n_micro).items()})
        pbar.set_postfix(loss=f"{loss_now:.3f}", res=f"{res_norms[-1].item():.1f}")
        if done - first == 5:
            per_step = (time.time() - t0) / 5
            run.say(f"{per_step:.2f} s/step; ETA {per_step * (last_step - done) / 60:.1f} min "
                    f"for {last_step - done} more steps")
        if done % cfg["eval_interval"] == 0 or done == cfg["max_steps"]:      # the val curve, on the fixed eval set
            ev = evaluate(raw, data["eval_xy"], n_loops, rt)
            run.log(step=done, val_loss=ev["loss"][-1],
                    **({"val_accuracy": ev["accuracy"][-1]} if cfg["data"] == "listops" else {}))
        if done % cfg["ckpt_interval"] == 0 or done == last_step:
            run.save_resume(raw, optimizers, step=done)
        run.tick()                                                      # a signal stops here
    pbar.close()
    run.saver = None
    return None


def mean_over_ranks(loss, res_norms, rt):
    """The step's loss (float) and per-loop residual norms (tensor), averaged over
    DDP ranks (unchanged without DDP)."""
    if not rt.ddp:
        return loss, res_norms
    t = torch.tensor([loss], dtype=torch.float64, device=rt.device)
    dist.all_reduce(t)
    dist.all_reduce(res_norms)
    return t.item() / rt.world_size, res_norms / rt.world_size


def finish(run, raw, data, nan_stop):
    """After the loop: a run halted by --stop_step just says how to continue. A run
    that ended (at max_steps, or stopped by a NaN) gets summary.json, its figures
    and, on byte data with --sample_tokens, a sample. Returns the summary (None when halted)."""
    cfg, rt = run.cfg, run.rt
    if nan_stop is None and 0 < cfg["stop_step"] < cfg["max_steps"]:
        run.say(f"stopped at step {cfg['stop_step']} (--stop_step); continue with --init_from=resume")
        return None
    summary = summarize(run, raw, data, nan_stop)
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


def summarize(run, raw, data, nan_stop):
    """summary.json: what a table of runs needs, computed from log.jsonl (so a
    resumed run is summarised over its whole history) and one final evaluation on
    the eval set, read at 1..n_test inference loops (the test-time loop curve)."""
    cfg, rt, K = run.cfg, run.rt, run.cfg["n_loops"]
    records = flt_report.read_log(cfg["out_dir"]) if rt.master else []
    steps = [rec for rec in records if "loss" in rec]
    val = flt_report.val_curve(records)
    tail = steps[len(steps) - max(1, len(steps) // 10):]
    final_train = float(np.mean([rec["loss"] for rec in tail])) if tail else float("nan")
    # H: the entropy (nats/token) of the training data's unigram distribution, the loss of a
    # model that ignores context
    h_unigram = unigram_entropy(data["train"], data["vocab"])
    # the test-time loop curve: the trained model read after 1, 2, ..., n_test inference loops, default
    # max(2K, 12), so it covers the authors' budgets 1, 3, 6, 9, 12 and 2K (evaluate() says what is read)
    n_test = max(cfg["test_loops"] or max(2 * K, 12), K)
    curve = evaluate(raw, data["eval_xy"], n_test, rt) if nan_stop is None else {}
    # diverged: the loss or gradient became NaN/inf ("nan"), or the run plateaued at the context-free
    # level ("plateau"): the mean train loss over the last 10% of steps (at least the last one) >= 0.95 H
    reason = "nan" if nan_stop is not None else ("plateau" if final_train >= 0.95 * h_unigram else None)
    out = {
        "variant": cfg["variant"], "n_loops": K, "n_layer": cfg["n_layer"], "n_embd": cfg["n_embd"],
        "loss_type": cfg["loss_type"], "params": raw.num_params(), "steps": len(steps),
        "final_train_loss": final_train,
        "min_train_loss": float(min(rec["loss"] for rec in steps)) if steps else float("nan"),
        "final_val_loss": curve["loss"][K - 1] if curve else float("nan"),
        "val_steps": sorted(val), "val_curve": [val[k] for k in sorted(val)],
        "eval_set_size": len(data["eval_xy"][0]),
        "unigram_entropy": h_unigram,
        **flt_report.gradient_statistics([rec["grad_norm"] for rec in steps[:cfg["osc_steps"]]]),
        **flt_report.residual_statistics(steps, K),
        "diverged": reason is not None, "diverged_reason": reason, "nan_step": nan_stop,
        "test_loops": list(range(1, len(curve.get("loss", [])) + 1)), "test_val_loss": curve.get("loss", []),
        "test_hidden_norm": curve.get("hidden_norm", []), "test_logit_entropy": curve.get("logit_entropy", []),
        **({"final_val_accuracy": curve["accuracy"][K - 1] if curve else float("nan"),
            "test_val_accuracy": curve.get("accuracy", [])} if cfg["data"] == "listops" else {}),
        "wall_time_s": round(run.elapsed(), 1),
    }
    if cfg["reference"]:                            # the 1-loop reference run, checked at the start
        out.update(flt_report.collapse_fields(cfg["reference"], val, out["final_val_loss"], h_unigram))
    if data["is_bytes"]:
        out["final_val_bpb"] = out["final_val_loss"] / math.log(2)
    return out


def evaluate_checkpoint(run_dir, test_loops=0, device="auto"):
    """--evaluate: the test-time loop curve of a finished run, from its ckpt.pt and
    config: evaluate() on the run's eval set at 1..test_loops loops (0 = max(2K, 12)).
    Prints one line per loop count and returns the dict of lists. Writes nothing."""
    ckpt = load_checkpoint(os.path.join(run_dir, "ckpt.pt"))
    cfg = ckpt["config"]
    if "variant" not in cfg:
        raise ValueError(f"--evaluate={run_dir} is not a run of train_flt.py (its checkpoint has no looped model); "
                         f"evaluate only train_flt.py runs")
    missing = [k for k in DEFAULTS if k not in cfg]
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


if __name__ == "__main__":
    result = run_cli(main)
    sys.exit(2 if isinstance(result, dict) and result.get("diverged_reason") == "nan" else 0)
