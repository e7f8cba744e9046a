"""
The plumbing that train_spt.py and train_flt.py share, kept in one place so each
training script shows only its own experiment (as nanoGPT keeps configurator.py
apart from train.py):

  run_cli          a user error exits with one line, no traceback (--debug=True shows it)
  configure        module-level defaults overridden by --key=value, type-checked
  check_ranges     every numeric flag inside its range, before any work
  resume_config    what a resumed run continues with (safe flags may change)
  setup_runtime    device, dtype, autocast and torchrun DDP (gloo on CPU, nccl on GPU)
  lr_at            warmup then cosine or linear decay
  save_checkpoint  atomic write (temp file + rename), finite weights only
  load_checkpoint  torch.load(weights_only=True), naming the file on any failure
  load_state       load weights, listing every mismatched parameter on error
  check_out_dir    refuse a folder that holds another run, before any work
  claim_out_dir    the lock file that keeps a second writer out
  RunLog           config.json, log.jsonl and summary.json in out_dir
"""

import ast
import atexit
import fnmatch
import json
import math
import os
import pickle
import sys
import zipfile
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist


# -----------------------------------------------------------------------------
# User errors: one line on stderr, never a traceback

# What a user can cause: a bad flag, a missing or malformed file, a folder in use, a
# run that diverged. Anything else is a bug in this code and keeps its traceback.
USER_ERRORS = (ValueError, FloatingPointError, FileNotFoundError, FileExistsError,
               PermissionError, IsADirectoryError, NotADirectoryError)


def run_cli(main, argv=None):
    """Call main(argv). A user error exits with status 1 and the single line
    'error: ...' on stderr; --debug=True shows the traceback instead. Ctrl-C says
    how to continue and exits with 130."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        return main(argv)
    except USER_ERRORS as e:
        if "--debug=True" in argv:
            raise
        sys.exit("error: " + " ".join(str(e).split()))      # one line, whatever the message
    except KeyboardInterrupt:
        sys.exit("interrupted; the last checkpoint is kept: continue with --init_from=resume")


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
    if isinstance(default, float) and isinstance(value, str):
        try:
            value = float(text)                       # nan, inf: refused just below
        except ValueError:
            pass
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"--{key}={text} is not a finite number")
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


def given_keys(argv):
    """The keys set explicitly on this command line."""
    return [a[2:].split("=", 1)[0] for a in argv if a.startswith("--") and "=" in a]


def flag_value(argv, key, default):
    """The raw text of --key=... on this command line, the last one winning as in
    configure(); default if it is absent. For the keys that pick other defaults."""
    given = [a.split("=", 1)[1] for a in argv if a.startswith(f"--{key}=")]
    return given[-1] if given else default


def check_ranges(cfg, positive=(), nonnegative=(), fractions=()):
    """Refuse, before any work, a flag outside its range: `positive` must be > 0,
    `nonnegative` >= 0, `fractions` in [0, 1)."""
    for keys, ok, allowed in ((positive, lambda v: v > 0, "> 0"),
                              (nonnegative, lambda v: v >= 0, ">= 0"),
                              (fractions, lambda v: 0 <= v < 1, "in [0, 1)")):
        for k in keys:
            if not ok(cfg[k]):
                raise ValueError(f"--{k}={cfg[k]} is out of range: it must be {allowed}")


def parse_int_list(key, text):
    """'1,10,50' -> {1, 10, 50}; anything else names the flag."""
    try:
        values = {int(e) for e in text.split(",") if e.strip()}
    except ValueError:
        raise ValueError(f"--{key}={text} must be a comma list of positive integers, e.g. 1,10,50") from None
    if any(v <= 0 for v in values):
        raise ValueError(f"--{key}={text} must be a comma list of positive integers, e.g. 1,10,50")
    return values


def resume_config(saved, given, explicit, safe, per_call=("debug",)):
    """The config a resumed run continues with: the checkpoint's own, with out_dir
    set to the folder given (a moved or copied folder resumes where it now is), and
    with each flag named on this command line (`explicit`) applied when it is in
    `safe` (it does not change what has been computed so far, e.g. lr, max_hours).
    A flag that differs from the checkpoint's and is not safe is refused. Flags in
    `per_call` (e.g. where to stop this call) always take this command line's value.
    Returns (config, changed), changed = {key: [checkpoint's value, new value]}."""
    config, changed, refused = dict(saved), {}, []
    for k in [k for k in given if k not in saved]:        # keys added to the script since
        config[k] = given[k]
    for k in explicit:
        if k in ("init_from", "out_dir") or given[k] == saved.get(k):
            continue
        if k in safe:
            config[k], changed[k] = given[k], [saved.get(k), given[k]]
        else:
            refused.append(f"--{k}={given[k]} (the checkpoint has {saved.get(k)!r})")
    if refused:
        raise ValueError(f"--init_from=resume cannot change {', '.join(refused)}: the run would no "
                         f"longer be the one checkpointed. Flags it may change: {', '.join(safe)}. "
                         f"To change the others, start a new run in another --out_dir")
    if saved.get("out_dir") != given["out_dir"]:
        changed["out_dir"] = [saved.get("out_dir"), given["out_dir"]]
    config["out_dir"], config["init_from"] = given["out_dir"], "resume"
    config.update({k: given[k] for k in per_call})
    config["resumes"] = list(saved.get("resumes", [])) + [changed]
    return config, changed


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
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device={device} but this machine has no CUDA GPU; use --device=cpu or auto")
    if device.split(":")[0] not in ("cpu", "cuda", "mps"):
        raise ValueError(f"--device={device}; choose auto, cpu, cuda, cuda:N or mps")
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
    and plain containers only (configs as dicts), so weights_only loading works.
    Weights that are not all finite are never written (FloatingPointError)."""
    if not weights_finite(state.get("model", {})):
        raise FloatingPointError(f"not writing {path}: the weights hold NaN or inf")
    tmp = f"{path}.tmp.{os.getpid()}"                  # unique per process
    torch.save(state, tmp)
    os.replace(tmp, path)


def weights_finite(state_dict):
    return all(torch.isfinite(v).all() for v in state_dict.values()
               if torch.is_tensor(v) and v.is_floating_point())


def load_checkpoint(path, map_location="cpu"):
    """torch.load(weights_only=True), with one line naming the file when it is
    missing, truncated, not a checkpoint of this project, or holds objects that
    are not tensors (refused: loading those could run code)."""
    path = str(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    with open(path, "rb") as f:
        head = f.read(4)
    if not head:
        raise ValueError(f"checkpoint {path} is empty")
    if head != b"PK\x03\x04":                            # torch.save always writes a zip archive
        raise ValueError(f"checkpoint {path} is not a checkpoint of this project (not a torch.save file)")
    if not zipfile.is_zipfile(path):
        raise ValueError(f"checkpoint {path} is truncated (an interrupted copy?); use an earlier checkpoint")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        if "weights_only" in str(e) or "Unsupported global" in str(e):
            raise ValueError(f"checkpoint {path} refused: it contains objects that are not tensors, "
                             f"numbers or strings, so it was not written by this project") from None
        raise ValueError(f"checkpoint {path} is not a checkpoint of this project ({e.__class__.__name__})") from None
    except (RuntimeError, EOFError, OSError, KeyError, zipfile.BadZipFile) as e:
        why = (str(e).strip().splitlines() or [e.__class__.__name__])[0][:80]
        raise ValueError(f"checkpoint {path} is damaged: truncated or not a checkpoint of this "
                         f"project ({why})") from None
    if not isinstance(state, dict) or "model" not in state:
        raise ValueError(f"checkpoint {path} is not a checkpoint of this project (no 'model' weights in it)")
    return state


def last_good_checkpoint(path):
    """A sentence naming `path` and its step if it loads and holds finite weights,
    else saying there is none: what a stopped run tells its user to resume from."""
    try:
        state = load_checkpoint(path)
    except (ValueError, FileNotFoundError):
        return "there is no usable checkpoint (none was written yet)"
    if not weights_finite(state["model"]):
        return f"{path} holds NaN weights, so there is no usable checkpoint"
    return f"the last good checkpoint is {path} (step {state.get('step', '?')})"


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
# Run folders: never silently reused, one writer at a time

RESULT_FILES = ("config.json", "log.jsonl", "summary.json", "ckpt.pt")
RUN_FILES = RESULT_FILES + ("snapshots.jsonl", "*.pt", "*.png", "compare.md", "report.md", "*.tmp.*")


def check_out_dir(out_dir, overwrite=False, resume=False):
    """Before any work, and writing nothing: out_dir must be a folder that can be
    created and written, and must not hold another run's results unless the user
    asked to replace them (--overwrite=True) or to continue them (resume). Under
    torchrun only rank 0 checks: the others would see rank 0's files."""
    if int(os.environ.get("RANK", 0)) != 0:
        return
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise NotADirectoryError(f"--out_dir={out_dir} is a file, not a folder; choose another --out_dir")
    parent = os.path.abspath(out_dir)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(f"--out_dir={out_dir} cannot be written ({parent} is not a writable "
                              f"folder); choose another --out_dir")
    found = [f for f in RESULT_FILES if os.path.exists(os.path.join(out_dir, f))]
    if resume and "ckpt.pt" not in found:
        raise FileNotFoundError(f"--init_from=resume but {os.path.join(out_dir, 'ckpt.pt')} does not exist; "
                                f"give the folder of the run to continue with --out_dir")
    if found and not resume and not overwrite:
        raise FileExistsError(f"--out_dir={out_dir} already holds a run ({', '.join(found)}); choose another "
                              f"--out_dir, continue it with --init_from=resume, or replace it with --overwrite=True")


def claim_out_dir(out_dir, overwrite=False, master=True):
    """Create out_dir and take its lock (out_dir/run.lock, holding our pid) for the
    life of this process; a second live writer is refused. With overwrite, the
    previous run's files (RUN_FILES patterns only) are removed first, so old and
    new results never sit side by side."""
    if not master:
        return
    os.makedirs(out_dir, exist_ok=True)
    lock = os.path.join(out_dir, "run.lock")
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        holder = _lock_holder(lock)
        if holder is not None:
            raise FileExistsError(f"--out_dir={out_dir} is in use by another run (pid {holder}, see "
                                  f"{lock}); wait for it or choose another --out_dir") from None
        os.remove(lock)                                    # left by a run that was killed
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    with os.fdopen(fd, "w") as f:
        f.write(str(os.getpid()))
    atexit.register(_release, lock)
    if overwrite:
        for name in os.listdir(out_dir):
            if any(fnmatch.fnmatch(name, p) for p in RUN_FILES) and os.path.isfile(os.path.join(out_dir, name)):
                os.remove(os.path.join(out_dir, name))


def _lock_holder(lock):
    """The pid in a lock file if that process is alive (and not us), else None."""
    try:
        with open(lock) as f:
            pid = int(f.read().strip() or 0)
        if pid <= 0 or pid == os.getpid():
            return None
        os.kill(pid, 0)
        return pid
    except (ValueError, ProcessLookupError, FileNotFoundError):
        return None
    except PermissionError:                                # alive, another user's
        return pid


def _release(lock):
    if os.path.exists(lock) and _lock_holder(lock) is None:
        os.remove(lock)


def release_out_dir(out_dir):
    """Give up the lock taken by claim_out_dir (also done at exit)."""
    _release(os.path.join(out_dir, "run.lock"))


# -----------------------------------------------------------------------------
# Results as files: config.json, log.jsonl, summary.json

class RunLog:
    """Writes only on the master rank. log.jsonl gets one JSON object per call of
    log(). When resuming an interrupted run, the records written before its
    checkpoint are kept and new ones appended: resume_step=N keeps those with
    step <= N, or keep=f keeps those for which f(record) is true. Otherwise the
    log starts anew. Create it only after claim_out_dir."""

    def __init__(self, out_dir, config, master=True, resume_step=None, keep=None):
        self.out_dir, self.master = out_dir, master
        if resume_step is not None:
            keep = lambda r: r.get("step", 0) <= resume_step
        if master:
            os.makedirs(out_dir, exist_ok=True)
            write_json(os.path.join(out_dir, "config.json"), config)
            path = os.path.join(out_dir, "log.jsonl")
            kept = [r for r in read_log(out_dir) if keep(r)] if keep and os.path.exists(path) else []
            tmp = f"{path}.tmp.{os.getpid()}"
            with open(tmp, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in kept)
            os.replace(tmp, path)

    def log(self, **record):
        if self.master:
            with open(os.path.join(self.out_dir, "log.jsonl"), "a") as f:
                f.write(json.dumps(record) + "\n")

    def summary(self, summary):
        if self.master:
            write_json(os.path.join(self.out_dir, "summary.json"), summary)


def write_json(path, obj):
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2)
    os.replace(tmp, path)


def read_log(out_dir):
    """The records of a run's log.jsonl, as a list of dicts. A last line cut short
    (the run was killed mid-write) is dropped with a warning; a bad line anywhere
    else is an error naming the file and line."""
    path = os.path.join(out_dir, "log.jsonl")
    with open(path) as f:
        lines = [line for line in f if line.strip()]
    records = []
    for i, line in enumerate(lines):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i < len(lines) - 1:
                raise ValueError(f"{path}, line {i + 1}: not a JSON record; the log is damaged") from None
            print(f"warning: {path}: dropped its last line, cut short ({line[:40]!r}...)", file=sys.stderr)
    return records
