"""
The plumbing that train_spt.py and train_flt.py share, kept in one place so each
training script shows only its own experiment (as nanoGPT keeps configurator.py
apart from train.py):

  configure        module-level defaults overridden by --key=value, type-checked
  setup_runtime    device, dtype, autocast and torchrun DDP (gloo on CPU, nccl on GPU)
  lr_at            warmup then cosine or linear decay
  save_checkpoint  atomic write (temp file + rename), weights_only-safe contents
  load_checkpoint  torch.load(weights_only=True)
  load_state       load weights, listing every mismatched parameter on error
  RunLog           config.json, log.jsonl and summary.json in out_dir
"""

import ast
import json
import math
import os
import sys
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist


# -----------------------------------------------------------------------------
# --key=value overrides of a script's module-level defaults

def configure(defaults, argv=None, doc=""):
    """Return a copy of `defaults` (a dict name -> value) with --key=value
    overrides applied. Values are parsed as Python literals when possible
    (--lr=3e-4, --depth=2, --compile=True) and must keep the default's type
    (an int default also accepts nothing but an int; a float accepts an int).
    Unknown keys and wrong types raise ValueError naming the valid keys.
    --help prints every key with its default and exits."""
    argv = sys.argv[1:] if argv is None else argv
    config = dict(defaults)
    for arg in argv:
        if arg in ("-h", "--help"):
            print(doc.strip() + "\n\nkeys (--key=value) and their defaults:")
            for k, v in defaults.items():
                print(f"  --{k}={v!r}")
            sys.exit(0)
        if not arg.startswith("--") or "=" not in arg:
            raise ValueError(f"argument {arg!r} is not of the form --key=value (try --help)")
        key, text = arg[2:].split("=", 1)
        if key not in defaults:
            raise ValueError(f"unknown key {key!r}; valid keys: {', '.join(defaults)}")
        config[key] = _parse_value(key, text, defaults[key])
    return config


def _parse_value(key, text, default):
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        value = text                                  # a bare word: keep it as a string
    if isinstance(default, bool):
        if isinstance(value, str) and value.lower() in ("true", "false"):
            value = value.lower() == "true"
        ok = isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, str):
        value, ok = text, True                        # strings are taken verbatim
    else:                                             # None or a container default
        ok = default is None or isinstance(value, type(default))
    if not ok:
        raise ValueError(f"--{key}={text} has the wrong type: expected "
                         f"{type(default).__name__} like the default {default!r}")
    return value


# -----------------------------------------------------------------------------
# Device, precision and torchrun DDP

@dataclass
class Runtime:
    device: str
    device_type: str         # "cuda" or "cpu" (or "mps")
    ptdtype: torch.dtype
    autocast: object         # a context manager factory: `with rt.autocast():`
    ddp: bool
    rank: int
    local_rank: int
    world_size: int

    @property
    def master(self):
        return self.rank == 0


def setup_runtime(device="auto", dtype="auto", seed=0):
    """Pick the device (cuda if present), the autocast dtype (bfloat16 on a GPU
    that supports it, float32 on CPU), and join the torchrun process group when
    launched by torchrun (RANK in the environment). Seeds every rank equally, so
    replicas start from identical weights."""
    ddp = int(os.environ.get("RANK", -1)) != -1
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and ddp:
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(device)
    device_type = "cuda" if device.startswith("cuda") else device.split(":")[0]
    if ddp:
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
    if dtype == "auto":
        dtype = "bfloat16" if device_type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"dtype={dtype!r}; choose float32, bfloat16, float16 or auto")
    ptdtype = getattr(torch, dtype)
    if device_type == "cpu":
        torch.set_flush_denormal(True)   # denormal floats made some CPU runs ~4x slower
    if device_type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    def autocast():
        if ptdtype == torch.float32:
            return nullcontext()
        return torch.autocast(device_type=device_type, dtype=ptdtype)

    torch.manual_seed(seed)
    return Runtime(device, device_type, ptdtype, autocast, ddp, rank, local_rank, world_size)


def all_reduce_mean(value, rt):
    """Mean of a python float over DDP ranks (identity without DDP)."""
    if not rt.ddp:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=rt.device)
    dist.all_reduce(t)
    return t.item() / rt.world_size


# -----------------------------------------------------------------------------
# Learning-rate schedule

def lr_at(step, max_steps, lr, warmup_steps=0, schedule="cosine", min_lr_frac=0.1):
    """Linear warmup to `lr`, then cosine (or linear, or constant) decay to min_lr_frac * lr."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "constant" or max_steps <= warmup_steps:
        return lr
    progress = min(1.0, (step - warmup_steps) / (max_steps - warmup_steps))
    if schedule == "cosine":
        decay = 0.5 * (1.0 + math.cos(math.pi * progress))
    elif schedule == "linear":
        decay = 1.0 - progress
    else:
        raise ValueError(f"schedule={schedule!r}; choose cosine, linear or constant")
    return lr * (min_lr_frac + (1.0 - min_lr_frac) * decay)


# -----------------------------------------------------------------------------
# Checkpoints: atomic on write, weights_only on read

def save_checkpoint(path, state):
    """Write to a temp file in the same folder, then rename: a crash mid-write never
    leaves a half checkpoint under `path`. `state` holds tensors, numbers, strings
    and plain containers only (configs as dicts), so weights_only loading works."""
    tmp = f"{path}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path, map_location="cpu"):
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    return torch.load(path, map_location=map_location, weights_only=True)


def load_state(model, state_dict, strict=True):
    """model.load_state_dict with an error that lists every parameter whose shape
    differs, and every missing or unexpected name, in one message."""
    own = model.state_dict()
    mismatched = [f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(own[k].shape)}"
                  for k, v in state_dict.items() if k in own and own[k].shape != v.shape]
    missing = [k for k in own if k not in state_dict] if strict else []
    unexpected = [k for k in state_dict if k not in own] if strict else []
    if mismatched or missing or unexpected:
        lines = (["shape mismatch:"] + mismatched if mismatched else []) + \
                (["missing in checkpoint: " + ", ".join(missing)] if missing else []) + \
                (["not in model: " + ", ".join(unexpected)] if unexpected else [])
        raise ValueError("checkpoint does not fit the model (check the model flags, e.g. "
                         "n_embd, n_layer, vocab_size, max_len):\n  " + "\n  ".join(lines))
    model.load_state_dict(state_dict, strict=strict)


def unwrap(model):
    """The bare model under DDP and torch.compile wrappers."""
    model = model.module if hasattr(model, "module") else model
    return getattr(model, "_orig_mod", model)


def grad_norm(parameters):
    """Total L2 norm of the gradients (what clip_grad_norm_ measures)."""
    norms = [p.grad.detach().norm() for p in parameters if p.grad is not None]
    return torch.stack(norms).norm() if norms else torch.zeros(())


# -----------------------------------------------------------------------------
# Results as files: config.json, log.jsonl, summary.json

class RunLog:
    """Writes only on the master rank. log.jsonl gets one JSON object per call of
    log(). When resuming an interrupted run, the records written before its
    checkpoint are kept and new ones appended: resume_step=N keeps those with
    step <= N, or keep=f keeps those for which f(record) is true. Otherwise the
    log starts anew."""

    def __init__(self, out_dir, config, master=True, resume_step=None, keep=None):
        self.out_dir, self.master = out_dir, master
        if resume_step is not None:
            keep = lambda r: r.get("step", 0) <= resume_step
        if master:
            os.makedirs(out_dir, exist_ok=True)
            write_json(os.path.join(out_dir, "config.json"), config)
            path = os.path.join(out_dir, "log.jsonl")
            kept = [r for r in read_log(out_dir) if keep(r)] if keep and os.path.exists(path) else []
            with open(path, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in kept)

    def log(self, **record):
        if self.master:
            with open(os.path.join(self.out_dir, "log.jsonl"), "a") as f:
                f.write(json.dumps(record) + "\n")

    def summary(self, summary):
        if self.master:
            write_json(os.path.join(self.out_dir, "summary.json"), summary)


def write_json(path, obj):
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2)
    os.replace(tmp, path)


def read_log(out_dir):
    """The records of a run's log.jsonl, as a list of dicts."""
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]
