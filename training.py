"""
The plumbing that train_spt.py and train_flt.py share, so that each training
script shows only its own experiment (the command line is configurator.py's):

  setup_runtime  device, dtype, autocast and torchrun DDP (gloo on CPU, nccl on GPU)
  lr_at          warmup then cosine or linear decay
  checkpoints    atomic, finite-only writes; weights-only, checksummed reads
  RunFolder      the out_dir: locked first, never silently reused, left as found if the run is refused
  RunLog         config.json, log.jsonl and summary.json in out_dir
"""

import errno
import fcntl
import fnmatch
import json
import math
import os
import shutil
import sys
import zipfile
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist

# -----------------------------------------------------------------------------
# Device, precision and torchrun DDP

@dataclass
class Runtime:
    device: str
    device_type: str         # "cuda", "cpu" or "mps"
    ptdtype: torch.dtype
    ddp: bool
    rank: int
    local_rank: int
    world_size: int

    @property
    def master(self):
        return self.rank == 0

    def autocast(self):
        """`with rt.autocast():` runs the forward in ptdtype (nothing to do in float32)."""
        if self.ptdtype == torch.float32:
            return nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.ptdtype)


def setup_runtime(device="auto", dtype="auto", seed=0):
    """Pick the device (cuda if present), the autocast dtype (bfloat16 on a GPU that has
    it, else float32), join the torchrun process group when launched by torchrun (RANK
    in the environment), and seed every rank alike so replicas start identical."""
    env = lambda k, d: int(os.environ.get(k, d))
    ddp, rank, local_rank, world_size = env("RANK", -1) != -1, env("RANK", 0), env("LOCAL_RANK", 0), env("WORLD_SIZE", 1)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    kind = device.split(":")[0]
    if kind not in ("cpu", "cuda", "mps"):
        raise ValueError(f"--device={device}; choose auto, cpu, cuda, cuda:N or mps")
    if (kind == "cuda" and not torch.cuda.is_available()) or (kind == "mps" and not torch.backends.mps.is_available()):
        raise ValueError(f"--device={device} but this machine has no {kind} device; use --device=cpu or auto")
    if kind == "cuda" and ddp:
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(device)
    if ddp:
        dist.init_process_group(backend="nccl" if kind == "cuda" else "gloo")
    if dtype == "auto":
        dtype = "bfloat16" if kind == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    if dtype == "fast":     # bf16 only where the hardware computes it: emulated, it is ~5x slower
        dtype = "bfloat16" if native_bf16(kind) else "float32"
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"--dtype={dtype}; choose float32, bfloat16, float16, auto or fast")
    if kind == "cpu":
        torch.set_flush_denormal(True)   # denormal floats made some CPU runs ~4x slower
    if kind == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(seed)
    return Runtime(device, kind, getattr(torch, dtype), ddp, rank, local_rank, world_size)


def native_bf16(kind):
    """Does this device compute bfloat16 matrix products in hardware? A GPU that says so;
    a CPU whose flags (Linux /proc/cpuinfo) include AVX512-BF16, AMX-BF16 or Arm's BF16.
    An AVX2-only CPU emulates them: a bf16-autocast step there took 5x the float32 one."""
    if kind == "cuda":
        return torch.cuda.is_bf16_supported()
    return kind == "cpu" and bool({"avx512_bf16", "amx_bf16", "bf16"} & cpu_flags())


def cpu_flags():
    """The CPU's feature flags, as Linux lists them (empty elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            return {w for line in f if line.lower().startswith(("flags", "features")) for w in line.split()}
    except OSError:
        return set()


# -----------------------------------------------------------------------------
# Learning-rate schedule

def lr_at(step, max_steps, lr, warmup_steps=0, schedule="cosine", min_lr_frac=0.1):
    """Linear warmup to `lr`, then cosine (or linear, or constant) decay to min_lr_frac * lr."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "constant" or max_steps <= warmup_steps:
        return lr
    progress = min(1.0, (step - warmup_steps) / (max_steps - warmup_steps))
    if schedule not in ("cosine", "linear"):
        raise ValueError(f"schedule={schedule!r}; choose cosine, linear or constant")
    decay = 0.5 * (1.0 + math.cos(math.pi * progress)) if schedule == "cosine" else 1.0 - progress
    return lr * (min_lr_frac + (1.0 - min_lr_frac) * decay)


# -----------------------------------------------------------------------------
# Checkpoints: atomic and finite on write, weights-only and checksummed on read

def save_checkpoint(path, state):
    """Write to a temp file beside `path`, then rename: a crash or a full disk never leaves
    a half checkpoint under `path`. `state` holds tensors, numbers, strings and plain
    containers only (weights-only loading works). Non-finite weights are never written."""
    if not weights_finite(state.get("model", {})):
        raise FloatingPointError(f"not writing {path}: the weights hold NaN or inf")
    atomic_write(path, lambda tmp: torch.save(state, tmp))


def atomic_write(path, write):
    """write(tmp), then rename tmp to path; on failure the temp file is removed, and a full
    disk (which torch.save reports as a RuntimeError) is an OSError(ENOSPC) naming the file."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        write(tmp)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        if getattr(e, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or \
                shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free < 2**20:
            raise OSError(errno.ENOSPC, f"no space left to write {path}; free some space, then continue "
                                        f"with --init_from=resume") from None
        raise


def weights_finite(state_dict):
    return all(torch.isfinite(v).all() for v in state_dict.values() if torch.is_tensor(v) and v.is_floating_point())


def load_checkpoint(path, map_location="cpu"):
    """torch.load(weights_only=True), with one line naming the file when it is missing,
    empty, truncated or damaged (every zip member's CRC is checked), not a checkpoint of
    this project, or holds objects that are not tensors (loading those could run code)."""
    path = str(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    with open(path, "rb") as f:
        head = f.read(4)
    if head != b"PK\x03\x04":                              # torch.save always writes a zip archive
        raise ValueError(f"checkpoint {path} is " + ("empty" if not head else "not a checkpoint of this project"))
    try:
        with zipfile.ZipFile(path) as z:
            damaged = z.testzip()
        state = None if damaged else torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:                                # zipfile and torch raise many kinds here
        if "weights_only" in str(e) or "Unsupported global" in str(e):
            raise ValueError(f"checkpoint {path} refused: it contains objects that are not tensors, numbers or "
                             f"strings, so it was not written by this project") from None
        raise ValueError(f"checkpoint {path} is truncated or damaged ({type(e).__name__}); use an earlier "
                         f"checkpoint") from None
    if damaged:
        raise ValueError(f"checkpoint {path} is damaged ({damaged} fails its checksum); use an earlier checkpoint")
    if not isinstance(state, dict) or "model" not in state:
        raise ValueError(f"checkpoint {path} is not a checkpoint of this project (no 'model' weights in it)")
    return state


def interrupted(ckpt_path):
    """The KeyboardInterrupt a script re-raises on Ctrl-C, saying how to go on."""
    how = last_good_checkpoint(ckpt_path)
    if how.startswith("the last good"):
        return KeyboardInterrupt(f"{how}: continue with --init_from=resume --out_dir={os.path.dirname(ckpt_path)}")
    return KeyboardInterrupt(f"{how}: start again with --overwrite=True")


def last_good_checkpoint(path):
    """A sentence naming `path` and its step if it loads with finite weights, else saying
    there is none: what a stopped run tells its user to resume from."""
    try:
        state = load_checkpoint(path)
    except (ValueError, FileNotFoundError):
        return "there is no usable checkpoint (none was written yet)"
    if not weights_finite(state["model"]):
        return f"{path} holds NaN weights, so there is no usable checkpoint"
    return f"the last good checkpoint is {path} (step {state.get('step', '?')})"


def load_state(model, state_dict, strict=True):
    """model.load_state_dict with an error listing every parameter whose shape differs,
    and every missing or unexpected name, in one message."""
    own = model.state_dict()
    lines = [f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(own[k].shape)}"
             for k, v in state_dict.items() if k in own and own[k].shape != v.shape]
    lines = (["shape mismatch:"] + lines if lines else [])
    if strict:
        missing, unexpected = [k for k in own if k not in state_dict], [k for k in state_dict if k not in own]
        lines += (["missing in checkpoint: " + ", ".join(missing)] if missing else []) + \
                 (["not in model: " + ", ".join(unexpected)] if unexpected else [])
    if lines:
        raise ValueError("checkpoint does not fit the model (check the model flags, e.g. n_embd, n_layer, "
                         "vocab_size, max_len):\n  " + "\n  ".join(lines))
    model.load_state_dict(state_dict, strict=strict)


def grad_norm(parameters):
    """Total L2 norm of the gradients (what clip_grad_norm_ measures)."""
    norms = [p.grad.detach().norm() for p in parameters if p.grad is not None]
    return torch.stack(norms).norm() if norms else torch.zeros(())


# -----------------------------------------------------------------------------
# Run folders: locked first, never silently reused, one writer at a time

RESULT_FILES = ("config.json", "log.jsonl", "summary.json", "ckpt.pt")
RUN_RECORDS = RESULT_FILES + ("command.txt",)         # what every run writes


class RunFolder:
    """The run's out_dir: `with RunFolder(out_dir, names, ...) as folder:`. On entry
    (rank 0 only, before any data is read) it creates the folder if needed and takes its
    lock, an flock on run.lock that the kernel drops when this process ends, however it
    ends. Holding it, it removes temp files of earlier writers and checks the contents:
    only files a run of this script writes (`names`, glob patterns) may be there, and a
    run's results only with resume or overwrite. begin(), called once every check has
    passed, removes the old run's files when overwriting. On exit the lock is released,
    and a folder this run created and never wrote to is removed: a refused run leaves nothing."""

    def __init__(self, out_dir, names, overwrite=False, resume=False, master=True):
        self.dir, self.names, self.overwrite, self.resume = out_dir, RUN_RECORDS + tuple(names), overwrite, resume
        self.master, self.created, self.lock = master, False, None

    def __enter__(self):
        if not self.master:
            return self
        if os.path.exists(self.dir) and not os.path.isdir(self.dir):
            raise NotADirectoryError(f"--out_dir={self.dir} is a file, not a folder; choose another --out_dir")
        self.created = not os.path.exists(self.dir)
        try:
            os.makedirs(self.dir, exist_ok=True)
            self._lock()
            self._check_contents()
        except BlockingIOError:
            self.__exit__()
            raise FileExistsError(f"--out_dir={self.dir} is in use by another run ({lock_owner(self.dir)}); "
                                  f"wait for it or choose another --out_dir") from None
        except PermissionError:
            self.__exit__()
            raise PermissionError(f"--out_dir={self.dir} cannot be written; choose another --out_dir") from None
        except BaseException:
            self.__exit__()
            raise
        return self

    def _lock(self):
        """flock run.lock (BlockingIOError if another process holds it); retry if the file
        was replaced meanwhile by another run's. Only a held lock is ever removed."""
        path = os.path.join(self.dir, "run.lock")
        while True:
            f = open(path, "a+")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                raise
            if os.path.exists(path) and os.path.samestat(os.fstat(f.fileno()), os.stat(path)):
                break
            f.close()
        self.lock = f
        f.truncate(0)
        f.write(str(os.getpid()))
        f.flush()

    def _check_contents(self):
        present = [n for n in sorted(os.listdir(self.dir)) if n != "run.lock"]
        for n in [n for n in present if fnmatch.fnmatch(n, "*.tmp.*")]:     # no writer holds them now
            os.remove(os.path.join(self.dir, n))
            present.remove(n)
        foreign = [n for n in present if not any(fnmatch.fnmatch(n, p) for p in self.names)]
        if foreign:
            names = f"{', '.join(foreign[:4])}{', ...' if len(foreign) > 4 else ''}"
            if "config.json" in present and "log.jsonl" in present:
                raise FileExistsError(f"--out_dir={self.dir} holds a run of another script ({names} are not "
                                      f"this script's files); use that script, or choose another --out_dir")
            raise FileExistsError(f"--out_dir={self.dir} holds files that no run of this script writes ({names}); "
                                  f"choose an empty or new --out_dir")
        found = [f for f in RESULT_FILES if f in present]
        if self.resume and "ckpt.pt" not in found:
            raise FileNotFoundError(f"--init_from=resume but {os.path.join(self.dir, 'ckpt.pt')} does not exist; "
                                    f"give the folder of the run to continue with --out_dir")
        if found and not self.resume and not self.overwrite:
            raise FileExistsError(f"--out_dir={self.dir} already holds a run ({', '.join(found)}); choose another "
                                  f"--out_dir, continue it with --init_from=resume, or replace it with --overwrite=True")

    def begin(self):
        """Every check passed: with overwrite, remove the earlier run's files now."""
        if self.master and self.overwrite and not self.resume:
            for n in os.listdir(self.dir):
                if any(fnmatch.fnmatch(n, p) for p in self.names):
                    os.remove(os.path.join(self.dir, n))
        self.created = False                               # from here on the folder is the run's
        return self

    def __exit__(self, *exc):
        if self.lock is not None:
            os.remove(os.path.join(self.dir, "run.lock"))
            self.lock.close()                              # closing drops the flock
            self.lock = None
        if self.created and os.path.isdir(self.dir) and not os.listdir(self.dir):
            os.rmdir(self.dir)


def lock_owner(out_dir):
    """'pid N' from a folder's run.lock, for the message that it is in use."""
    try:
        with open(os.path.join(out_dir, "run.lock")) as f:
            return f"pid {int(f.read())}"
    except (OSError, ValueError):
        return "pid unknown"


# -----------------------------------------------------------------------------
# Results as files: config.json, log.jsonl, summary.json

class RunLog:
    """Writes only on the master rank. log.jsonl gets one JSON object per call of log().
    When resuming, the records written before the checkpoint are kept and new ones
    appended: resume_step=N keeps those with step <= N, or keep=f those with f(record)
    true; otherwise the log starts anew. command.txt gets the command line that made
    the run (one more line per resume). Create it only after RunFolder.begin()."""

    def __init__(self, out_dir, config, master=True, resume_step=None, keep=None, command=None):
        self.path, self.master = os.path.join(out_dir, "log.jsonl"), master
        if resume_step is not None:
            keep = lambda r: r.get("step", 0) <= resume_step
        if master and command is not None:
            with open(os.path.join(out_dir, "command.txt"), "a" if keep else "w") as f:
                f.write(command + "\n")
        if master:
            write_json(os.path.join(out_dir, "config.json"), config)
            kept = [r for r in read_log(out_dir) if keep(r)] if keep and os.path.exists(self.path) else []
            write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))

    def log(self, **record):
        if self.master:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")

    def summary(self, summary):
        if self.master:
            write_json(os.path.join(os.path.dirname(self.path), "summary.json"), summary)


def write_json(path, obj):
    write_text(path, json.dumps(obj, indent=2))


def write_text(path, text):
    def write(tmp):
        with open(tmp, "w") as f:
            f.write(text)
    atomic_write(path, write)


def read_log(out_dir):
    """The records of a run's log.jsonl. A last line cut short (the run was killed
    mid-write) is dropped with a warning; a bad line anywhere else names file and line."""
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
