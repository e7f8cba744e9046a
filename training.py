"""What train_spt.py and train_flt.py share, and neither paper is about. Each script keeps its own loop,
evaluation, schedule, best checkpoint and log lines in view; it needs only these contracts:

  setup_runtime   device, autocast dtype and torchrun DDP (gloo on CPU, nccl on GPU)
  wrap, grad_sync the one way a module goes under DDP (and torch.compile)
  NonFiniteGuard  a NaN or inf loss or gradient stops the run; no non-finite weight is saved
  checkpoints     written atomically (temp file, then rename), loaded weights_only
  Run             the run folder (locked, never overwritten silently), config.json, command.txt, log.jsonl, ckpt.pt

A stop signal (Ctrl-C, SIGTERM: a cluster's warning before a kill, SIGHUP: a closed terminal, SIGUSR1:
SLURM's --signal=USR1@90) ends the run at the end of its step, its resume point saved; `--init_from=resume`
then continues it exactly."""

import fcntl
import gc
import json
import math
import os
import shlex
import signal
import time
from contextlib import nullcontext, suppress
from dataclasses import dataclass

import torch
import torch.distributed as dist

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)   # exit status 128 + N
RUN_FILES = (".pt", ".json", ".jsonl", ".png", ".gif", ".md", "command.txt")    # what --overwrite removes


# -----------------------------------------------------------------------------
# Device, precision and torchrun DDP

@dataclass
class Runtime:
    device: str
    device_type: str         # "cuda", "cpu" or "mps"
    ptdtype: torch.dtype
    ddp: bool
    rank: int
    world_size: int

    @property
    def master(self):
        return self.rank == 0

    def autocast(self):
        """`with rt.autocast():` runs the forward in ptdtype (nothing to do in float32)."""
        return nullcontext() if self.ptdtype == torch.float32 else torch.autocast(self.device_type, self.ptdtype)

    def loader(self, ds, batches, num_workers=0):
        """A DataLoader over the given lists of indices (batch_sampler), with the dataset's collate."""
        return torch.utils.data.DataLoader(ds, batch_sampler=batches, collate_fn=ds.collate,
                                           num_workers=num_workers, pin_memory=self.device_type == "cuda")


def setup_runtime(device="auto", dtype="auto", seed=0):
    """Pick the device (cuda if present), the autocast dtype (auto: bfloat16 on a GPU that has it, else
    float32), join the torchrun process group (RANK in the environment), seed."""
    ddp, rank, world = "RANK" in os.environ, int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    kind = device.split(":")[0]
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device={device} but this machine has no CUDA GPU; use --device=cpu")
    if kind == "cuda" and ddp:
        device = f"cuda:{os.environ.get('LOCAL_RANK', 0)}"
        torch.cuda.set_device(device)
    if ddp:
        dist.init_process_group(backend="nccl" if kind == "cuda" else "gloo")
    if dtype in ("auto", "fast"):                   # fast: float32 here, until choose_fast_dtype times bf16
        dtype = "bfloat16" if kind == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    if kind == "cpu":
        torch.set_flush_denormal(True)   # denormal floats made some CPU runs ~4x slower
    if kind == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(seed)
    return Runtime(device, kind, getattr(torch, dtype), ddp, rank, world)


def step_seconds(model, loss_fn, rt, dtype=torch.float32):
    """Seconds of a forward (loss_fn()) and backward pass of `model`: best of 2 after a warm-up; grads left unset."""
    times = []
    for _ in range(3):
        t = time.perf_counter()
        with torch.autocast(rt.device_type, dtype=dtype, enabled=dtype != torch.float32):
            loss = loss_fn()
        loss.float().backward()
        if rt.device_type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    model.zero_grad(set_to_none=True)
    return min(times[1:])


def choose_fast_dtype(cfg, rt, model, loss_fn):
    """--dtype=fast on a CPU: float32 or bf16 autocast, whichever steps the run's own model faster here (bf16 took
    0.87x the float32 step on a CPU that computes it, 5x on an AVX2-only one that emulates it); RNG state untouched."""
    if cfg["dtype"] == "fast" and rt.device_type == "cpu":
        with torch.random.fork_rng(devices=[]):
            rt.ptdtype = min((torch.float32, torch.bfloat16), key=lambda d: step_seconds(model, loss_fn, rt, d))
        print(f"--dtype=fast: {str(rt.ptdtype)[6:]} steps faster here, timed on this model")


def wrap(module, rt, compile=False):
    """The module the loop calls: under DDP when launched by torchrun (a replica per process, gradients
    averaged in backward), then torch.compile if asked."""
    if rt.ddp:
        module = torch.nn.parallel.DistributedDataParallel(
            module, device_ids=[rt.device] if rt.device_type == "cuda" else None)
    return torch.compile(module) if compile else module


def default_out_dir(prefix, cfg, base, skip=()):
    """--out_dir="" names the run: out/<prefix>, then _<key>-<value> for each flag that differs from
    `base` (but `skip`), so two different runs never share a folder. Both scripts' one rule."""
    differ = "".join(f"_{k}-{v}" for k, v in cfg.items() if k in base and k not in skip and v != base[k])
    return os.path.join("out", (prefix + differ).replace("/", "-")[:len(prefix) + 120])


def replica_max_diff(model, rt):
    """The largest difference between any rank's weights and rank 0's (0.0 when DDP works)."""
    flat = torch.cat([p.detach().flatten().double() for p in unwrap(model).parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(rt.world_size)]
    dist.all_gather(gathered, flat)
    return max((g - gathered[0]).abs().max().item() for g in gathered)


def unwrap(module):
    """The plain module under torch.compile and DDP (whose state_dict has no prefixes)."""
    module = getattr(module, "_orig_mod", module)
    return getattr(module, "module", module)


def grad_sync(module, rt, last_micro):
    """Gradient accumulation under DDP: average across ranks only on the last micro-batch."""
    return nullcontext() if not rt.ddp or last_micro else getattr(module, "_orig_mod", module).no_sync()


# -----------------------------------------------------------------------------
# The NaN guard, and checkpoints

class NonFiniteGuard:
    """Remembers the first step whose loss or gradient was NaN or inf, on the device. On a CPU it is read
    every step, before the update; on a GPU (where reading it would sync every step) at each log step and
    before anything is saved. check() raises FloatingPointError saying what is true on this device."""

    def __init__(self, rt, phase, ckpt_path):
        self.at = torch.zeros((), dtype=torch.long, device=rt.device)
        self.cpu, self.phase, self.ckpt_path = rt.device_type == "cpu", phase, ckpt_path

    def record(self, loss, gnorm, step):
        bad = ~(torch.isfinite(loss.detach()) & torch.isfinite(gnorm))
        self.at = torch.where((self.at == 0) & bad, step, self.at)
        if self.cpu:
            self.check()

    def check(self):
        if step := int(self.at.item()):
            when = ("stopped before its update" if self.cpu else
                    "seen at a log step: the steps since then updated the weights, none of them was saved")
            raise FloatingPointError(f"[{self.phase}] the loss or gradient became NaN or inf at step {step}; {when}. "
                                     f"{last_good(self.ckpt_path)}; start again with --overwrite=True and a lower "
                                     f"--lr (or --grad_clip)")


def save_checkpoint(path, state):
    """torch.save to a temp file, then rename: a kill mid-save never leaves half a checkpoint.
    Weights holding NaN or inf are never written (FloatingPointError)."""
    if not all(v.isfinite().all() for v in state.get("model", {}).values() if v.is_floating_point()):
        raise FloatingPointError(f"not writing {path}: the weights hold NaN or inf")
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)


def load_checkpoint(path):
    """torch.load(weights_only=True): a checkpoint holds tensors, numbers, strings and plain containers, so
    loading one cannot run code. One line when it is missing or damaged."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:        # a cut file, or one holding objects that are not tensors
        raise ValueError(f"checkpoint {path} cannot be read ({str(e).splitlines()[0][:120]})") from None


def load_weights(model, source, names=None):
    """Load a checkpoint's weights (a path or a state dict) into `model`; `names`: only those parameters,
    the rest stay as they are. A shape or name mismatch is one error."""
    state = load_checkpoint(source)["model"] if isinstance(source, (str, os.PathLike)) else source
    own = unwrap(model).state_dict()
    if names is not None:
        state = {k: state[k] if k in names and k in state else v for k, v in own.items()}
    bad = sorted(set(own) ^ set(state)) + [k for k in own if k in state and own[k].shape != state[k].shape]
    if bad:
        raise ValueError(f"checkpoint does not fit the model ({', '.join(bad[:4])}); give it the same model flags")
    unwrap(model).load_state_dict(state)


def last_good(path):
    """What a stopped run can resume from."""
    return (f"the last good checkpoint is {path} (step {load_checkpoint(path).get('step', '?')})"
            if os.path.exists(path) else "no checkpoint was written yet")


def write_json(path, obj):
    """Strict JSON (NaN and inf as null), atomically."""
    with open(path + ".tmp", "w") as f:
        f.write(json.dumps(finite(obj), indent=2))
    os.replace(path + ".tmp", path)


def finite(obj):
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, torch.Tensor):      # a numpy scalar
        obj = obj.item()
    return None if isinstance(obj, float) and not math.isfinite(obj) else obj


def read_log(out_dir, name="log.jsonl"):
    """The records of a run's JSONL log; a last line cut short by a kill is dropped."""
    with open(os.path.join(out_dir, name)) as f:
        lines = [line for line in f if line.strip()]
    records = [json.loads(line) for line in lines[:-1]]
    with suppress(json.JSONDecodeError):
        records += [json.loads(line) for line in lines[-1:]]
    return records


# -----------------------------------------------------------------------------
# The run: its folder, log and resume point, and how it stops

class Run:
    """One training run, `with Run(cfg, script, argv, free) as run:`. On entry (before any data is read):
    take out_dir's lock (fcntl.flock on run.lock, which the kernel drops when the process dies, so kill -9
    never blocks a resume); refuse a folder that holds a finished or stopped run unless --overwrite=True
    (which removes its files) or --init_from=resume; with resume, load ckpt.pt into run.ckpt and take its
    config: a flag given now that differs from it is refused, except the `free` ones (the run's plumbing:
    device, workers, logging). Then the runtime (run.rt) and the signals. A refused run frees the folder
    at once. run.begin() writes config.json, command.txt and log.jsonl once every check has passed."""

    def __init__(self, cfg, script, argv, free=()):
        self.cfg, self.script, self.argv, self.free = cfg, script, argv, free
        self.dir, self.ckpt_path = cfg["out_dir"], os.path.join(cfg["out_dir"], "ckpt.pt")
        self.ckpt, self.saver, self.signum, self.steps, self.lock, self.begun = None, None, None, 0, None, False
        self.continue_with = f"continue with: python {script} --init_from=resume --out_dir={self.dir}"

    def __enter__(self):
        try:
            if int(os.environ.get("RANK", 0)) == 0:
                self.lock_folder()
            if self.cfg["init_from"] == "resume":
                self.ckpt = load_checkpoint(self.ckpt_path)
                self.cfg = self.resumed_config(self.ckpt["config"])
            self.rt = setup_runtime(self.cfg["device"], self.cfg["dtype"], self.cfg["seed"])
        except BaseException:                                       # a refused run frees the folder at once
            self.release()
            raise
        self.start, self.before = time.time(), self.ckpt.get("wall_time", 0.0) if self.ckpt else 0.0
        self.handlers = {s: signal.signal(s, self.on_signal) for s in STOP_SIGNALS}
        return self

    def lock_folder(self):
        """The lock and the folder's checks of the class docstring; a folder in use keeps its live run's lock."""
        self.created = not os.path.isdir(self.dir)
        os.makedirs(self.dir, exist_ok=True)
        self.lock = open(os.path.join(self.dir, "run.lock"), "w")
        try:
            fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:                                     # the live run's lock stays
            self.lock.close()
            self.lock = None
            raise FileExistsError(f"--out_dir={self.dir} is in use by a live run; wait for it or choose "
                                  f"another --out_dir") from None
        began = os.path.exists(os.path.join(self.dir, "config.json"))
        if self.cfg["init_from"] == "resume":
            if not os.path.exists(self.ckpt_path):
                raise FileNotFoundError(f"--init_from=resume but {self.ckpt_path} does not exist")
        elif began and not self.cfg["overwrite"]:
            raise FileExistsError(f"--out_dir={self.dir} already holds a run; continue it with --init_from=resume, "
                                  f"replace it with --overwrite=True, or choose another --out_dir")
        elif began:
            for name in filter(lambda name: name.endswith(RUN_FILES), os.listdir(self.dir)):
                os.remove(os.path.join(self.dir, name))

    def resumed_config(self, saved):
        """The checkpoint's config, with the `free` flags given now; any other flag given now must equal it."""
        given = {a[2:].split("=", 1)[0] for a in self.argv if a.startswith("--")} - {"init_from", "out_dir"}
        cfg = {**saved, **{k: self.cfg[k] for k in given & set(self.free)},      # run.ckpt says it resumed
               "halt_after_steps": self.cfg["halt_after_steps"], "overwrite": False, "out_dir": self.dir}
        differ = [f"--{k}={self.cfg[k]} (checkpoint: {saved.get(k)!r})" for k in sorted(given - set(self.free))
                  if self.cfg.get(k) != saved.get(k)]
        if differ:
            raise ValueError(f"--init_from=resume continues the run as it was started; these flags differ from "
                             f"its checkpoint: {', '.join(differ)}. Leave them out, or start a new --out_dir")
        return cfg

    def begin(self, keep=lambda record: True):
        """Every check has passed: write config.json and command.txt (a line more per resume) and start
        log.jsonl (and snapshots.jsonl, if there is one); on resume keep only the records keep(record) says
        were written before the resume point. Prints the command that resumes it."""
        if self.rt.master:
            with open(os.path.join(self.dir, "command.txt"), "a" if self.ckpt else "w") as f:
                f.write(shlex.join(["python", self.script, *self.argv]) + "\n")
            write_json(os.path.join(self.dir, "config.json"), self.cfg)
            for name in ("log.jsonl", "snapshots.jsonl"):
                path = os.path.join(self.dir, name)
                kept = [r for r in read_log(self.dir, name) if keep(r)] if self.ckpt and os.path.exists(path) else []
                if name == "log.jsonl" or kept:
                    with open(path, "w") as f:
                        f.writelines(json.dumps(finite(r)) + "\n" for r in kept)
            print(f"[{os.path.basename(self.dir)}] after a stop, {self.continue_with}", flush=True)
        self.begun = True

    def log(self, file="log.jsonl", **record):
        """One record at the end of log.jsonl (or of `file`), on the master rank."""
        if self.rt.master:
            with open(os.path.join(self.dir, file), "a") as f:
                f.write(json.dumps(finite(record)) + "\n")

    def on_signal(self, signum, frame):
        """A stop signal ends the run at the end of its step (tick); a second one, now."""
        first, self.signum = self.signum is None, self.signum or signum
        if not first or not self.begun:
            raise KeyboardInterrupt

    def tick(self):
        """After each optimizer step: stop if a signal asked to (run.saver saves the resume point first), or
        after --halt_after_steps (as if killed: to test resume)."""
        self.steps += 1
        stop = self.signum is not None
        if self.rt.ddp:                                             # every rank stops at the same step
            flag = torch.tensor(float(stop), device=self.rt.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            stop = bool(flag.item())
        halt = self.cfg["halt_after_steps"] and self.steps >= self.cfg["halt_after_steps"]
        if stop or halt:
            self.saver()
        if stop:
            self.signum = self.signum or signal.SIGTERM
            raise KeyboardInterrupt
        if halt:
            raise SystemExit(f"halted after {self.steps} steps (--halt_after_steps), resume point saved")

    def save_resume(self, model, optimizers, **state):
        """ckpt.pt: all --init_from=resume needs to continue exactly: weights, optimizers, the RNG state,
        the config, the wall time, and the loop's own `state`."""
        if self.rt.master:
            cuda = {"cuda_rng": torch.cuda.get_rng_state()} if torch.cuda.is_available() else {}
            self.save_weights(self.ckpt_path, model, optimizers=[o.state_dict() for o in optimizers],
                              rng=torch.get_rng_state(), wall_time=self.elapsed(), **state, **cuda)

    def save_weights(self, path, model, **extra):
        """A weights-only checkpoint (the best so far, an SPT epoch's): weights, config, `extra`."""
        if self.rt.master:
            save_checkpoint(path, dict(model=unwrap(model).state_dict(), config=self.cfg, **extra))

    def restore(self, model, optimizers, rng=True):
        """Continue from ckpt.pt: its weights, optimizer states and (rng=True) RNG state."""
        load_weights(model, self.ckpt["model"])
        for o, state in zip(optimizers, self.ckpt["optimizers"]):
            o.load_state_dict(state)
        if rng:
            torch.set_rng_state(self.ckpt["rng"])
            if "cuda_rng" in self.ckpt and torch.cuda.is_available():
                torch.cuda.set_rng_state(self.ckpt["cuda_rng"])

    def elapsed(self):
        """The run's wall time across resumes."""
        return self.before + time.time() - self.start

    def write_summary(self, summary):
        if self.rt.master:
            write_json(os.path.join(self.dir, "summary.json"), summary)

    def release(self):
        if self.lock is not None:
            os.remove(self.lock.name)
            self.lock.close()                                       # closing drops the flock
            self.lock = None
            if self.created and not os.listdir(self.dir):           # a refused run leaves nothing
                os.rmdir(self.dir)

    def __exit__(self, kind, error, trace):
        for s, handler in getattr(self, "handlers", {}).items():
            signal.signal(s, handler)
        self.release()
        if kind is None and self.rt.ddp:     # a barrier, then collect the DDP wrapper's cycle that holds the
            dist.barrier()                     # group: no gloo thread may outlive it and abort the exit
            gc.collect()
            dist.destroy_process_group()
        elif kind is not None and issubclass(kind, KeyboardInterrupt):
            signum = self.signum or signal.SIGINT
            how = (self.continue_with if os.path.exists(self.ckpt_path)
                   else "no checkpoint was written yet: run the same command again")
            stop = KeyboardInterrupt(f"[{os.path.basename(self.dir)}] {signal.Signals(signum).name}: stopped; {how}")
            stop.status = 128 + signum
            raise stop from None
