"""
Train a looped Transformer LM (looped.py) and record the stability diagnostics of "Simply
Stabilizing the Loop via a Fully Looped Transformer": gradient norms per (loop, block), residual
norms per loop, oscillation, the run's outcome, the test-time loop curve.

  python train_flt.py --variant=FLT --n_loops=12 --n_layer=2   # byte LM on stdlib docstrings, the authors' recipe
  python train_flt.py --data=listops --optim=adamw             # ListOps (or a text file, or a train.bin/val.bin folder)
  torchrun --standalone --nproc_per_node=2 train_flt.py ...    # DDP (gloo on CPU, nccl on GPU)
  python train_flt.py --init_from=resume --out_dir=out/flt_FLT_K12   # continue exactly where it stopped
  python train_flt.py --evaluate=out/flt_FLT_K12 --test_loops=24     # the test-time loop curve of a checkpoint
  python tools/flt_compare.py --runs=out/a,out/b               # the figures and tables of several runs

Read top to bottom: DEFAULTS, the recipe (RECIPES, the optimizers and their schedules), evaluate
(the model read after every loop), the flags' checks, then main: THE loop, the summary and the
figures. The measurements are stability.py's (BlockGradRecorder; the statistics and `outcome`, the
one rule the last line and summary.json state); the run folder, checkpoints and signals are
training.py's; the corpora corpora.py's.
"""

import json
import math
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

from configurator import check, configure, run_cli
from corpora import eval_set, get_batch, load_data, unigram_entropy
from looped import LOSS_TYPES, VARIANTS, LoopedConfig, LoopedTransformer
from stability import BlockGradRecorder, grad_norm, gradient_statistics, judge_curves, residual_statistics
from training import (Run, choose_fast_dtype, default_out_dir, grad_sync, last_good, load_checkpoint, load_weights,
                      read_log, replica_max_diff, setup_runtime, wrap)

# -----------------------------------------------------------------------------
# The flags, each a --key=value (--help lists them with these comments). Their values are
# the authors' recipe, which the bare command runs (--optim=muon); --optim=adamw replaces
# the keys of RECIPES["adamw"] below, and the flags given apply last.

DEFAULTS = dict(
    data="stdlib",           # "stdlib" (docstrings of Python's standard library, bytes), "listops" (expressions and
                             # their values, loss on the answers), a text file (bytes), or a train.bin/val.bin folder
    listops_depth=3, listops_examples=20000, listops_val=2000,   # listops only: nesting depth, distinct
                             # training expressions, distinct held-out ones (all of them the eval set)
    vocab_size=256,          # only for train.bin/val.bin folders; byte data always uses 256
    variant="FLT",           # the model (looped.py): LT, LT_i, LT_ia, FLT_res, FLT
    n_loops=12, n_layer=2, n_head=4, n_embd=128, ffn_mult=4, block_size=128,   # K loops of L blocks; heads,
                             # width, MLP width / n_embd, context
    loss_type="END",         # the loops the loss reads: END (the last), STEP (all), FEW (the last third)
    optim="muon",            # muon: the authors' (Muon on the blocks, AdamW on embedding and head); adamw: a baseline
    batch_size=16, grad_accum=1, max_steps=400,   # examples per micro-batch and rank; micro-batches per
                             # optimizer step; optimizer steps
    lr=0.02,                 # muon: the block matrices' lr; adamw: the lr of everything
    embedding_lr=0.2,        # muon only: AdamW lr of the token embedding, times s = (n_embd / 768) ** -0.5
    unembedding_lr=0.004,    # muon only: AdamW lr of the lm head, times s
    lr_mult=1.0,             # multiplies every lr above (the stability map's lr axis)
    warmup_steps=0,          # linear warmup of every lr, in steps
    schedule="warmdown",     # warmdown (flat, then linear to 0 over the last warmdown_frac), cosine, linear, constant
    warmdown_frac=0.2, min_lr_frac=0.1,   # warmdown's share of the steps; the floor of cosine and linear
    weight_decay=0.0, beta1=0.8, beta2=0.95, adam_eps=1e-10,   # AdamW's (weight decay: Muon's too)
    qk_norm=True, softcap=15.0, lm_head_std=1e-3,   # model (looped.py): QK-norm after RoPE; logit soft cap
                             # (0 = none); lm head init std (0 = zero)
    grad_clip=1.0,           # the total gradient norm's cap (0 = no clipping)
    eval_interval=100,       # val loss on the eval set every this many steps (the curve stability.outcome reads)
    eval_batches=20,         # byte/token data: the eval set is eval_batches * batch_size fixed windows
    osc_steps=200,           # N of the gradient volatility and oscillation statistics
    reference="",            # folder of a finished 1-loop run at the same lr and budget: outcome judges against it
    test_loops=0,            # the test-time loop curve's length (0 = max(2 * n_loops, 12); at least n_loops)
    seed=1337,
    # the run's plumbing: it changes no result, and a resumed run may change it (FREE)
    out_dir="",              # "" = out/flt_<variant>_K<n_loops>[_<key>-<value> of each flag that differs]
    init_from="",            # "" = a new run | resume (from out_dir/ckpt.pt)
    evaluate="",             # DIR: print the test-time loop curve of the run in DIR (its ckpt.pt) and exit
    data_dir="data/stdlib_docstrings",   # where the stdlib corpus is cached
    block_grads_every=1,     # log the per-(loop, block) gradient norms every N steps (0 = never)
    ckpt_interval=200,       # steps between resume points (and one at the end)
    halt_after_steps=0,      # stop after this many steps, resume point saved (to test resume)
    sample_tokens=0,         # print a sample of this many bytes at the end (byte data)
    device="auto", dtype="auto",  # auto: bf16 on a GPU that has it, else float32; fast: the faster, timed here
    compile=False, overwrite=False, debug=False,   # torch.compile; replace an earlier run in out_dir; tracebacks
)
FREE = ("data_dir", "block_grads_every", "ckpt_interval", "halt_after_steps", "sample_tokens", "device", "dtype",
        "compile", "overwrite", "debug")

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
    """The factor every base lr is multiplied by at step it (0-based): a linear warmup over
    warmup_steps, then warmdown (the authors', nanochat's: flat, then linear to 0 over the last
    warmdown_frac of max_steps), cosine or linear decay to min_lr_frac, or constant."""
    T, warmup = cfg["max_steps"], cfg["warmup_steps"]
    if it < warmup:
        return (it + 1) / warmup
    if cfg["schedule"] == "warmdown":
        w = round(cfg["warmdown_frac"] * T)
        return 1.0 if it <= T - w else (T - it) / w
    if cfg["schedule"] == "constant" or T <= warmup:
        return 1.0
    progress = min(1.0, (it - warmup) / (T - warmup))
    decay = 0.5 * (1.0 + math.cos(math.pi * progress)) if cfg["schedule"] == "cosine" else 1.0 - progress
    return cfg["min_lr_frac"] + (1.0 - cfg["min_lr_frac"]) * decay


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


# -----------------------------------------------------------------------------
# The flags, checked before anything is written

def get_config(argv):
    """DEFAULTS, then --optim's recipe, then every --key=value, checked: a bad value is one
    line naming what is allowed, before any work is done."""
    recipes = "\n".join(f"  --optim={k} sets {', '.join(f'{n}={v!r}' for n, v in r.items()) or 'DEFAULTS'}"
                        for k, r in RECIPES.items())
    first = configure(DEFAULTS, argv, f"{__doc__}\nvariants: {', '.join(VARIANTS)}\n{recipes}", __file__)
    check(first, choices=dict(optim=tuple(RECIPES)))
    base = {**DEFAULTS, **RECIPES[first["optim"]]}                    # the recipe; the flags given win
    cfg = configure(base, argv)
    check(cfg, positive=("n_loops", "n_layer", "n_head", "n_embd", "ffn_mult", "block_size", "batch_size",
                         "grad_accum", "max_steps", "lr", "embedding_lr", "unembedding_lr", "lr_mult", "adam_eps",
                         "eval_interval", "eval_batches", "ckpt_interval", "vocab_size", "listops_val"),
          fractions=("beta1", "beta2", "warmdown_frac", "min_lr_frac"),
          choices=dict(variant=tuple(VARIANTS), loss_type=LOSS_TYPES, init_from=("", "resume"),
                       schedule=("warmdown", "cosine", "linear", "constant"),
                       dtype=("auto", "fast", "float32", "bfloat16", "float16")))
    if cfg["osc_steps"] < 2:
        raise ValueError(f"--osc_steps={cfg['osc_steps']} must be >= 2 (the statistics read step-to-step changes)")
    given, data, muon = {a[2:].partition("=")[0] for a in argv}, cfg["data"], cfg["optim"] == "muon"
    only = dict(vocab_size=("a train.bin/val.bin folder", data not in ("stdlib", "listops") and os.path.isdir(data)),
                embedding_lr=("--optim=muon", muon), unembedding_lr=("--optim=muon", muon),
                **{k: ("--data=listops", data == "listops") for k in ("listops_depth", "listops_examples",
                                                                         "listops_val")},
                eval_batches=("byte or token data (ListOps scores every held-out expression)", data != "listops"),
                data_dir=("--data=stdlib (its cache)", data == "stdlib"))
    for key in sorted(given & {k for k, (_, applies) in only.items() if not applies}):
        raise ValueError(f"--{key} applies only to {only[key][0]}; leave it out")
    LoopedConfig(**model_args(cfg, cfg["vocab_size"]))                # the model's own checks
    return cfg


def auto_out_dir(cfg):
    """--out_dir="": out/flt_<variant>_K<n_loops>, then each flag that differs from DEFAULTS and
    the recipe, so two different runs never share a folder."""
    return default_out_dir(f"flt_{cfg['variant']}_K{cfg['n_loops']}", cfg, {**DEFAULTS, **RECIPES[cfg["optim"]]},
                           skip=("variant", "n_loops", "init_from", "evaluate", *FREE))


def model_args(cfg, vocab_size):
    """looped.LoopedConfig's arguments from the flags."""
    keys = "block_size n_layer n_loops n_head n_embd ffn_mult variant loss_type qk_norm softcap lm_head_std".split()
    return dict(vocab_size=vocab_size, **{k: cfg[k] for k in keys})


def reference_curve(cfg):
    """--reference names a finished 1-loop run trained and evaluated like this run: one
    loop, same data, recipe, lr, budget, sizes and eval set. Returns its val curve {step: loss}."""
    folder = cfg["reference"]
    try:
        ref, records = json.load(open(os.path.join(folder, "config.json"))), read_log(folder)
        json.load(open(os.path.join(folder, "summary.json")))["final_val_loss"]     # a finished run's
    except (OSError, ValueError, KeyError) as e:
        raise FileNotFoundError(f"--reference={folder} is not a finished run folder ({type(e).__name__} {e})") from None
    keys = ["data", "optim", "lr", "lr_mult", "max_steps", "batch_size", "block_size", "n_layer", "n_embd",
            "eval_interval"] + (["listops_val", "listops_depth"] if cfg["data"] == "listops" else ["eval_batches"])
    differ = [k for k in keys if ref.get(k) != cfg[k]]
    if ref.get("n_loops") != 1 or differ:
        raise ValueError(f"--reference={folder} must be a 1-loop run trained like this one; it has "
                         f"n_loops={ref.get('n_loops')}" + (f" and differs in {differ}" if differ else ""))
    return {x["step"]: x["val_loss"] for x in records if "val_loss" in x}


# -----------------------------------------------------------------------------
# The run: data, model, THE loop, then the summary and the figures

def main(argv):
    cfg = get_config(argv)
    cfg["out_dir"] = cfg["out_dir"] or auto_out_dir(cfg)
    if cfg["evaluate"]:
        return evaluate_checkpoint(cfg["evaluate"], cfg["test_loops"], cfg["device"])
    with Run(cfg, "train_flt.py", argv, FREE) as run:                  # the folder checked and locked
        cfg, rt, K, n_micro = run.cfg, run.rt, run.cfg["n_loops"], run.cfg["grad_accum"]
        ref = reference_curve(cfg) if cfg["reference"] else None
        train, val, vocab, is_bytes = load_data(cfg)
        if train.ndim == 1 and min(len(train), len(val)) <= cfg["block_size"] + 1:
            raise ValueError(f"--data={cfg['data']} is too short for --block_size={cfg['block_size']}: "
                             f"{len(train)} train and {len(val)} val tokens")
        eval_xy = eval_set(val, cfg)
        raw = LoopedTransformer(LoopedConfig(**model_args(cfg, vocab))).to(rt.device)
        optimizers = build_optimizers(raw, cfg, rt.device_type)
        base_lrs = [[cfg["lr_mult"] * g["lr"] for g in o.param_groups] for o in optimizers]
        start = run.ckpt["step"] if run.ckpt else 0
        if run.ckpt:
            run.restore(raw, optimizers)                                 # weights, optimizers, RNG
        x, y = get_batch(train, cfg, 0, 0, rt.rank, device=rt.device)
        choose_fast_dtype(cfg, rt, raw, lambda: raw(x, y)[1])              # --dtype=fast
        run.begin(keep=lambda r: r["step"] <= start)                     # on resume: the log up to ckpt.pt
        if rt.master:
            source = cfg["data_dir"] if cfg["data"] == "stdlib" else cfg["data"]
            print(f"device {rt.device} ({rt.ptdtype}), world size {rt.world_size}; data {source}: {len(train):,} train "
                  f"/ {len(val):,} val {'bytes' if is_bytes else 'tokens'}; {cfg['variant']} x{K} loops, "
                  f"{raw.num_params():,} parameters" + (f"; resuming at step {start}" if start else ""), flush=True)
        model = wrap(raw, rt, cfg["compile"])                            # DDP, torch.compile
        # --compile: the steps the recorder reads run on the eager module (its hooks), which shares the weights
        eager = model._orig_mod if cfg["compile"] else model
        params = [p for p in raw.parameters() if p.requires_grad]
        recorder = BlockGradRecorder(raw.blocks)
        done, nan_step = start, None
        run.saver = lambda: run.save_resume(raw, optimizers, step=done)  # a stop signal saves ckpt.pt first
        bar = tqdm(range(start, cfg["max_steps"]), initial=start, total=cfg["max_steps"], disable=not rt.master,
                   desc=os.path.basename(cfg["out_dir"]))
        for it in bar:
            lr = set_schedules(optimizers, base_lrs, it, cfg)            # warmdown; Muon's momentum warmup
            loss_now, res_norms = 0.0, torch.zeros(K, device=rt.device)
            recorded = cfg["block_grads_every"] > 0 and it % cfg["block_grads_every"] == 0
            recorder.start(K, len(raw.blocks), on=recorded)
            net = eager if recorded else model
            for micro in range(n_micro):
                # a pure function of (seed, step, micro-step, rank): a resumed run draws the same batches
                x, y = get_batch(train, cfg, it, micro, rt.rank, device=rt.device)
                recorder.next_micro()
                with grad_sync(net, rt, last_micro=micro == n_micro - 1), rt.autocast():
                    _, loss, stats = net(x, y, return_stats=True)       # forward: the loss on looped.loss_loops
                (loss / n_micro).backward()                             # backward
                loss_now += loss.item() / n_micro
                res_norms += stats["residual_norms"] / n_micro
            if rt.ddp:                                                  # the step's loss and norms over ranks
                mean = torch.tensor([loss_now], dtype=torch.float64, device=rt.device)
                dist.all_reduce(mean)
                dist.all_reduce(res_norms)
                loss_now, res_norms = mean.item() / rt.world_size, res_norms / rt.world_size
            g_total = grad_norm(params).item()                          # before clipping
            if not (math.isfinite(loss_now) and math.isfinite(g_total) and torch.isfinite(res_norms).all()):
                nan_step = it + 1                                       # NaN or inf: stop before the update
                if rt.master:
                    print(f"\nstopping: the loss is {loss_now}, the gradient norm {g_total} and the residual norms "
                          f"{res_norms.tolist()} at step {nan_step}, before its update: the run diverged; "
                          f"{last_good(run.ckpt_path)}. Start again with a lower --lr (--overwrite=True)", flush=True)
                break
            block_norms = [grad_norm(b.parameters()).item() for b in raw.blocks]   # of each block's weights
            if cfg["grad_clip"] > 0:
                torch.nn.utils.clip_grad_norm_(params, cfg["grad_clip"])  # clip
            for o in optimizers:
                o.step()                                                # update
                o.zero_grad(set_to_none=True)
            done = it + 1
            bar.set_postfix(loss=f"{loss_now:.3f}", res=f"{res_norms[-1].item():.1f}")
            # residual_norms: per loop t, the mean over tokens of ||x_L^(t)||_2, the residual stream
            # after the last block of loop t, before the final norm
            run.log(step=done, loss=loss_now, lr=lr, grad_norm=g_total, block_param_grad_norms=block_norms,
                    residual_norms=[round(v, 4) for v in res_norms.tolist()],
                    **{f"{k}_output_grad_norms": v for k, v in recorder.norms(n_micro).items()})
            if done % cfg["eval_interval"] == 0 or done == cfg["max_steps"]:    # the val curve
                ev = evaluate(raw, eval_xy, K, rt)
                run.log(step=done, val_loss=ev["loss"][-1],
                        **({"val_accuracy": ev["accuracy"][-1]} if cfg["data"] == "listops" else {}))
            if done % cfg["ckpt_interval"] == 0 or done == cfg["max_steps"]:
                run.saver()                                             # the resume point
            run.tick()                                 # a stop signal or --halt_after_steps stops here
        bar.close()
        run.saver = None
        # the test-time loop curve: the trained model read after 1, 2, ..., n_test inference loops, by
        # default max(2K, 12), so it covers the authors' budgets 1, 3, 6, 9, 12 and 2K
        n_test = max(cfg["test_loops"] or max(2 * K, 12), K)
        curve = evaluate(raw, eval_xy, n_test, rt) if nan_step is None else {}
        records = read_log(cfg["out_dir"]) if rt.master else []         # the whole run, resumed or not
        summary = summarize(run, raw, records, curve, nan_step, dict(
            ref=ref, h_unigram=unigram_entropy(train, vocab), eval_set_size=len(eval_xy[0]), is_bytes=is_bytes))
        if rt.ddp:                                                      # every replica holds the same weights
            summary["ddp_replicas_identical"] = replica_max_diff(raw, rt) == 0.0
        run.write_summary(summary)
        if rt.master:
            print(json.dumps({k: v for k, v in summary.items() if not isinstance(v, list)}))
            if is_bytes and cfg["sample_tokens"] and nan_step is None:
                out = raw.generate(torch.tensor([list(b"The ")], device=rt.device), cfg["sample_tokens"],
                                   temperature=0.8, top_k=40)[0].tolist()
                print(bytes(out).decode("utf-8", errors="replace"))
            plot_run(cfg["out_dir"], records, summary)
            print(last_line(summary, cfg["out_dir"]), flush=True)
        return summary if rt.master else None                          # rank 0 speaks for the run


def summarize(run, raw, records, curve, nan_step, data):
    """summary.json: Paper B's measurements of a finished run, computed from log.jsonl (so
    a resumed run is summarised over its whole history: `records`) and the test-time loop curve:
    the gradient and residual-norm statistics and the outcome (stability.py's). data: h_unigram,
    the entropy (nats/token) of the training data's unigram distribution, the loss of a model that
    ignores context; ref, the 1-loop reference run's val curve (--reference) or None; the eval
    set's size; whether the tokens are bytes."""
    cfg, K, ref, h_unigram = run.cfg, run.cfg["n_loops"], data["ref"], data["h_unigram"]
    steps = [rec for rec in records if "loss" in rec]
    val = {x["step"]: x["val_loss"] for x in records if "val_loss" in x}
    tail = steps[len(steps) - max(1, len(steps) // 10):]
    final_val = curve["loss"][K - 1] if curve else float("nan")
    verdict, reason = judge_curves(val, ref, final_val, h_unigram)   # THE rule, outcome: diverged ... learned
    out = {
        "variant": cfg["variant"], "n_loops": K, "n_layer": cfg["n_layer"], "n_embd": cfg["n_embd"],
        "loss_type": cfg["loss_type"], "params": raw.num_params(), "steps": len(steps),
        "final_train_loss": float(np.mean([rec["loss"] for rec in tail])) if tail else float("nan"),
        "min_train_loss": float(min(rec["loss"] for rec in steps)) if steps else float("nan"),
        "final_val_loss": final_val, "val_steps": sorted(val), "val_curve": [val[k] for k in sorted(val)],
        "eval_set_size": data["eval_set_size"], "unigram_entropy": h_unigram,
        **gradient_statistics([rec["grad_norm"] for rec in steps[:cfg["osc_steps"]]]),
        **residual_statistics(steps, K),
        "outcome": verdict, "outcome_reason": reason, "nan_step": nan_step,
        # the test-time loop curve, read on the val set after 1, 2, ..., n inference loops
        "inference_loops": list(range(1, len(curve.get("loss", [])) + 1)), "val_loss_by_loops": curve.get("loss", []),
        "hidden_norm_by_loops": curve.get("hidden_norm", []), "logit_entropy_by_loops": curve.get("logit_entropy", []),
        **({"final_val_accuracy": curve["accuracy"][K - 1] if curve else float("nan"),
            "val_accuracy_by_loops": curve.get("accuracy", [])} if cfg["data"] == "listops" else {}),
        "wall_time_s": round(run.elapsed(), 1),
    }
    if ref:   # the reference's final val loss and its curve at the steps both runs have, and the share of its
        # gain kept: gain_kept = (H_unigram - final val loss) / (H_unigram - the reference's final val loss)
        ref_final, shared = ref[max(ref)], sorted(set(val) & set(ref))
        out.update(reference=cfg["reference"], reference_val_loss=ref_final, reference_val_steps=shared,
                   reference_val_curve=[ref[k] for k in shared],
                   gain_kept=(h_unigram - final_val) / (h_unigram - ref_final) if h_unigram > ref_final else math.nan)
    if data["is_bytes"]:
        out["final_val_bpb"] = out["final_val_loss"] / math.log(2)
    return out


def last_line(s, out_dir):
    """The run's last line: its final val loss against the unigram entropy (the loss of a
    model that ignores context), the outcome (stability.outcome, the one rule) and the
    residual peak; prefixed by the run folder's name."""
    why = f"a NaN at step {s['nan_step']}" if s.get("nan_step") else s["outcome_reason"]
    return (f"[{os.path.basename(os.path.normpath(out_dir))}] {s['variant']}, {s['n_loops']} loops: final val loss "
            f"{s['final_val_loss']:.3f} nats/token against {s['unigram_entropy']:.3f} for a model that ignores "
            f"context (the unigram entropy): {s['outcome']} ({why}; stability.outcome); residual norm peak "
            f"{s['max_residual_norm']:.0f}")


def plot_run(out_dir, records, s):
    """The run's four figures in out_dir: flt_loss.png (train loss, 10-step mean; dots: val
    loss; dotted: the unigram entropy), flt_grad_norm.png (total gradient norm before
    clipping), flt_residual_norm.png (the residual norm of every loop, light to dark) and
    flt_test_time_loops.png (val loss after 1, 2, ... inference loops; dotted: K).
    tools/flt_compare.py draws the same for several runs side by side."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    steps, val, K = [r for r in records if "loss" in r], [r for r in records if "val_loss" in r], s["n_loops"]
    x, loss = [r["step"] for r in steps], [r["loss"] for r in steps]
    mean = np.convolve(loss, np.ones(10) / 10, mode="valid") if len(loss) >= 10 else loss
    res = np.array([[math.inf if v is None else v for v in r["residual_norms"]] for r in steps]).reshape(-1, K)
    ylabels = {"flt_loss.png": "nats / token", "flt_grad_norm.png": "total grad norm before clipping",
               "flt_residual_norm.png": "residual norm (mean token L2)", "flt_test_time_loops.png": "val loss"}
    (_, loss_ax), (_, grad_ax), (_, res_ax), (_, test_ax) = figures = [plt.subplots(figsize=(5, 3.4)) for _ in ylabels]
    loss_ax.plot(x[len(x) - len(mean):], mean, label="train (10-step mean)")
    loss_ax.plot([r["step"] for r in val], [r["val_loss"] for r in val], "o", ms=3, label="val")
    loss_ax.axhline(s["unigram_entropy"], color="grey", ls=":", lw=0.8, label="unigram entropy")
    grad_ax.semilogy(x, [r["grad_norm"] for r in steps], lw=0.6, label="all weights")
    for t in range(K):
        res_ax.plot(x, res[:, t], lw=0.8, color=plt.get_cmap("viridis")(t / max(1, K - 1)),
                    label=f"loop {t + 1}" if t in (0, K - 1) else None)
    test_ax.plot(s["inference_loops"], s["val_loss_by_loops"], ".-", label="val, nats / token")
    test_ax.axvline(K, color="grey", ls=":", lw=0.8, label=f"trained K={K}")
    for (name, ylabel), (fig, ax) in zip(ylabels.items(), figures):
        ax.set(xlabel="inference loops" if ax is test_ax else "step", ylabel=ylabel,
               title=f"{s['variant']}, K={K} ({os.path.basename(os.path.normpath(out_dir))})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, name), dpi=90)
        plt.close(fig)


def evaluate_checkpoint(run_dir, test_loops, device):
    """--evaluate=DIR: the test-time loop curve of the run in DIR (its ckpt.pt and config):
    evaluate() on the run's eval set at 1..test_loops loops (0 = max(2K, 12)). Prints one
    line per loop count and returns the dict of lists. Writes nothing."""
    ckpt = load_checkpoint(os.path.join(run_dir, "ckpt.pt"))
    cfg = ckpt["config"]
    if "variant" not in cfg:
        raise ValueError(f"--evaluate={run_dir} is not a run of train_flt.py (its checkpoint has no looped model)")
    rt = setup_runtime(device, "float32", cfg["seed"])
    _, val, vocab, _ = load_data(cfg)
    model = LoopedTransformer(LoopedConfig(**model_args(cfg, vocab))).to(rt.device)
    load_weights(model, ckpt["model"])
    n_test = test_loops or max(2 * cfg["n_loops"], 12)
    curve = evaluate(model, eval_set(val, cfg), n_test, rt)
    print(f"{run_dir}: {cfg['variant']} trained at K={cfg['n_loops']}, step {ckpt['step']}; per inference loop count:")
    for t in range(n_test):
        print(f"  {t + 1:3d} loops: loss {curve['loss'][t]:.4f}  accuracy {curve['accuracy'][t]:.4f}  "
              f"entropy {curve['logit_entropy'][t]:.4f}  hidden norm {curve['hidden_norm'][t]:.2f}")
    return curve


if __name__ == "__main__":
    result = run_cli(main)
    sys.exit(2 if isinstance(result, dict) and result.get("outcome") == "diverged" else 0)
