"""
Train a looped Transformer LM (looped.py) and record the stability diagnostics of "Simply
Stabilizing the Loop via a Fully Looped Transformer": gradient norms per (loop, block), residual
norms per loop, oscillation, the run's outcome, the test-time loop curve.

  python train_flt.py --variant=FLT --n_loops=12 --n_layer=2   # byte LM on stdlib docstrings, the authors' recipe
  python train_flt.py --data=listops --optim=adamw             # ListOps (or a text file, or a train.bin/val.bin folder)
  torchrun --standalone --nproc_per_node=2 train_flt.py ...    # DDP (gloo on CPU, nccl on GPU)
  python train_flt.py --init_from=resume --out_dir=out/flt     # continue exactly where it stopped
  python train_flt.py --compare=out/a,out/b --out_dir=assets   # figures and tables of finished runs (plumbing/flt_report.py)
  python train_flt.py --evaluate=out/flt --test_loops=24       # the test-time loop curve of a checkpoint

Read top to bottom: DEFAULTS, the recipe (RECIPES, the optimizers and their schedules),
evaluate, then main -> setup -> train (THE loop). The measurements it records are
stability.py's (BlockGradRecorder; the statistics and `outcome`, the one rule that the
last line and summary.json state); the run's folder, log, resume point and summary are
the plumbing's (plumbing/training.py, plumbing/flt_run.py; the flag checks flt_settings.py).
"""

import math
import sys

import numpy as np
import torch
import torch.nn.functional as F

from configurator import run_cli
from corpora import eval_set, get_batch, unigram_entropy
from looped import LoopedConfig, LoopedTransformer
from plumbing import cost, flt_report
from plumbing.flt_run import StepLedger, evaluate_checkpoint, finish, load_data_rank0_first
from plumbing.flt_settings import get_config, model_args, resume_config
from plumbing.training import Run, Schedule, grad_sync, wrap
from stability import BlockGradRecorder, grad_norm, gradient_statistics, judge_curves, residual_statistics

# -----------------------------------------------------------------------------
# The flags that shape the experiment, each a --key=value flag (--help lists them). Their
# values are the authors' recipe, which the bare command runs (--optim=muon); --optim=adamw
# replaces the keys of RECIPES["adamw"] below. The run's plumbing flags (out_dir, device,
# checkpoints, --compare, --evaluate) are flt_settings.RUN_DEFAULTS: they change no result.

DEFAULTS = dict(
    data="stdlib",           # "stdlib" (docstrings of Python's standard library, bytes), "listops" (expressions and
                             # their values, loss on the answers), a text file (bytes), or a train.bin/val.bin folder
    listops_depth=3, listops_examples=20000, listops_val=2000,   # listops only: nesting depth, distinct
                             # training expressions, distinct held-out ones (all of them the eval set)
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
    # evaluation and diagnostics
    eval_interval=100,       # val loss on the eval set every this many steps (the curve stability.outcome reads)
    eval_batches=20,         # byte/token data: the eval set is eval_batches * batch_size fixed windows
    osc_steps=200,           # N of the gradient volatility and oscillation statistics
    reference="",            # folder of a finished 1-loop run at the same lr and budget: outcome judges against it
    test_loops=0,            # the test-time loop curve's length (0 = max(2 * n_loops, 12); at least n_loops)
    seed=1337,
)

# -----------------------------------------------------------------------------
# The recipe, all of it here: the optimizers, their learning rates, the schedules.
#   muon   the authors' (FuRuF-11/FullyLoopedTransformer, built on nanochat's setup_optimizers):
#          DEFAULTS' values. Muon (Nesterov) on every matrix of the blocks at lr; AdamW (betas
#          0.8, 0.95, eps 1e-10) on the token embedding at embedding_lr * s and on the lm head at
#          unembedding_lr * s, s = (n_embd / 768) ** -0.5 (their lrs were tuned at width 768);
#          Muon's momentum 0.85 -> 0.95 over the first 300 steps; no weight decay, no warmup, a
#          flat lr then linear to 0 over the last 20% of steps; the model with QK-norm, logit
#          softcap 15 and the lm head drawn from N(0, 1e-3^2).
#   adamw  a plain baseline: one AdamW at lr 3e-3 for every weight, 40 warmup steps then cosine,
#          weight decay 0.1 on the matrices but the embedding; and it changes the MODEL: no
#          QK-norm, no softcap, a zero lm head (looped.py's plain pre-norm Transformer).
RECIPES = {
    "muon": {},
    "adamw": dict(lr=3e-3, warmup_steps=40, schedule="cosine", weight_decay=0.1, beta1=0.9, adam_eps=1e-8,
                  qk_norm=False, softcap=0.0, lm_head_std=0.0),
}
MUON_MOMENTUM = (0.85, 0.95, 300)   # Muon's momentum, warmed linearly from 0.85 to 0.95 over 300 steps


def build_optimizers(model, cfg, device_type):
    """The recipe's optimizers: [AdamW, Muon] for --optim=muon, [AdamW] for adamw. Their
    lrs here are the base lrs that set_schedules scales every step."""
    betas, fused = (cfg["beta1"], cfg["beta2"]), device_type == "cuda"
    if cfg["optim"] == "adamw":
        return [model.configure_optimizers(cfg["weight_decay"], cfg["lr"], betas, cfg["adam_eps"], device_type)]
    s = (cfg["n_embd"] / 768) ** -0.5                                  # the width scale of the AdamW lrs
    adamw = torch.optim.AdamW([{"params": [model.lm_head.weight], "lr": cfg["unembedding_lr"] * s},
                               {"params": [model.tok_emb.weight], "lr": cfg["embedding_lr"] * s}],
                              betas=betas, eps=cfg["adam_eps"], weight_decay=cfg["weight_decay"], fused=fused)
    muon = torch.optim.Muon(model.blocks.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"],
                            momentum=MUON_MOMENTUM[1], nesterov=True)     # momentum: muon_momentum, each step
    return [adamw, muon]


def muon_momentum(it):
    """Muon's momentum at step it: 0.85 -> 0.95 linearly over the first 300 steps, then 0.95."""
    lo, hi, n = MUON_MOMENTUM
    return lo + (hi - lo) * min(it / n, 1.0)


def lr_multiplier(it, cfg):
    """The factor every base lr is multiplied by at step it (0-based), training.Schedule's:
    warmdown (the authors': flat, then linear to 0 over the last warmdown_frac), or cosine
    or linear after warmup_steps."""
    return Schedule(cfg["schedule"], cfg["max_steps"], cfg["warmup_steps"], cfg["min_lr_frac"],
                    cfg["warmdown_frac"]).lr(it, 1.0)


def set_schedules(optimizers, base_lrs, it, cfg):
    """Every group's lr = its base lr x lr_multiplier(it); Muon's momentum = muon_momentum(it).
    Returns the lr of the block matrices at this step (the one the log records)."""
    lr_now = lr_multiplier(it, cfg)
    for o, bases in zip(optimizers, base_lrs):
        for group, base in zip(o.param_groups, bases):
            group["lr"] = base * lr_now
            if isinstance(o, torch.optim.Muon):
                group["momentum"] = muon_momentum(it)
    return cfg["lr"] * cfg["lr_mult"] * lr_now


# -----------------------------------------------------------------------------
# The model read after every loop

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


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    cfg = get_config(DEFAULTS, RECIPES, argv, __doc__)                 # one-line errors before any work
    if cfg["compare"]:
        return flt_report.compare(cfg["compare"].split(","), cfg["out_dir"] or None)
    if cfg["evaluate"]:
        return evaluate_checkpoint(cfg["evaluate"], cfg["test_loops"], cfg["device"], evaluate, DEFAULTS)
    # The run folder: a run refuses an out_dir that holds another run's results (--overwrite=True
    # replaces them) and writes nothing there until its flags, data and model have been checked.
    with Run(cfg, "train_flt.py", argv, resume_config) as run:
        raw, optimizers, base_lrs, data = setup(run)
        nan_stop = train(run, raw, optimizers, base_lrs, data)
        return finish(run, raw, data, nan_stop, evaluate, summarize)   # summary.json, the outcome


def setup(run):
    """Check the data and the model; build the model and the optimizers (restored from
    ckpt.pt with --init_from=resume); only then claim out_dir and start the log.
    Returns (model, optimizers, their base lrs, data: train, eval_xy, vocab, is_bytes)."""
    cfg, rt = run.cfg, run.rt
    LoopedConfig(**model_args(cfg))                  # refuses bad model flags before the data is read
    train, val, vocab, is_bytes = load_data_rank0_first(cfg, rt)
    run.fingerprint(train)                                           # resume: the same data
    raw = LoopedTransformer(LoopedConfig(**model_args(cfg))).to(rt.device)
    optimizers = build_optimizers(raw, cfg, rt.device_type)
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


def train(run, raw, optimizers, base_lrs, data):
    """THE training loop, from the resume point's step to max_steps (or --stop_step). One
    step: set the scheduled lr and momentum; per micro-batch, a batch, the forward pass
    and its loss, the backward pass; the gradient norm; clipping; the optimizer steps.
    Logged every step: loss, gradient norms (total, per block, per (loop, block)) and the
    residual norm of every loop; the val loss every eval_interval steps. Returns the step
    whose loss or gradient was NaN/inf (the run stops there, nothing of it kept), or None."""
    cfg, rt, K, n_micro = run.cfg, run.rt, run.cfg["n_loops"], run.cfg["grad_accum"]
    model = wrap(raw, rt, cfg["compile"])                             # DDP, torch.compile
    # --compile: the recorder's hooks need the eager module, which shares every weight with the
    # compiled one; it runs the steps the recorder reads (--block_grads_every), the compiled one the rest
    eager = model._orig_mod if cfg["compile"] else model
    params = [p for p in raw.parameters() if p.requires_grad]
    steps = StepLedger(run, raw, optimizers)     # resume point to the last step: bar, NaN guard, checkpoints
    recorder = BlockGradRecorder(raw.blocks)
    for it in steps:
        lr = set_schedules(optimizers, base_lrs, it, cfg)              # warmdown; Muon's momentum warmup
        loss_sum, res_norms = 0.0, torch.zeros(K, device=rt.device)
        recorded = cfg["block_grads_every"] > 0 and it % cfg["block_grads_every"] == 0
        recorder.start(K, len(raw.blocks), on=recorded)
        net = eager if recorded else model
        for micro in range(n_micro):
            # a pure function of (seed, step, micro-step, rank): a resumed run draws the same batches
            x, y = get_batch(data["train"], cfg, it, micro, rt.rank, device=rt.device)
            recorder.next_micro()
            with grad_sync(net, rt, last_micro=micro == n_micro - 1), rt.autocast():
                _, loss, stats = net(x, y, return_stats=True)           # forward: loss on the chosen loops
            (loss / n_micro).backward()                                 # backward
            loss_sum += loss.item() / n_micro
            res_norms += stats["residual_norms"] / n_micro
        loss_now, res_norms = steps.mean_over_ranks(loss_sum, res_norms)
        g_total = grad_norm(params).item()                              # before clipping
        if steps.diverged(it, loss_now, g_total, res_norms):           # NaN or inf: stop before the update
            return it + 1
        block_norms = [grad_norm(b.parameters()).item() for b in raw.blocks]   # of each block's weights
        if cfg["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(params, cfg["grad_clip"])    # clip
        for o in optimizers:
            o.step()                                                    # update
            o.zero_grad(set_to_none=True)
        # residual_norms: per loop t, the mean over tokens of ||x_L^(t)||_2, the residual stream
        # after the last block of loop t, before the final norm
        run.log(step=steps.logged(loss_now, res_norms), loss=loss_now, lr=lr, grad_norm=g_total,
                block_param_grad_norms=block_norms, residual_norms=[round(v, 4) for v in res_norms.tolist()],
                **{f"{k}_output_grad_norms": v for k, v in recorder.norms(n_micro).items()})
        if steps.done % cfg["eval_interval"] == 0 or steps.done == cfg["max_steps"]:   # the val curve
            ev = evaluate(raw, data["eval_xy"], K, rt)
            run.log(step=steps.done, val_loss=ev["loss"][-1],
                    **({"val_accuracy": ev["accuracy"][-1]} if cfg["data"] == "listops" else {}))
        steps.end_of_step()                        # ckpt.pt every ckpt_interval; a signal stops here
    return None


# -----------------------------------------------------------------------------
# After the loop: what summary.json says about the run

def summarize(run, raw, data, nan_stop, curve, records):
    """summary.json: Paper B's measurements of a finished run, computed from log.jsonl (so
    a resumed run is summarised over its whole history: `records`) and the test-time loop curve:
    the gradient and residual-norm statistics and the outcome (stability.py's)."""
    cfg, K = run.cfg, run.cfg["n_loops"]
    steps = [rec for rec in records if "loss" in rec]
    val = flt_report.val_curve(records)
    tail = steps[len(steps) - max(1, len(steps) // 10):]
    final_train = float(np.mean([rec["loss"] for rec in tail])) if tail else float("nan")
    # H: the entropy (nats/token) of the training data's unigram distribution, the loss of a
    # model that ignores context
    h_unigram = unigram_entropy(data["train"], data["vocab"])
    final_val = curve["loss"][K - 1] if curve else float("nan")
    ref = flt_report.reference_fields(cfg["reference"], val, final_val, h_unigram) if cfg["reference"] else {}
    ref_curve = dict(zip(ref["reference_val_steps"], ref["reference_val_curve"])) if ref else None
    verdict, reason = judge_curves(val, ref_curve, final_val, h_unigram)   # THE rule, outcome: diverged ... learned
    out = {
        "variant": cfg["variant"], "n_loops": K, "n_layer": cfg["n_layer"], "n_embd": cfg["n_embd"],
        "loss_type": cfg["loss_type"], "params": raw.num_params(), "steps": len(steps),
        "final_train_loss": final_train,
        "min_train_loss": float(min(rec["loss"] for rec in steps)) if steps else float("nan"),
        "final_val_loss": final_val,
        "val_steps": sorted(val), "val_curve": [val[k] for k in sorted(val)],
        "eval_set_size": len(data["eval_xy"][0]),
        "unigram_entropy": h_unigram,
        **gradient_statistics([rec["grad_norm"] for rec in steps[:cfg["osc_steps"]]]),
        **residual_statistics(steps, K),
        "outcome": verdict, "outcome_reason": reason, "nan_step": nan_stop,
        # the test-time loop curve, read on the val set after 1, 2, ..., n inference loops
        "inference_loops": list(range(1, len(curve.get("loss", [])) + 1)), "val_loss_by_loops": curve.get("loss", []),
        "hidden_norm_by_loops": curve.get("hidden_norm", []), "logit_entropy_by_loops": curve.get("logit_entropy", []),
        **({"final_val_accuracy": curve["accuracy"][K - 1] if curve else float("nan"),
            "val_accuracy_by_loops": curve.get("accuracy", [])} if cfg["data"] == "listops" else {}),
        "wall_time_s": round(run.elapsed(), 1),
    }
    out.update(ref)                                 # the 1-loop reference run's, checked at the start
    if data["is_bytes"]:
        out["final_val_bpb"] = out["final_val_loss"] / math.log(2)
    return out


if __name__ == "__main__":
    result = run_cli(main)
    sys.exit(2 if isinstance(result, dict) and result.get("outcome") == "diverged" else 0)
