"""
The plumbing that train_spt.py and train_flt.py share, so that each training
script shows only its own experiment (the command line is configurator.py's):

  setup_runtime  device, dtype, autocast and torchrun DDP (gloo on CPU, nccl on GPU)
  lr_at          warmup then cosine or linear decay
  checkpoints    atomic, finite-only writes; weights-only, checksummed reads
  atomic_write   every file written by rename from a pid-named temp file, never through a link
  to_json        strict JSON: NaN and inf as null
  RunFolder      the out_dir: locked first, known by its manifest.json, never silently reused,
                 left as found if the run is refused
  RunLog         config.json, log.jsonl and summary.json in out_dir
"""

import errno
import fcntl
import gc
import hashlib
import json
import math
import os
import shutil
import stat
import sys
import time
import zipfile
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
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
    device = check_device(device)
    kind = device.split(":")[0]
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


def check_device(device):
    """The device --device=auto|cpu|cuda|cuda:N|mps names on this machine (auto: cuda if
    present); one that is unknown or absent here is refused."""
    device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    kind = device.split(":")[0]
    if kind not in ("cpu", "cuda", "mps"):
        raise ValueError(f"--device={device}; choose auto, cpu, cuda, cuda:N or mps")
    if (kind == "cuda" and not torch.cuda.is_available()) or (kind == "mps" and not torch.backends.mps.is_available()):
        raise ValueError(f"--device={device} but this machine has no {kind} device; use --device=cpu or auto")
    return device


def close_ddp(rt):
    """End of a DDP run, on every rank after its last collective: wait for the other ranks
    (a barrier: no rank tears down while another still talks to it), collect the
    garbage (a DDP wrapper caught in a reference cycle holds the process group), then
    destroy the process group. So no gloo thread outlives it into the interpreter's
    exit, where a thread that reaches for the GIL is ended mid-stack and the process
    aborts ("terminate called without an active exception"). Drop the DDP wrapper first."""
    if rt.ddp:
        dist.barrier()
        gc.collect()
        dist.destroy_process_group()


# -----------------------------------------------------------------------------
# The step under DDP, and guarding a training loop: NaN stops, the wall clock, the replicas

def grad_sync(model, rt, last_micro):
    """Under DDP, model.no_sync() for every micro-batch but the last of a step: the
    gradients are averaged over ranks once, in the step's last backward. A no-op otherwise."""
    return model.no_sync() if rt.ddp and not last_micro else nullcontext()


class NonFiniteGuard:
    """The first step whose loss or gradient was NaN or inf (0 = none), kept on the
    device. On a CPU it is read every step, before the optimizer update (free there);
    on a GPU at each log step and before anything is saved. So no checkpoint ever
    holds weights that were updated with a NaN gradient."""

    def __init__(self, rt, phase, ckpt_path):
        self.at = torch.zeros((), dtype=torch.long, device=rt.device)
        self.every_step, self.phase, self.ckpt_path = rt.device_type == "cpu", phase, ckpt_path

    def record(self, loss, gnorm, step):
        finite = torch.isfinite(loss.detach()) & torch.isfinite(gnorm)
        self.at = torch.where((self.at == 0) & ~finite, step, self.at)
        if self.every_step:
            self.check()

    def mark(self, step):
        self.at.fill_(step)

    def check(self):
        step = int(self.at.item())
        if step:
            raise FloatingPointError(
                f"[{self.phase}] the loss or gradient became NaN or inf at step {step}; stopping, nothing from "
                f"that step on was saved, and {last_good_checkpoint(self.ckpt_path)}. Its weights are finite "
                f"but may already be on the way to diverging, so resuming from it with --init_from=resume "
                f"--lr=... (lower) can diverge again; if it does, start again with --overwrite=True and a lower "
                f"--lr (or set --grad_clip if it is 0)")


class RunClock:
    """The run's wall time across resumes (what the checkpoint had, plus this call's),
    and the optimizer steps this call has taken, both phases counted: after
    --halt_after_steps of them (0 = never) it stops as if killed, to test resume."""

    def __init__(self, halt_after, wall_before=0.0):
        self.halt_after, self.steps, self.start, self.before = halt_after, 0, time.time(), wall_before

    def elapsed(self):
        return self.before + time.time() - self.start

    def tick(self, bar):
        self.steps += 1
        if self.halt_after and self.steps >= self.halt_after:
            bar.close()
            raise SystemExit(f"halted after {self.steps} steps (--halt_after_steps)")


def unwrap(model):
    """The bare model under DDP and torch.compile wrappers."""
    model = model.module if hasattr(model, "module") else model
    return getattr(model, "_orig_mod", model)


def replica_max_diff(model, rt):
    """DDP check: the largest difference between any rank's weights and rank 0's."""
    flat = torch.cat([p.detach().flatten().double() for p in model.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(rt.world_size)]
    dist.all_gather(gathered, flat)
    return max((g - gathered[0]).abs().max().item() for g in gathered)


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
    atomic_write(path, lambda f: torch.save(state, f))


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


def data_fingerprint(pieces):
    """16 hex digits of sha256 over byte strings: which data a run was trained on."""
    h = hashlib.sha256()
    for piece in pieces:
        h.update(len(piece).to_bytes(8, "little") + piece)
    return h.hexdigest()[:16]


def example_bytes(ds, n=256):
    """The size of a dataset and the bytes of n examples spread over it: enough to tell
    one training set from another (a resumed run compares them)."""
    def flat(x):
        if torch.is_tensor(x):
            return x.numpy().tobytes()
        return b"".join(flat(v) for v in x) if isinstance(x, (tuple, list)) else repr(x).encode()
    picks = np.unique(np.linspace(0, len(ds) - 1, min(n, len(ds))).astype(int))
    return str(len(ds)).encode() + b"".join(flat(ds[int(i)]) for i in picks)


def record_fingerprint(cfg, fingerprint):
    """cfg["data_fingerprint"] = fingerprint. A resumed run's config already holds the
    fingerprint of the data it was trained on, and other data is refused."""
    if cfg.get("data_fingerprint", fingerprint) != fingerprint:
        raise ValueError(f"the training data is not the data this run was trained on (fingerprint {fingerprint}, "
                         f"the checkpoint's {cfg['data_fingerprint']}); resume with the same data, or start a new "
                         f"run in another --out_dir")
    cfg["data_fingerprint"] = fingerprint


# -----------------------------------------------------------------------------
# Writing files: never through a symbolic link, always by rename, as strict JSON

TMP_PREFIX = ".sptflt-tmp"    # temp files: .sptflt-tmp.<pid>.<name>, so a writer's own, and a dead
                              # writer's, are told from anything else by name and pid alone
MANIFEST = "manifest.json"    # a folder this project writes into: which script, which run, which files
HELD = {}                     # real path of a folder -> the Manifest of it this process holds


def temp_path(path):
    """The temp name a write to `path` goes through: beside it, with the prefix and this pid."""
    folder, name = os.path.split(path)
    return os.path.join(folder, f"{TMP_PREFIX}.{os.getpid()}.{name[:120]}")


def temp_owner(name):
    """The pid in a temp file's name, or None for a name that is not one of ours."""
    parts = name.split(".", 3)
    if name.startswith(TMP_PREFIX + ".") and len(parts) == 4 and parts[2].isdigit():
        return int(parts[2])
    return None


def refuse_link(path):
    """A symbolic link at `path` is refused: writing through it would change the file it points to."""
    if os.path.islink(path):
        raise FileExistsError(f"{path} is a symbolic link; this project never writes through one: remove it "
                              f"or choose another path")


def open_nofollow(path, flags, mode="w"):
    """os.open(path, flags | O_NOFOLLOW) as a file object; a link there is one line."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            refuse_link(path)
        raise
    return os.fdopen(fd, mode)


def atomic_write(path, write, binary=True):
    """write(f) on a new temp file beside `path` (created with O_EXCL | O_NOFOLLOW), then
    rename it to `path`; a link at `path` is refused. On failure the temp file is removed,
    and a full disk (which torch.save reports as a RuntimeError) is an OSError(ENOSPC)
    naming the file. A file written into a folder this process holds joins its manifest."""
    refuse_link(path)
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path} is a folder; give a file path")
    held = HELD.get(os.path.realpath(os.path.dirname(os.path.abspath(path))))
    if held is not None:
        held.claim(os.path.basename(path))                 # listed before it exists: never unlisted
    tmp = temp_path(path)
    try:
        if os.path.lexists(tmp):                           # this pid's own leftover
            os.remove(tmp)
        with open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, "wb" if binary else "w") as f:
            write(f)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:
        if os.path.lexists(tmp):
            os.remove(tmp)
        if getattr(e, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or \
                shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free < 2**20:
            raise OSError(errno.ENOSPC, f"no space left to write {path}; free some space, then continue "
                                        f"with --init_from=resume") from None
        raise


def append_text(path, text):
    """Add text to the end of a file (a log): created by atomic_write when absent, else
    opened O_APPEND without following a link."""
    if not os.path.lexists(path):
        return write_text(path, text)
    with open_nofollow(path, os.O_WRONLY | os.O_APPEND) as f:
        f.write(text)


def strict(obj):
    """obj with every NaN or inf float replaced by None (JSON has no NaN), numpy
    scalars as Python numbers."""
    if isinstance(obj, dict):
        return {k: strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def to_json(obj, indent=None):
    """Strict JSON text: NaN and inf are written as null."""
    return json.dumps(strict(obj), indent=indent, allow_nan=False)


def write_json(path, obj):
    write_text(path, to_json(obj, indent=2))


def write_text(path, text):
    atomic_write(path, lambda f: f.write(text), binary=False)


def read_jsonl(path):
    """The records of a JSONL file (blank lines skipped), for a resume and for a figure of
    a run that may still be writing: a last line that is not JSON (cut short by a kill, or
    being written now) is dropped with a warning on stderr; a bad line anywhere else is
    damage, and raises ValueError naming the file and the line."""
    with open(path) as f:
        lines = [line for line in f if line.strip()]
    records = []
    for i, line in enumerate(lines):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i < len(lines) - 1:
                raise ValueError(f"{path}, line {i + 1}: not a JSON record; the file is damaged") from None
            print(f"warning: {path}: dropped its last line, cut short ({line[:40]!r}...)", file=sys.stderr)
    return records


def read_log(out_dir):
    """The records of a run's log.jsonl (read_jsonl)."""
    return read_jsonl(os.path.join(out_dir, "log.jsonl"))


def read_manifest(folder):
    """A folder's manifest.json as a dict, or None when it has none (a link there,
    or a file that is not a manifest, counts as none)."""
    path = os.path.join(folder, MANIFEST)
    try:
        with open_nofollow(path, os.O_RDONLY, "r") as f:
            m = json.load(f)
    except (OSError, ValueError):
        return None
    ok = isinstance(m, dict) and isinstance(m.get("script"), str) and isinstance(m.get("files"), list)
    return m if ok else None


def alive(pid, script=None):
    """Whether process `pid` runs (and, when `script` is given and /proc says, runs that script)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return pid > 0
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return script is None or script.encode() in f.read()
    except OSError:
        return True


def holds_lock(pid, folder, script):
    """Whether process `pid` still writes into `folder`: it holds the folder's run.lock
    open (deleted or not; /proc says), or, where /proc cannot tell, runs `script`."""
    lock = os.path.join(os.path.realpath(folder), "run.lock")
    try:
        links = [os.readlink(os.path.join(f"/proc/{pid}/fd", fd)) for fd in os.listdir(f"/proc/{pid}/fd")]
    except FileNotFoundError:
        return False                                       # no such process
    except OSError:
        return alive(pid, script)
    return any(link in (lock, lock + " (deleted)") for link in links)


class Manifest:
    """A folder's manifest.json: the script (or tool) that writes there, a run id, the
    writer's pid and every file written there, listed before it exists. What a folder
    holds is known from it, never from file names: clean-up removes only listed files."""

    def __init__(self, folder, script, existing=None):
        self.folder, self.path = folder, os.path.join(folder, MANIFEST)
        self.data = existing or dict(script=script, run=f"{os.path.basename(os.path.abspath(folder))}-"
                                     f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}", files=[])
        self.data["pid"] = os.getpid()

    def hold(self):
        """Write it and note that this process writes into the folder now."""
        write_json(self.path, self.data)
        HELD[os.path.realpath(self.folder)] = self
        return self

    def release(self):
        HELD.pop(os.path.realpath(self.folder), None)

    def claim(self, name):
        """List `name` before it is written; a file of that name that is not listed was
        not written here by this script, and is refused."""
        if name == MANIFEST or name in self.data["files"]:
            return
        if os.path.lexists(os.path.join(self.folder, name)):
            raise FileExistsError(f"{os.path.join(self.folder, name)} exists and was not written by "
                                  f"{self.data['script']}; move it, or write into another folder")
        self.data["files"].append(name)
        write_json(self.path, self.data)

    def remove_files(self):
        """Unlink every listed file (a link is removed, never followed)."""
        for name in self.data["files"]:
            path = os.path.join(self.folder, name)
            if os.path.lexists(path) and not os.path.isdir(path) or os.path.islink(path):
                os.remove(path)
        self.data["files"] = []


def remove_stale_temps(folder):
    """Remove this process's temp files and those of writers that are dead."""
    for name in os.listdir(folder):
        pid = temp_owner(name)
        if pid is not None and (pid == os.getpid() or not alive(pid)):
            os.remove(os.path.join(folder, name))


def foreign_files(folder, manifest):
    """Files in `folder` that its manifest does not list (run.lock, the manifest and
    our own temp files aside)."""
    ours = set(manifest["files"]) | {MANIFEST} if manifest else set()
    return [n for n in sorted(os.listdir(folder)) if n not in ours and n != "run.lock" and temp_owner(n) is None]


def claim_outputs(folder, tool, names=()):
    """A folder that is not a run folder (--report, --compare) before writing into it:
    created if absent; refused if it holds a run, or a file of one of `names` that
    `tool` did not write there (its manifest says; any other name is checked when it is
    written). Returns the Manifest held; call release() when done."""
    os.makedirs(folder, exist_ok=True)
    m = read_manifest(folder)
    if m is not None and m["script"] != tool or any(os.path.lexists(os.path.join(folder, f)) for f in RESULT_FILES):
        raise FileExistsError(f"{folder} holds a run or another tool's output"
                              f"{' (' + m['script'] + ')' if m else ''}; write into another folder")
    listed = set(m["files"]) if m else set()
    theirs = [n for n in names if os.path.lexists(os.path.join(folder, n)) and n not in listed]
    if theirs:
        raise FileExistsError(f"{folder} already holds {', '.join(theirs)}, not written by {tool}; move "
                              f"{'them' if len(theirs) > 1 else 'it'} or write into another folder")
    return Manifest(folder, tool, m).hold()


# -----------------------------------------------------------------------------
# Run folders: known by their manifest, locked first, never silently reused

RESULT_FILES = ("config.json", "log.jsonl", "summary.json", "ckpt.pt")


class RunFolder:
    """The run's out_dir: `with RunFolder(out_dir, script, overwrite, resume) as folder:`. On
    entry (rank 0 only, before any data is read) it creates the folder if needed and
    takes its lock, an flock on run.lock that the kernel drops when this process ends,
    however it ends. Holding it, it accepts the folder only if it is empty or its
    manifest.json names this script (and no live writer of it); files the manifest
    does not list are never touched and refuse the folder. A run's results are
    reused only with resume or overwrite. begin(), called once every check has passed,
    writes the manifest, removes temp files of dead writers and, when overwriting, the
    files the old run's manifest lists. On exit the lock is released, and a folder this
    run created and never wrote to is removed: a refused run leaves nothing."""

    def __init__(self, out_dir, script, overwrite=False, resume=False):
        self.dir, self.script = out_dir, script
        self.overwrite, self.resume, self.created, self.lock = overwrite, resume, False, None
        self.master = is_master()
        self.manifest = None

    def __enter__(self):
        if not self.master:
            return self
        if os.path.exists(self.dir) and not os.path.isdir(self.dir):
            raise NotADirectoryError(f"--out_dir={self.dir} is a file, not a folder; choose another --out_dir")
        self.created = not os.path.exists(self.dir)
        try:
            os.makedirs(self.dir, exist_ok=True)
            self._lock()
            self.manifest = self._accept()
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
        """flock run.lock (opened without following a link; BlockingIOError if another
        process holds it); retry if the file was replaced meanwhile by another run's."""
        path = os.path.join(self.dir, "run.lock")
        while True:
            f = open_nofollow(path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK, "r+")
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                f.close()
                raise FileExistsError(f"{path} is not a regular file; remove it or choose another --out_dir")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                raise
            if os.path.exists(path) and os.path.samestat(os.fstat(f.fileno()), os.lstat(path)):
                break
            f.close()
        self.lock = f
        f.truncate(0)
        f.write(str(os.getpid()))
        f.flush()

    def _accept(self):
        """The folder's manifest (a new one for an empty folder) once the folder is
        known to be this script's run folder, free, and of the state this call asks for."""
        m = read_manifest(self.dir)
        if m is None:
            self._refuse_unknown_files()
        elif m["script"] != self.script:
            raise FileExistsError(f"--out_dir={self.dir} holds a run of another script ({m['script']}); use that "
                                  f"script, or choose another --out_dir")
        elif m.get("pid") not in (None, os.getpid()) and holds_lock(m["pid"], self.dir, self.script):
            raise FileExistsError(f"--out_dir={self.dir} is in use by another run (pid {m['pid']}, whose run.lock "
                                  f"is gone); wait for it or choose another --out_dir")
        foreign = foreign_files(self.dir, m)
        if foreign:
            names = f"{', '.join(foreign[:4])}{', ...' if len(foreign) > 4 else ''}"
            raise FileExistsError(f"--out_dir={self.dir} holds files its run did not write ({names}); move them, "
                                  f"or choose an empty or new --out_dir")
        found = [f for f in RESULT_FILES if m and f in m["files"] and os.path.lexists(os.path.join(self.dir, f))]
        if self.resume and "ckpt.pt" not in found:
            raise FileNotFoundError(f"--init_from=resume but {os.path.join(self.dir, 'ckpt.pt')} does not exist; "
                                    f"give the folder of the run to continue with --out_dir")
        if found and not self.resume and not self.overwrite:
            raise FileExistsError(f"--out_dir={self.dir} already holds a run ({', '.join(found)}); choose another "
                                  f"--out_dir, continue it with --init_from=resume, or replace it with --overwrite=True")
        return m

    def _refuse_unknown_files(self):
        """No manifest: only an empty folder can become a run folder."""
        present = foreign_files(self.dir, None)
        if present:
            names = f"{', '.join(present[:4])}{', ...' if len(present) > 4 else ''}"
            raise FileExistsError(f"--out_dir={self.dir} holds files ({names}) but no {MANIFEST}, so it is not a "
                                  f"run folder of this project's scripts; choose an empty or new --out_dir")

    def begin(self):
        """Every check passed: write the manifest, remove dead writers' temp files and,
        with overwrite, the files the earlier run's manifest lists."""
        if self.master:
            old = self.manifest
            fresh = old is None or (self.overwrite and not self.resume)
            self.manifest = Manifest(self.dir, self.script, None if fresh else old)
            if old is not None and fresh:
                Manifest(self.dir, self.script, old).remove_files()
            self.manifest.hold()
            remove_stale_temps(self.dir)
        self.created = False                               # from here on the folder is the run's
        return self

    def __exit__(self, *exc):
        if isinstance(self.manifest, Manifest):
            self.manifest.release()
        if self.lock is not None:
            path = os.path.join(self.dir, "run.lock")
            if os.path.lexists(path) and os.path.samestat(os.fstat(self.lock.fileno()), os.lstat(path)):
                os.remove(path)                            # only the lock this process holds
            self.lock.close()                              # closing drops the flock
            self.lock = None
        if self.created and os.path.isdir(self.dir) and not os.listdir(self.dir):
            os.rmdir(self.dir)


def lock_owner(out_dir):
    """'pid N' from a folder's run.lock, for the message that it is in use."""
    try:
        with open_nofollow(os.path.join(out_dir, "run.lock"), os.O_RDONLY | os.O_NONBLOCK, "r") as f:
            return f"pid {int(f.read(32))}"
    except (OSError, ValueError):
        return "pid unknown"


# -----------------------------------------------------------------------------
# Results as files: config.json, log.jsonl, summary.json

class RunLog:
    """Writes only on the master rank. log.jsonl gets one JSON object per call of log().
    When resuming, the records written before the checkpoint are kept and new ones
    appended: keep=f keeps those with f(record) true (up_to_step(N): step <= N);
    otherwise the log starts anew. The files in `also` (other JSONL records of
    the run) are cut back the same way. command.txt gets the command line that made
    the run (one more line per resume). Create it only after RunFolder.begin()."""

    def __init__(self, out_dir, config, keep=None, command=None, also=()):
        self.path, self.master = os.path.join(out_dir, "log.jsonl"), is_master()
        if not self.master:
            return
        if command is not None:
            path = os.path.join(out_dir, "command.txt")
            earlier = open(path).read() if keep and os.path.isfile(path) else ""
            write_text(path, earlier + command + "\n")
        write_json(os.path.join(out_dir, "config.json"), config)
        for name in ("log.jsonl", *also):
            path = os.path.join(out_dir, name)
            if name == "log.jsonl" or os.path.lexists(path):
                kept = [r for r in read_jsonl(path) if keep(r)] if keep and os.path.exists(path) else []
                write_text(path, "".join(to_json(r) + "\n" for r in kept))

    def log(self, **record):
        if self.master:
            append_text(self.path, to_json(record) + "\n")

    def summary(self, summary):
        if self.master:
            write_json(os.path.join(os.path.dirname(self.path), "summary.json"), summary)


def up_to_step(step):
    """RunLog's keep= for a checkpoint at `step`: the records at or before it."""
    return lambda r: r.get("step", 0) <= step


def is_master():
    """Rank 0 of a torchrun launch, or a single process (read before the process group exists)."""
    return int(os.environ.get("RANK", 0)) == 0
