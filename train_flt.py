"""
Train a looped Transformer language model (looped.py) and record the stability
diagnostics of "Simply Stabilizing the Loop via a Fully Looped Transformer":
loss, gradient norms (total, per block, and of each block's, attention's and
MLP's output per loop), the per-loop residual norm and its peak, gradient
volatility and oscillation, collapse, and the test-time loop curve.

  python train_flt.py --variant=FLT --n_loops=12 --n_layer=2     # byte LM on stdlib docstrings
  python train_flt.py --optim=adamw ...                          # a plain AdamW baseline recipe instead
  python train_flt.py --data=listops --n_loops=6                 # ListOps, scored on the answers (corpora.py)
  python train_flt.py --data=my.txt --variant=LT --n_loops=6     # any text file, as bytes
  python train_flt.py --data=data/owt --vocab_size=50304         # nanoGPT train.bin/val.bin (uint16)
  torchrun --standalone --nproc_per_node=2 train_flt.py ...      # DDP (gloo on CPU, nccl on GPU)
  python train_flt.py --init_from=resume --out_dir=out/flt       # continue exactly where it stopped
  python train_flt.py --compare=out/a,out/b --out_dir=assets     # figures and tables from finished runs
  python train_flt.py --evaluate=out/flt --test_loops=24         # the test-time loop curve of a checkpoint
  python train_flt.py --help                                     # every key and its default

The recipe (--optim=muon, the default) is the authors' (FuRuF-11/FullyLoopedTransformer,
nanochat): Muon, Nesterov, lr 0.02 on every matrix of the blocks, momentum 0.85 ->
0.95 over the first 300 steps; AdamW (betas 0.8, 0.95, eps 1e-10) on the token
embedding (lr 0.2 s) and the lm head (lr 0.004 s), s = (n_embd / 768) ** -0.5; no
weight decay; no warmup, flat lr then linear to 0 over the last 20% of steps; the
model with QK-norm, logit softcap 15, lm head init N(0, 1e-3^2). --optim=adamw is
a plain AdamW baseline (RECIPES["adamw"]: AdamW 3e-3 on everything, weight decay
0.1, 40 warmup steps then cosine, no QK-norm, no softcap, zero lm head). Either
recipe's values give way to a flag given on the command line.

The shape of the authors' run.sh (6 layers looped 12 times, width 64 * 6 = 384, head
dimension 128, so 3 heads; sequence 1024; 524,288 tokens a step on 8 GPUs):
  torchrun --standalone --nproc_per_node=8 train_flt.py --data=data/fineweb_edu --vocab_size=50304 \
      --variant=FLT --n_loops=12 --n_layer=6 --n_embd=384 --n_head=3 --block_size=1024 \
      --batch_size=8 --grad_accum=8 --max_steps=1878 --compile=True   # 20 tokens per parameter

Every run writes into out_dir: config.json; log.jsonl (one record per step:
loss, lr, grad_norm, block_grad_norms, residual_norms, and the per-(loop, block)
gradient norms out_grad_norms, attn_grad_norms, mlp_grad_norms; and, every
eval_interval steps, val_loss (and val_accuracy on ListOps) on the fixed eval set);
summary.json (the fields listed in summarize()); ckpt.pt; the figures and tables
of flt_report.py.

Definitions used in log.jsonl and summary.json:
  eval set      one fixed set per corpus, the same for every seed and variant
                (corpora.eval_set): ListOps, every one of the --listops_val held-out
                expressions; a byte or token stream, eval_batches * batch_size
                windows at evenly spaced offsets over the val split.
  grad_volatility  std over steps t = 0..N-2 (N = osc_steps, or fewer if the run is
                shorter) of  log g_{t+1} - log g_t,  g_t = total gradient L2 norm
                at step t BEFORE clipping: how much the norm moves per step, noise
                included (grad_osc: the same number, under its former name).
  grad_dlog_ac1, grad_zigzag  two tests of oscillation over the same N steps, which
                tell a step-to-step zig-zag from noise (flt_report.py): -0.5 and
                0.3 for independent noise, -1 and towards 1 for a zig-zag.
  out_grad_norms, attn_grad_norms, mlp_grad_norms  per step, n_loops lists of
                n_layer numbers: ||dL/dy||_2 of the output y of block i in loop t,
                of its attention and of its MLP (BlockGradRecorder; the authors'
                base_check.py logs the same three).
  residual norm mean over tokens of ||x_L^(t)||_2, the residual stream after the
                last block of loop t, before the final norm; one number per loop;
                residual_norm_peak / _peak_step: its maximum over training, per
                loop, and the step where it occurs.
  diverged      True if the loss or gradient became NaN/inf ("nan"), or if the run
                plateaued at the context-free level ("plateau"): the mean train
                loss over the last 10% of steps (at least the last one) is
                >= 0.95 * H_unigram, the entropy (nats/token) of the training
                data's unigram distribution, the loss of a model that ignores context.
  collapse      with --reference=DIR (a finished 1-loop run, same data, recipe, lr,
                budget and eval set): the rule on the whole val curve against the
                reference's at the same steps (flt_report.collapse_verdict):
                collapsed (never learned, back at the unigram level, or lost what
                it learned), lagging (behind at the end; still improving or
                stalled), or none; collapse_kept = (H_unigram - val loss) /
                (H_unigram - reference val loss) at the last step.
  test-time loop curve  the trained model read after 1, 2, ..., test_loops inference
                loops (default max(2K, 12), so it covers the authors' budgets 1, 3,
                6, 9, 12 and 2K), on the eval set: per loop the val loss, the mean
                hidden (residual) norm, the mean entropy of the output distribution
                (the authors' wiki_ppl.py --check-norms / --check-logits), and for
                ListOps the exact-match accuracy of the answers.
                --evaluate=DIR prints the same curve for a finished run's ckpt.pt.
The batches are a pure function of (seed, step, micro-step, rank), so a resumed
run draws exactly the batches the uninterrupted run would have drawn.

Read top to bottom: DEFAULTS and RECIPES (the flags); get_config, check_config;
evaluate (the model read loop by loop on the eval set); the schedules,
BlockGradRecorder, reference_curve; then the run: main -> setup_run -> train (THE
loop, the step in one screen, each guarantee a named helper below it) -> finish;
summarize and its pieces; evaluate_checkpoint.

Run folders: a run refuses an out_dir that holds another run's results
(--overwrite=True replaces them) and writes nothing there until its flags, data
and model have been checked. --init_from=resume continues the run in --out_dir,
wherever that folder now is, with the checkpoint's config; of the flags given
with it, those in RESUME_SAFE (the lrs, grad_clip, eval_interval, ckpt_interval,
stop_step, sample_tokens, device, dtype, compile) are applied and recorded in
config.json and log.jsonl, any other that differs is refused. A NaN or inf loss or gradient
stops the run before the optimizer step. Errors are one line; --debug=True
shows the traceback.
"""

import json
import math
import os
import shlex
import sys
import time
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

import configurator
import training
from corpora import eval_set, get_batch, load_data, unigram_entropy
from flt_report import grad_dlog_ac1, grad_volatility, grad_zigzag, judge_curves, plot_runs, val_curve
from looped import LOSS_TYPES, VARIANTS, LoopedConfig, LoopedTransformer

# -----------------------------------------------------------------------------
# Defaults: every key is a --key=value flag (--help lists them). The optimisation keys
# hold the authors' recipe; --optim=adamw switches every key of RECIPES["adamw"] to the
# AdamW baseline's value.

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
    optim="muon",            # muon: the authors' (Muon on the block matrices, AdamW on embedding and head);
                             # adamw: a plain AdamW baseline (RECIPES)
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
    reference="",            # folder of a finished 1-loop run at the same lr and budget: enables the collapse rule
    test_loops=0,            # the test-time loop curve goes to this many loops (0 = max(2 * n_loops, 12);
                             # at least n_loops)
    ckpt_interval=200,
    init_from="scratch",     # scratch or resume (from out_dir/ckpt.pt)
    stop_step=0,             # stop after this many steps (checkpointed), keeping the schedule of max_steps;
                             # 0 = run to max_steps
    sample_tokens=0,         # print a sample of this many bytes at the end (byte data)
    # system
    seed=1337,
    device="auto",           # auto, cpu, cuda, cuda:1, mps
    dtype="auto",            # auto (bfloat16 on a capable GPU, else float32), fast (bf16 where native), float32, bfloat16
    compile=False,           # torch.compile the model
    compare="",              # DIR1,DIR2,...: draw the comparison figures of finished runs into out_dir and exit
                             # (flt_report.py)
    evaluate="",             # DIR: print the test-time loop curve of the run in DIR (its ckpt.pt) and exit
    overwrite=False,         # replace the results of an earlier run in out_dir
    debug=False,             # show the traceback of a user error
)

# The recipes (--optim), applied over DEFAULTS and before the command line: a key given
# as a flag keeps the flag's value.
RECIPES = {
    "muon": {},              # the authors': the values in DEFAULTS
    # a plain AdamW baseline: one lr for every weight, warmup then cosine, weight decay 0.1, and the
    # model without nanochat's QK-norm, softcap and lm-head init
    "adamw": dict(lr=3e-3, warmup_steps=40, schedule="cosine", weight_decay=0.1, beta1=0.9, adam_eps=1e-8,
                  qk_norm=False, softcap=0.0, lm_head_std=0.0),
}
MUON_MOMENTUM = (0.85, 0.95, 300)   # Muon momentum warmed linearly from 0.85 to 0.95 over 300 steps
EVAL_CHUNK = 256                    # eval-set windows per forward pass (memory, not results)
MAX_TEST_LOOPS = 1024               # the test-time loop curve's longest reach

RESUME_SAFE = ("lr", "embedding_lr", "unembedding_lr", "lr_mult", "grad_clip", "eval_interval", "ckpt_interval",
               "stop_step", "sample_tokens", "device", "dtype", "compile", "debug")


def get_config(argv):
    """Two passes: --optim picks the recipe's values, then every --key=value applies."""
    optim = configurator.flag_value(argv, "optim", DEFAULTS["optim"])
    if optim not in RECIPES:
        raise ValueError(f"--optim={optim} is not one of {tuple(RECIPES)}")
    cfg = configurator.configure({**DEFAULTS, **RECIPES[optim]}, argv, __doc__)
    check_test_loops(cfg)
    return cfg if cfg["compare"] or cfg["evaluate"] else check_config(cfg, configurator.given_keys(argv))


def check_test_loops(cfg):
    """--test_loops in [0, MAX_TEST_LOOPS] (it also bounds --evaluate's curve)."""
    if not 0 <= cfg["test_loops"] <= MAX_TEST_LOOPS:
        raise ValueError(f"--test_loops={cfg['test_loops']} is out of range: it must be in [0, {MAX_TEST_LOOPS}] "
                         f"(0 = max(2 * n_loops, 12))")


def check_config(cfg, explicit):
    """Refuse bad values before any work is done, naming what is allowed. `explicit`:
    the keys given on the command line (some apply only to some data or recipes)."""
    for key, allowed in dict(variant=tuple(VARIANTS), loss_type=tuple(LOSS_TYPES),
                             schedule=("warmdown", "cosine", "linear", "constant"),
                             init_from=("scratch", "resume")).items():
        if cfg[key] not in allowed:
            raise ValueError(f"--{key}={cfg[key]} is not one of {allowed}")
    configurator.check_ranges(cfg, positive=("n_loops", "n_layer", "n_head", "n_embd", "ffn_mult", "block_size",
                                             "batch_size", "grad_accum", "max_steps", "lr", "embedding_lr",
                                             "unembedding_lr", "lr_mult", "adam_eps", "eval_interval",
                                             "eval_batches", "ckpt_interval", "vocab_size", "listops_val"),
                              nonnegative=("warmup_steps", "weight_decay", "grad_clip", "test_loops", "stop_step",
                                           "sample_tokens", "softcap", "lm_head_std"),
                              fractions=("beta1", "beta2", "warmdown_frac", "min_lr_frac"),
                              counts=("listops_examples", "listops_val"))
    d = cfg["n_embd"]
    configurator.check_memory(cfg["n_layer"] * (4 + 2 * cfg["ffn_mult"]) * d * d, cfg["device"])   # blocks: a lower bound
    if cfg["osc_steps"] < 2:
        raise ValueError(f"--osc_steps={cfg['osc_steps']} is out of range: the statistic needs at least 2 steps")
    data = cfg["data"]
    if "vocab_size" in explicit and (data == "stdlib" or not os.path.isdir(data)):
        raise ValueError("--vocab_size applies only to a folder of train.bin/val.bin token ids; byte data "
                         "always has 256; leave it out")
    for key in set(explicit) & {"embedding_lr", "unembedding_lr"}:
        if cfg["optim"] != "muon":
            raise ValueError(f"--{key} is an lr of the muon recipe; with --optim={cfg['optim']} --lr sets every lr")
    for key in set(explicit) & {"listops_depth", "listops_examples", "listops_val"}:
        if data != "listops":
            raise ValueError(f"--{key} applies only to --data=listops; leave it out")
    if "eval_batches" in explicit and data == "listops":
        raise ValueError("--eval_batches sizes the eval set of byte or token data; ListOps is scored on all "
                         "--listops_val held-out expressions; leave it out")
    if "data_dir" in explicit and data != "stdlib":
        raise ValueError(f"--data_dir is where the stdlib corpus is cached; it does not apply to --data={data}; "
                         "leave it out")
    return cfg


@torch.no_grad()
def evaluate(model, eval_xy, n_loops, rt):
    """The model read after every loop t = 1..n_loops on the fixed eval set (x, y)
    (corpora.eval_set), as lists of n_loops floats:
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

def lr_multiplier(it, C):
    """The factor every base lr is multiplied by at step it (0-based). warmdown (the
    authors'): 1 until step max_steps - W, then (max_steps - it) / W, reaching 0,
    W = round(warmdown_frac * max_steps); after a linear warmup if warmup_steps > 0.
    cosine, linear, constant: training.lr_at, as in the AdamW baseline recipe."""
    if C.schedule != "warmdown":
        return training.lr_at(it, C.max_steps, 1.0, C.warmup_steps, C.schedule, C.min_lr_frac)
    if it < C.warmup_steps:
        return (it + 1) / C.warmup_steps
    warmdown = round(C.warmdown_frac * C.max_steps)
    return 1.0 if it <= C.max_steps - warmdown else (C.max_steps - it) / warmdown


def muon_momentum(it):
    """Muon's momentum at step it: 0.85 -> 0.95 linearly over the first 300 steps, then 0.95."""
    lo, hi, n = MUON_MOMENTUM
    return lo + (hi - lo) * min(it / n, 1.0)


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

    def start(self, n_loops, n_layer):          # before each step
        self.sums = {k: np.zeros((n_loops, n_layer)) for k in self.KINDS} if self.enabled else None

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


def reference_curve(C):
    """The val curve {step: val loss} of the finished 1-loop reference run in
    C.reference, after checking that it was trained and evaluated like this run:
    one loop, same data, recipe, lr, budget, sizes and eval set."""
    try:
        with open(os.path.join(C.reference, "config.json")) as f:
            ref = json.load(f)
        with open(os.path.join(C.reference, "summary.json")) as f:
            finished = "final_val_loss" in json.load(f)
        records = training.read_log(C.reference)
    except (OSError, ValueError) as e:
        raise FileNotFoundError(f"--reference={C.reference} is not a finished run folder ({e})") from None
    if not finished:
        raise FileNotFoundError(f"--reference={C.reference}: its summary.json has no final_val_loss")
    keys = ["data", "optim", "lr", "lr_mult", "max_steps", "batch_size", "block_size", "n_layer", "n_embd",
            "eval_interval"] + (["listops_val", "listops_depth"] if C.data == "listops" else ["eval_batches"])
    differ = [k for k in keys if ref.get(k) != getattr(C, k)]
    if ref.get("n_loops") != 1 or differ:
        raise ValueError(f"--reference={C.reference} must be a 1-loop run trained like this one; it has "
                         f"n_loops={ref.get('n_loops')}" + (f" and differs in {differ}" if differ else ""))
    return val_curve(records)


# --- the run: set up, train, finish -------------------------------------------------------

def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    cfg = get_config(argv)
    if cfg["compare"]:
        return compare(cfg, configurator.given_keys(argv))
    if cfg["evaluate"]:
        only_flags(configurator.given_keys(argv), "evaluate", ("test_loops", "device"))
        return evaluate_checkpoint(cfg["evaluate"], cfg["test_loops"], cfg["device"])
    resume = cfg["init_from"] == "resume"
    with training.RunFolder(cfg["out_dir"], "train_flt.py", RUN_FILES, cfg["overwrite"], resume) as folder:
        run = setup_run(cfg, argv, folder)
        try:
            nan_stop = train(run)
        except KeyboardInterrupt:
            raise training.interrupted(run.ckpt_path) from None
        return finish(run, nan_stop)


# What a run writes besides config.json, log.jsonl, summary.json, ckpt.pt: flt_report.py's figures and table.
RUN_FILES = ("flt_*.png", "compare.md")
COMPARE_DIR = "out/flt_compare"      # --compare's folder when --out_dir is not given: never a run's


def only_flags(given, mode, allowed):
    """--compare and --evaluate read finished runs: a training flag beside them would do nothing."""
    extra = [k for k in given if k not in (mode, "debug", *allowed)]
    if extra:
        raise ValueError(f"--{mode} reads finished runs and takes only {', '.join('--' + a for a in allowed)}; "
                         f"leave out {', '.join('--' + k for k in extra)}")


def compare(cfg, given):
    """--compare: the figures and compare.md of finished runs, drawn into a folder that
    holds no run (a run's own figures are never replaced), replacing only files an
    earlier --compare wrote there (training.claim_outputs)."""
    only_flags(given, "compare", ("out_dir",))
    out = cfg["out_dir"] if "out_dir" in given else COMPARE_DIR
    held = [f for f in training.RESULT_FILES if os.path.exists(os.path.join(out, f))]
    if held:
        raise FileExistsError(f"--out_dir={out} holds a run ({', '.join(held)}); --compare draws into a folder "
                              f"that is not a run, e.g. --out_dir={COMPARE_DIR}")
    outputs = training.claim_outputs(out, "train_flt.py --compare", ("compare.md",))
    try:
        return plot_runs(cfg["compare"].split(","), out)
    finally:
        outputs.release()


@dataclass
class Run:
    """What one training run holds; built by setup_run, which writes nothing until
    every check has passed."""
    C: SimpleNamespace          # the config, as attributes (cfg is the same as a dict)
    cfg: dict
    rt: training.Runtime
    raw: LoopedTransformer      # the bare model: checkpoints, hooks, evaluation
    model: torch.nn.Module      # what the step calls (raw, under torch.compile / DDP)
    optimizers: list
    base_lrs: list              # per optimizer, per group: the lr the schedule multiplies
    train: np.ndarray
    val: np.ndarray
    vocab: int
    is_bytes: bool
    model_args: dict
    ckpt_path: str
    log: training.RunLog
    say: object                 # print on rank 0 (through tqdm), silent elsewhere
    eval_xy: tuple = None       # the fixed eval set (x, y) (corpora.eval_set)
    ref_curve: dict = None      # the 1-loop reference's val curve {step: loss} (--reference)
    step: int = 0               # the step this call starts from (the checkpoint's on resume)
    wall_before: float = 0.0    # training seconds spent before this call (resumed runs)
    t_start: float = 0.0        # when this call's training loop started


def setup_run(cfg, argv, folder):
    """Check the flags, the out_dir, the data and the model; build the model and the
    optimizers (restored from out_dir/ckpt.pt with --init_from=resume); only then
    claim out_dir and start the log. Returns a Run."""
    cfg, ckpt, changed = resolve_config(cfg, argv)
    C = SimpleNamespace(**cfg)
    byte_data = C.data == "stdlib" or not os.path.isdir(C.data)
    model_args = dict(vocab_size=256 if byte_data else C.vocab_size, block_size=C.block_size,
                      n_layer=C.n_layer, n_loops=C.n_loops, n_head=C.n_head, n_embd=C.n_embd,
                      ffn_mult=C.ffn_mult, variant=C.variant, loss_type=C.loss_type, qk_norm=C.qk_norm,
                      softcap=C.softcap, lm_head_std=C.lm_head_std)
    LoopedConfig(**model_args)                       # refuses bad model flags before the data is read
    ref_curve = reference_curve(C) if C.reference else None
    rt = training.setup_runtime(C.device, C.dtype, C.seed)
    train, val, vocab, is_bytes = load_data_rank0_first(C, rt)
    training.record_fingerprint(cfg, training.data_fingerprint(array_pieces(train)))   # resume: the same data
    raw = LoopedTransformer(LoopedConfig(**model_args)).to(rt.device)
    optimizers = build_optimizers(raw, C, rt)
    base_lrs = [[C.lr_mult * g["lr"] for g in o.param_groups] for o in optimizers]   # from the flags, also on resume
    step, wall_before = restore(ckpt, raw, optimizers, os.path.join(C.out_dir, "ckpt.pt")) if ckpt else (0, 0.0)
    model = raw
    if C.compile:
        model = torch.compile(model)
    if rt.ddp:
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[rt.local_rank] if rt.device_type == "cuda" else None)
    resume = ckpt is not None
    folder.begin()                                                   # checks done: write
    log = training.RunLog(C.out_dir, cfg, keep=training.up_to_step(step) if resume else None,
                          command=shlex.join(["python", "train_flt.py", *argv]))
    if resume:
        log.log(step=step, event="resume", changed=changed)
    say = tqdm.write if rt.master else (lambda *a, **k: None)
    say(f"device {rt.device} ({rt.ptdtype}), world size {rt.world_size}; data: {len(train):,} train / "
        f"{len(val):,} val {'bytes' if is_bytes else 'tokens'}; {C.variant} x{C.n_loops} loops, "
        f"{raw.num_params():,} parameters" + (f"; resuming at step {step}" if step else ""))
    return Run(C, cfg, rt, raw, model, optimizers, base_lrs, train, val, vocab, is_bytes, model_args,
               os.path.join(C.out_dir, "ckpt.pt"), log, say, eval_set(val, C), ref_curve, step, wall_before)


def resolve_config(cfg, argv):
    """The config this call runs with: the command line's, or, with --init_from=resume,
    the checkpoint's in out_dir with the safe flags given now (training.resume_config).
    Returns (cfg, checkpoint or None, changed flags)."""
    if cfg["init_from"] != "resume":
        return cfg, None, {}
    ckpt = training.load_checkpoint(os.path.join(cfg["out_dir"], "ckpt.pt"))
    if "variant" not in ckpt["config"]:
        raise ValueError(f"{cfg['out_dir']}/ckpt.pt was not written by train_flt.py (train_spt.py's?); resume it "
                         f"with the script that wrote it")
    if not os.path.exists(os.path.join(cfg["out_dir"], "log.jsonl")):
        raise FileNotFoundError(f"{cfg['out_dir']}/log.jsonl is gone: the summary is computed from the whole log, "
                                f"so this run cannot be resumed; start it again with --overwrite=True")
    cfg, changed = configurator.resume_config(ckpt["config"], cfg, configurator.given_keys(argv), RESUME_SAFE,
                                          per_call=("stop_step", "debug"))
    if changed:
        print(f"resuming with changed flags (checkpoint's -> now): {changed}")
    return cfg, ckpt, changed


def load_data_rank0_first(C, rt):
    """corpora.load_data, run by rank 0 before the other DDP ranks (it may build a
    cache they then read). Refuses byte or token streams too short for one window."""
    if rt.ddp and not rt.master:
        dist.barrier()
    train, val, vocab, is_bytes = load_data(C)
    if rt.ddp and rt.master:
        dist.barrier()
    if train.ndim == 1 and min(len(train), len(val)) <= C.block_size + 1:
        raise ValueError(f"the data is too short for block_size={C.block_size}: "
                         f"{len(train)} train and {len(val)} val tokens")
    return train, val, vocab, is_bytes


def array_pieces(a, limit=2**26, n=1024, size=2**16):
    """The bytes of a training array to fingerprint: all of it up to `limit` bytes, else
    its shape and n evenly spaced slices of `size` bytes (a token file may be many GB)."""
    flat = np.asarray(a).reshape(-1)
    if flat.nbytes <= limit:
        return [str(a.shape).encode(), flat.tobytes()]
    step = max(1, size // flat.itemsize)
    starts = np.linspace(0, len(flat) - step, n).astype(np.int64)
    return [str(a.shape).encode()] + [flat[s:s + step].tobytes() for s in starts]


def build_optimizers(raw, C, rt):
    """The recipe's optimizers: [AdamW, Muon] for --optim=muon, [AdamW] for adamw."""
    betas = (C.beta1, C.beta2)
    if C.optim == "muon":
        return raw.configure_muon(C.lr, C.embedding_lr, C.unembedding_lr, betas, C.adam_eps,
                                  C.weight_decay, rt.device_type)
    return [raw.configure_optimizers(C.weight_decay, C.lr, betas, C.adam_eps, rt.device_type)]


def restore(ckpt, raw, optimizers, path):
    """Load a checkpoint's weights, optimizer states and RNG state into this run, so
    it continues exactly. Returns (step, training seconds spent so far)."""
    if not isinstance(ckpt["optimizer"], list):
        raise ValueError(f"{path} holds one optimizer state, not one per optimizer of the recipe; "
                         f"it cannot be resumed, only rerun")
    training.load_state(raw, ckpt["model"])
    for o, state in zip(optimizers, ckpt["optimizer"]):
        o.load_state_dict(state)
    torch.set_rng_state(ckpt["rng"].cpu())
    if "cuda_rng" in ckpt and torch.cuda.is_available():
        torch.cuda.set_rng_state(ckpt["cuda_rng"].cpu())
    return ckpt["step"], ckpt["wall_time"]


def train(r):
    """THE training loop, from r.step to max_steps (or --stop_step). One step: set the
    scheduled lr and momentum; per micro-batch, a batch, the forward pass and its loss,
    the backward pass; the gradient norm; clipping; the optimizer steps. Around it:
    diagnostics logged every step, val loss every eval_interval steps, a checkpoint
    every ckpt_interval. Returns the step whose loss or gradient was NaN/inf (the run
    stops there, nothing of that step kept), or None."""
    C, rt, raw = r.C, r.rt, r.raw
    params = [p for p in raw.parameters() if p.requires_grad]
    last_step = min(C.max_steps, C.stop_step) if C.stop_step > 0 else C.max_steps
    r.t_start = time.time()
    pbar = tqdm(range(r.step, last_step), initial=r.step, total=last_step, disable=not rt.master, desc=C.variant)
    recorder = BlockGradRecorder(raw.blocks, enabled=not C.compile)
    for it in pbar:
        set_schedules(r.optimizers, r.base_lrs, it, C)
        loss_sum, res_norms = 0.0, torch.zeros(C.n_loops, device=rt.device)
        recorder.start(C.n_loops, len(raw.blocks))
        for micro in range(C.grad_accum):
            x, y = get_batch(r.train, C, it, micro, rt.rank, device=rt.device)
            recorder.next_micro()
            with training.grad_sync(r.model, rt, last_micro=micro == C.grad_accum - 1), rt.autocast():
                _, loss, stats = r.model(x, y, return_stats=True)       # forward: loss on the chosen loops
            (loss / C.grad_accum).backward()                            # backward
            loss_sum += loss.item() / C.grad_accum
            res_norms += stats["residual_norms"] / C.grad_accum
        loss_now, res_norms = mean_over_ranks(loss_sum, res_norms, rt)
        g_total = training.grad_norm(params).item()                     # before clipping
        if not_finite(r, loss_now, g_total, it + 1):
            return it + 1
        block_norms = [training.grad_norm(b.parameters()).item() for b in raw.blocks]
        if C.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, C.grad_clip)         # clip
        for o in r.optimizers:
            o.step()                                                    # update
            o.zero_grad(set_to_none=True)
        done = it + 1
        r.log.log(step=done, loss=loss_now, lr=C.lr * C.lr_mult * lr_multiplier(it, C), grad_norm=g_total,
                  block_grad_norms=block_norms, residual_norms=[round(v, 4) for v in res_norms.tolist()],
                  **{f"{k}_grad_norms": v for k, v in recorder.norms(C.grad_accum).items()})
        pbar.set_postfix(loss=f"{loss_now:.3f}", res=f"{res_norms[-1].item():.1f}")
        print_eta(r, done, last_step)
        evaluate_and_checkpoint(r, done, last_step)
    pbar.close()
    return None


def set_schedules(optimizers, base_lrs, it, C):
    """Every group's lr = its base lr x lr_multiplier(it); Muon's momentum = muon_momentum(it)."""
    lr_now = lr_multiplier(it, C)
    for o, bases in zip(optimizers, base_lrs):
        for group, base in zip(o.param_groups, bases):
            group["lr"] = base * lr_now
            if isinstance(o, torch.optim.Muon):
                group["momentum"] = muon_momentum(it)


def mean_over_ranks(loss, res_norms, rt):
    """The step's loss (float) and per-loop residual norms (tensor), averaged over
    DDP ranks (unchanged without DDP)."""
    loss = all_reduce_mean(loss, rt)
    if rt.ddp:
        dist.all_reduce(res_norms)
        res_norms /= rt.world_size
    return loss, res_norms


def not_finite(r, loss, g_total, step):
    """True, after saying so, if the loss or the gradient norm of this step is NaN or
    inf: the caller stops before the optimizer step, so nothing of it is saved."""
    if math.isfinite(loss) and math.isfinite(g_total):
        return False
    r.say(f"stopping: the loss is {loss} and the gradient norm {g_total} at step {step}: the run "
          f"diverged. Nothing from this step was saved; {training.last_good_checkpoint(r.ckpt_path)}.")
    return True


def print_eta(r, done, last_step):
    """Once, 5 steps into this call: the seconds per step and the time left."""
    if done - r.step == 5 and r.rt.master:
        per_step = (time.time() - r.t_start) / 5
        r.say(f"{per_step:.2f} s/step; ETA {per_step * (last_step - done) / 60:.1f} min "
              f"for {last_step - done} more steps")


def evaluate_and_checkpoint(r, done, last_step):
    """After step `done`: log the val loss every eval_interval steps and at max_steps;
    save out_dir/ckpt.pt every ckpt_interval steps and at the last step of this call."""
    C = r.C
    if done % C.eval_interval == 0 or done == C.max_steps:
        ev = evaluate(r.raw, r.eval_xy, C.n_loops, r.rt)
        r.log.log(step=done, val_loss=ev["loss"][-1],
                  **({"val_accuracy": ev["accuracy"][-1]} if C.data == "listops" else {}))
    if done % C.ckpt_interval == 0 or done == last_step:
        save_run_checkpoint(r, done)


def save_run_checkpoint(r, steps_done):
    """ckpt.pt (rank 0, atomic): weights, optimizer states, step, the config, the RNG
    state and the training seconds so far: all that --init_from=resume needs."""
    if not r.rt.master:
        return
    state = {"model": r.raw.state_dict(), "optimizer": [o.state_dict() for o in r.optimizers],
             "step": steps_done, "model_args": r.model_args, "config": r.cfg, "rng": torch.get_rng_state(),
             "wall_time": r.wall_before + time.time() - r.t_start}
    if torch.cuda.is_available():
        state["cuda_rng"] = torch.cuda.get_rng_state()
    training.save_checkpoint(r.ckpt_path, state)


def finish(r, nan_stop):
    """After the loop: a run halted by --stop_step just says how to continue. A run
    that ended (at max_steps, or stopped by a NaN) gets summary.json, its figures
    and, on byte data with --sample_tokens, a sample. Returns the summary (None when halted)."""
    C, rt = r.C, r.rt
    if nan_stop is None and C.stop_step > 0 and C.stop_step < C.max_steps:
        r.say(f"stopped at step {C.stop_step} (--stop_step); continue with --init_from=resume")
        r.model = r.raw                          # the DDP wrapper goes before its process group
        training.close_ddp(rt)
        return None
    summary = summarize(r, nan_stop, r.wall_before + time.time() - r.t_start)
    if rt.ddp:
        summary["ddp_replicas_identical"] = replicas_identical(r.raw)
    r.log.summary(summary)
    if rt.master:
        r.say(training.to_json({k: v for k, v in summary.items() if not isinstance(v, list)}))
        if r.is_bytes and C.sample_tokens and nan_stop is None:
            prompt = torch.tensor([list(b"The ")], device=rt.device)
            out = r.raw.generate(prompt, C.sample_tokens, temperature=0.8, top_k=40)[0].tolist()
            r.say(bytes(out).decode("utf-8", errors="replace"))
        plot_runs([C.out_dir], C.out_dir, quiet=True)
    r.model = r.raw                              # the DDP wrapper goes before its process group
    training.close_ddp(rt)
    return summary


def all_reduce_mean(value, rt):
    """Mean of a python float over DDP ranks (identity without DDP)."""
    if not rt.ddp:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=rt.device)
    dist.all_reduce(t)
    return t.item() / rt.world_size


def replicas_identical(model):
    """DDP sanity check: every rank holds bit-identical weights (per-tensor sums agree)."""
    sums = torch.stack([p.detach().double().sum() for p in model.parameters()])
    lo, hi = sums.clone(), sums.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    return bool(torch.equal(lo, hi))


def summarize(r, nan_stop, wall_time):
    """summary.json: what a table of runs needs, computed from log.jsonl (so a
    resumed run is summarised over its whole history) and one final evaluation on
    the eval set, read at 1..n_test inference loops (the test-time loop curve)."""
    C, rt = r.C, r.rt
    records = training.read_log(C.out_dir) if rt.master else []
    steps = [rec for rec in records if "loss" in rec]
    val = val_curve(records)
    tail = steps[len(steps) - max(1, len(steps) // 10):]
    final_train = float(np.mean([rec["loss"] for rec in tail])) if tail else float("nan")
    h_unigram = unigram_entropy(r.train, r.vocab)
    n_test = max(C.test_loops or max(2 * C.n_loops, 12), C.n_loops)
    curve = evaluate(r.raw, r.eval_xy, n_test, rt) if nan_stop is None else {}
    reason = "nan" if nan_stop is not None else ("plateau" if final_train >= 0.95 * h_unigram else None)
    out = {
        "variant": C.variant, "n_loops": C.n_loops, "n_layer": C.n_layer, "n_embd": C.n_embd,
        "loss_type": C.loss_type, "params": r.raw.num_params(), "steps": len(steps),
        "final_train_loss": final_train,
        "min_train_loss": float(min(rec["loss"] for rec in steps)) if steps else float("nan"),
        "final_val_loss": curve["loss"][C.n_loops - 1] if curve else float("nan"),
        "val_steps": sorted(val), "val_curve": [val[k] for k in sorted(val)],
        "eval_set_size": len(r.eval_xy[0]),
        "unigram_entropy": h_unigram,
        **gradient_statistics([rec["grad_norm"] for rec in steps[:C.osc_steps]]),
        **residual_statistics(steps, C.n_loops),
        "diverged": reason is not None, "diverged_reason": reason, "nan_step": nan_stop,
        "test_loops": list(range(1, len(curve.get("loss", [])) + 1)), "test_val_loss": curve.get("loss", []),
        "test_hidden_norm": curve.get("hidden_norm", []), "test_logit_entropy": curve.get("logit_entropy", []),
        **({"final_val_accuracy": curve["accuracy"][C.n_loops - 1] if curve else float("nan"),
            "test_val_accuracy": curve.get("accuracy", [])} if C.data == "listops" else {}),
        "wall_time_s": round(wall_time, 1),
    }
    if r.ref_curve is not None:
        out.update(collapse_fields(C.reference, val, r.ref_curve, out["final_val_loss"], h_unigram))
    if r.is_bytes:
        out["final_val_bpb"] = out["final_val_loss"] / math.log(2)
    return out


def gradient_statistics(g):
    """The summary's gradient fields from the first osc_steps total gradient norms g
    (before clipping): volatility (also under its former name grad_osc), the two
    oscillation tests, and the largest norm (flt_report.py defines the statistics)."""
    vol = grad_volatility(g)
    return {"grad_volatility": vol, "grad_osc": vol, "grad_dlog_ac1": grad_dlog_ac1(g),
            "grad_zigzag": grad_zigzag(g), "grad_osc_steps": len(g),
            "max_grad_norm": float(max(g)) if len(g) else float("nan")}


def residual_statistics(steps, n_loops):
    """The summary's residual-norm fields, per loop: at the first and last step, the
    peak over training and the step of the peak; and the largest over loops and steps."""
    if not steps:
        return {"residual_norm_first": [], "residual_norm_last": [], "residual_norm_peak": [],
                "residual_norm_peak_step": [], "max_residual_norm": float("nan")}
    res = np.array([rec["residual_norms"] for rec in steps]).reshape(len(steps), n_loops)
    return {"residual_norm_first": res[0].tolist(), "residual_norm_last": res[-1].tolist(),
            "residual_norm_peak": res.max(0).tolist(),
            "residual_norm_peak_step": [steps[i]["step"] for i in res.argmax(0)],
            "max_residual_norm": float(res.max())}


def collapse_fields(reference, val, ref_curve, final_loss, h_unigram):
    """The summary's collapse fields: the rule on the run's val curve {step: loss}
    against the reference's at the steps both have, and kept = (H - final loss) /
    (H - the reference's final loss)."""
    ref_final = ref_curve[max(ref_curve)]
    verdict, why = judge_curves(val, ref_curve, final_loss, h_unigram)
    kept = (h_unigram - final_loss) / (h_unigram - ref_final) if h_unigram - ref_final > 0 else float("nan")
    return {"reference": reference, "reference_val_loss": ref_final,
            "reference_val_curve": [ref_curve[k] for k in sorted(set(val) & set(ref_curve))],
            "collapse": verdict, "collapse_reason": why, "collapse_kept": kept}


def evaluate_checkpoint(run_dir, test_loops=0, device="auto"):
    """The test-time loop curve of a finished run, from its ckpt.pt and config:
    evaluate() on the run's eval set at 1..test_loops loops (0 = max(2K, 12)).
    Prints one line per loop count and returns the dict of lists. Writes nothing."""
    ckpt = training.load_checkpoint(os.path.join(run_dir, "ckpt.pt"))
    if "variant" not in ckpt["config"] or "model_args" not in ckpt:
        raise ValueError(f"--evaluate={run_dir} is not a run of train_flt.py (its checkpoint has no looped model); "
                         f"evaluate only train_flt.py runs")
    C = SimpleNamespace(**{**DEFAULTS, **ckpt["config"]})       # keys added since the run: their defaults
    rt = training.setup_runtime(device, "float32", C.seed)
    model = LoopedTransformer(LoopedConfig(**ckpt["model_args"])).to(rt.device)
    training.load_state(model, ckpt["model"])
    _, val, _, _ = load_data(C)
    n_test = max(test_loops or max(2 * C.n_loops, 12), 1)
    curve = evaluate(model, eval_set(val, C), n_test, rt)
    print(f"{run_dir}: {C.variant} trained at K={C.n_loops}, step {ckpt['step']}; per inference loop count:")
    for t in range(n_test):
        print(f"  {t + 1:3d} loops: loss {curve['loss'][t]:.4f}  accuracy {curve['accuracy'][t]:.4f}  "
              f"entropy {curve['logit_entropy'][t]:.4f}  hidden norm {curve['hidden_norm'][t]:.2f}")
    return curve


if __name__ == "__main__":
    result = configurator.run_cli(main)
    sys.exit(2 if isinstance(result, dict) and result.get("diverged_reason") == "nan" else 0)
