"""
The small training core that train_spt.py and train_flt.py share, so that each script
shows only its own loop (batch -> loss -> backward -> clip -> update):

  setup_runtime    device, autocast dtype and torchrun DDP (gloo on CPU, nccl on GPU)
  wrap, grad_sync  the one way a module is put under DDP (and torch.compile)
  Schedule         the learning rate: warmup, then constant, cosine, linear or warmdown
  NonFiniteGuard   a NaN or inf loss or gradient stops the run before the update
  checkpoints      atomic, finite-only writes; weights-only, checksummed reads
  Run              one run's state: flags, runtime, folder, log, clock, resume point, signals

Files are written through runfiles.py (atomic, never through a link, in a manifest).
"""

import gc
import math
import os
import shlex
import signal
import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
from tqdm import tqdm

import configurator
from plumbing import runfiles
from configurator import Stopped
from plumbing.runfiles import load_checkpoint

# The signals that stop a run at the end of its step, resume point saved: Ctrl-C, SIGTERM (a
# cluster's warning before a kill), SIGHUP (a closed terminal), SIGUSR1 (SLURM's --signal=USR1@90).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)   # exit status 128 + N

STOP_WORD = {signal.SIGINT: "interrupted"}                                        # the others: "terminated"

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

    def loader(self, ds, batches, num_workers):
        """A DataLoader of `batches`; its workers leave a stop signal to the run (the parent)."""
        return torch.utils.data.DataLoader(ds, batch_sampler=batches, collate_fn=ds.collate, num_workers=num_workers,
                                           pin_memory=self.device_type == "cuda", worker_init_fn=_ignore_stop_signals)

    def autocast(self):
        """`with rt.autocast():` runs the forward in ptdtype (nothing to do in float32)."""
        return nullcontext() if self.ptdtype == torch.float32 else torch.autocast(self.device_type, self.ptdtype)


def setup_runtime(device="auto", dtype="auto", seed=0):
    """Pick the device (cuda if present), the autocast dtype (auto and fast: bfloat16 on a
    GPU that has it, else float32; on a CPU cost.choose_dtype then times fast), join the
    torchrun process group (RANK in the environment), and seed every rank alike."""
    env = lambda k, d: int(os.environ.get(k, d))
    ddp, rank, local_rank, world_size = env("RANK", -1) != -1, env("RANK", 0), env("LOCAL_RANK", 0), env("WORLD_SIZE", 1)
    device = configurator.check_device(device)
    kind = device.split(":")[0]
    if kind == "cuda" and ddp:
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(device)
    if ddp:
        dist.init_process_group(backend="nccl" if kind == "cuda" else "gloo")
    if dtype in ("auto", "fast"):
        dtype = "bfloat16" if kind == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"--dtype={dtype}; choose float32, bfloat16, float16, auto or fast")
    if kind == "cpu":
        torch.set_flush_denormal(True)   # denormal floats made some CPU runs ~4x slower
    if kind == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(seed)
    return Runtime(device, kind, getattr(torch, dtype), ddp, rank, local_rank, world_size)


def wrap(module, rt, compile=False):
    """What the loop calls: the module whose forward returns the loss, under DDP when launched
    by torchrun (a replica per process, gradients averaged in backward), then torch.compile."""
    if rt.ddp:
        module = torch.nn.parallel.DistributedDataParallel(
            module, device_ids=[rt.local_rank] if rt.device_type == "cuda" else None)
    return torch.compile(module) if compile else module


def _ignore_stop_signals(worker_id):
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)


def grad_sync(module, rt, last_micro):
    """Under DDP, module.no_sync() for every micro-batch but a step's last: one all-reduce a step."""
    return module.no_sync() if rt.ddp and not last_micro else nullcontext()


def unwrap(model):
    """The bare model under DDP and torch.compile wrappers."""
    model = model.module if hasattr(model, "module") else model
    return getattr(model, "_orig_mod", model)


def close_ddp(rt):
    """End of a DDP run: a barrier, garbage collection (a DDP wrapper in a reference cycle holds
    the group), then destroy the group, so that no gloo thread outlives it and aborts the exit."""
    if rt.ddp:
        dist.barrier()
        gc.collect()
        dist.destroy_process_group()


# -----------------------------------------------------------------------------
# The learning-rate schedule, and the guard of a step

@dataclass
class Schedule:
    """The learning rate at each optimizer step: a linear warmup to the peak, then
      constant;
      cosine or linear decay to min_lr_frac x peak at max_steps;
      warmdown (nanochat's, the FLT authors'): flat, then linear to 0 over the last
      warmdown_frac of the steps."""
    name: str
    max_steps: int
    warmup_steps: int = 0
    min_lr_frac: float = 0.1
    warmdown_frac: float = 0.2

    def lr(self, step, peak):
        """The learning rate at optimizer step `step` (0-based) for a peak rate `peak`."""
        if step < self.warmup_steps:
            return peak * (step + 1) / self.warmup_steps
        if self.name == "warmdown":
            w = round(self.warmdown_frac * self.max_steps)
            return peak if step <= self.max_steps - w else peak * ((self.max_steps - step) / w)
        if self.name == "constant" or self.max_steps <= self.warmup_steps:
            return peak
        if self.name not in ("cosine", "linear"):
            raise ValueError(f"schedule={self.name!r}; choose cosine, linear, warmdown or constant")
        progress = min(1.0, (step - self.warmup_steps) / (self.max_steps - self.warmup_steps))
        decay = 0.5 * (1.0 + math.cos(math.pi * progress)) if self.name == "cosine" else 1.0 - progress
        return peak * (self.min_lr_frac + (1.0 - self.min_lr_frac) * decay)


class NonFiniteGuard:
    """The first step whose loss or gradient was NaN or inf (0 = none), kept on the
    device. On a CPU it is read every step, before the optimizer update (free there);
    on a GPU at each log step and before anything is saved. So no checkpoint ever
    holds weights that were updated with a NaN gradient. check() raises FloatingPointError."""

    def __init__(self, run, phase):
        self.at = torch.zeros((), dtype=torch.long, device=run.rt.device)
        self.every_step, self.phase, self.ckpt_path = run.rt.device_type == "cpu", phase, run.ckpt_path

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
                f"[{self.phase}] the loss or gradient became NaN or inf at step {step}; stopped before its update, "
                f"and {last_good_checkpoint(self.ckpt_path)}, whose weights may already be on the way to diverging: "
                f"resume with --init_from=resume and a lower --lr, or start again with --overwrite=True and a "
                f"lower --lr (or --grad_clip if it is 0)")


# -----------------------------------------------------------------------------
# Checkpoints: atomic and finite on write, weights-only and checksummed on read

def save_checkpoint(path, state):
    """torch.save through runfiles.write_file (a crash or a full disk never leaves half a
    checkpoint under `path`); non-finite weights are never written. `state` holds
    tensors, numbers, strings and plain containers only (weights-only loading works)."""
    if not all(torch.isfinite(v).all() for v in state.get("model", {}).values() if v.is_floating_point()):
        raise FloatingPointError(f"not writing {path}: the weights hold NaN or inf")
    runfiles.write_file(path, lambda f: torch.save(state, f))


def load_weights(model, source, names=None):
    """Load a checkpoint's weights (a path, or a state dict) into `model`; names: only
    these parameters (the rest stay as they are). Every parameter whose shape differs,
    and every missing or unexpected name, is listed in one error."""
    state = load_checkpoint(source)["model"] if isinstance(source, (str, os.PathLike)) else source
    own = unwrap(model).state_dict()
    missing = [k for k in (own if names is None else names) if k not in state]
    if names is not None:
        state = {k: state[k] if k in names and k in state else v for k, v in own.items()}
    lines = [f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(own[k].shape)}"
             for k, v in state.items() if k in own and own[k].shape != v.shape]
    lines = (["shape mismatch:"] + lines if lines else [])
    unexpected = [k for k in state if k not in own]
    lines += (["missing in checkpoint: " + ", ".join(missing)] if missing else []) + \
             (["not in model: " + ", ".join(unexpected)] if unexpected else [])
    if lines:
        raise ValueError("checkpoint does not fit the model (check the model flags, e.g. n_embd, n_layer, "
                         "vocab_size, max_len):\n  " + "\n  ".join(lines))
    unwrap(model).load_state_dict(state)


def last_good_checkpoint(path):
    """A sentence naming `path` and its step if it loads with finite weights, else saying
    there is none: what a stopped run tells its user to resume from."""
    try:
        state = load_checkpoint(path)
    except (ValueError, FileNotFoundError):
        return "there is no usable checkpoint (none was written yet)"
    if not all(torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point()):
        return f"{path} holds NaN weights, so there is no usable checkpoint"
    return f"the last good checkpoint is {path} (step {state.get('step', '?')})"


# -----------------------------------------------------------------------------
# The run: its state, its folder and log, its resume point, and how it stops

class Run:
    """One training run: its flags (run.cfg), runtime (run.rt), folder, log, clock and
    resume point (run.ckpt with --init_from=resume). A stop signal ends the loop at
    run.tick(), the resume point saved first (run.saver)."""

    # with Run(cfg, "train_spt.py", argv, resume_config) as run:   # lock out_dir; setup_runtime
    #     ... check the data, build the model (nothing written yet) ...
    #     run.begin(keep)                            # config.json, command.txt, log.jsonl
    #     ... the loop: run.log(...), run.tick() after each step, run.save_resume(...) ...
    #     run.write_summary(summary)
    # On entry: the run folder (runfiles.RunFolder) and, with --init_from=resume, its
    # checkpoint and resume_config(ckpt, cfg, argv); STOP_SIGNALS are the stop signals.

    def __init__(self, cfg, script, argv, resume_config):
        self.cfg, self.script, self.argv, self.resume_config = cfg, script, argv, resume_config
        configurator.check_open_files()
        configurator.check_threads()
        start = cfg.get("init_from", "")
        self.folder = runfiles.RunFolder(cfg["out_dir"], script, cfg["overwrite"], start == "resume",
                                         reads=[start] if start not in ("", "resume") else [])
        self.ckpt_path = os.path.join(cfg["out_dir"], "ckpt.pt")
        self.ckpt, self.saver, self.signum, self.steps, self.begun = None, None, None, 0, False

    def __enter__(self):
        self.folder.__enter__()
        try:
            if self.cfg["init_from"] == "resume":
                self.ckpt = load_checkpoint(self.ckpt_path)
                self.cfg = self.resume_config(self.ckpt, self.cfg, self.argv)
            self.rt = setup_runtime(self.cfg["device"], self.cfg["dtype"], self.cfg["seed"])
        except BaseException:
            self.folder.__exit__()
            raise
        self.start, self.before = time.time(), self.ckpt.get("wall_time", 0.0) if self.ckpt else 0.0
        self.handlers = {s: signal.signal(s, self.on_signal) for s in STOP_SIGNALS}
        return self

    def __exit__(self, kind, error, trace):
        for s, handler in self.handlers.items():
            signal.signal(s, handler)
        self.folder.__exit__()
        if kind is None:
            close_ddp(self.rt)
        elif issubclass(kind, KeyboardInterrupt) and not isinstance(error, Stopped):
            how = last_good_checkpoint(self.ckpt_path)
            how += (f": continue with --init_from=resume --out_dir={self.cfg['out_dir']}" if how.startswith(
                "the last good") else ": run the same command again" if not self.begun else
                ": start again with --overwrite=True")
            signum = self.signum or signal.SIGINT
            raise Stopped(STOP_WORD.get(signum, "terminated"), how, 128 + signum) from None

    def on_signal(self, signum, frame):
        """A stop signal: once the run has begun, the end of the step stops it, its resume point
        saved (tick); before, or at a second signal, now (if a finalizer swallows that, the flag stops it)."""
        first, self.signum = self.signum is None, self.signum or signum
        if not (first and self.begun):
            raise KeyboardInterrupt(STOP_WORD.get(self.signum, "terminated"))

    def tick(self):
        """After each optimizer step: stop if a signal asked to (the loop's resume point
        saved first, by run.saver), or after --halt_after_steps (as if killed: to test resume)."""
        self.steps += 1
        stop = self.signum is not None
        if self.rt.ddp:                                             # every rank stops at the same step
            flag = torch.tensor(float(stop), device=self.rt.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            stop = bool(flag.item())
        if stop:
            self.signum = self.signum or signal.SIGTERM                # another rank's signal
            self.saver()
            raise KeyboardInterrupt(STOP_WORD.get(self.signum, "terminated"))
        halt = self.cfg.get("halt_after_steps", 0)
        if halt and self.steps >= halt:
            raise SystemExit(f"halted after {self.steps} steps (--halt_after_steps)")

    def begin(self, keep=None, at=None, also=()):
        """Every check has passed: claim the folder (runfiles.RunFolder.begin), write
        config.json and command.txt (one more line per resume), and start log.jsonl and
        the `also` JSONL files: on resume only the records keep(record) says were written
        before the resume point stay, and log.jsonl gets a resume record at `at`."""
        self.folder.begin()
        if self.rt.master:
            path = os.path.join(self.cfg["out_dir"], "command.txt")
            earlier = open(path).read() if self.ckpt and os.path.isfile(path) else ""
            runfiles.write_file(path, earlier + shlex.join(["python", self.script, *self.argv]) + "\n")
            runfiles.write_json(os.path.join(self.cfg["out_dir"], "config.json"), self.cfg)
            for name in ("log.jsonl", *also):
                path = os.path.join(self.cfg["out_dir"], name)
                if name == "log.jsonl" or os.path.lexists(path):
                    kept = [r for r in runfiles.read_records(path) if keep(r)] if self.ckpt and \
                        os.path.exists(path) else []
                    runfiles.write_file(path, "")
                    runfiles.append_record(path, *kept)
        if self.ckpt:
            self.log(**at, event="resume", changed=self.cfg["resumes"][-1])
        self.begun = True
        if self.signum:                                             # one came while it was starting
            raise KeyboardInterrupt(STOP_WORD.get(self.signum, "terminated"))

    def log(self, file="log.jsonl", **record):
        """One record at the end of log.jsonl (or of `file`), on the master rank."""
        if self.rt.master:
            runfiles.append_record(os.path.join(self.cfg["out_dir"], file), record)

    def say(self, text):
        if self.rt.master:
            tqdm.write(text)

    def elapsed(self):
        """The run's wall time across resumes: the checkpoint's, plus this call's."""
        return self.before + time.time() - self.start

    def fingerprint(self, *datasets):
        """cfg["data_fingerprint"] (runfiles.data_fingerprint of the training sets): a
        resumed run refuses other data than its checkpoint's."""
        fp = runfiles.data_fingerprint(*datasets)
        if self.cfg.get("data_fingerprint", fp) != fp:
            raise ValueError(f"the training data is not the data this run was trained on (fingerprint {fp}, "
                             f"the checkpoint's {self.cfg['data_fingerprint']}); resume with the same data, or "
                             f"start a new run in another --out_dir")
        self.cfg["data_fingerprint"] = fp

    def save_resume(self, model, optimizers, **state):
        """ckpt.pt: what --init_from=resume needs to continue exactly: the weights, the
        optimizers, the RNG state, the config, the wall time, and the loop's own `state`."""
        if self.rt.master:
            ckpt = dict(model=unwrap(model).state_dict(), optimizers=[o.state_dict() for o in optimizers],
                        rng=torch.get_rng_state(), config=self.cfg, wall_time=self.elapsed(), **state)
            if torch.cuda.is_available():
                ckpt["cuda_rng"] = torch.cuda.get_rng_state()
            save_checkpoint(self.ckpt_path, ckpt)

    def save_weights(self, path, model, **extra):
        """A weights-only checkpoint (the best so far, an SPT epoch's): weights, config, `extra`."""
        if self.rt.master:
            save_checkpoint(path, dict(model=unwrap(model).state_dict(), config=self.cfg, **extra))

    def restore(self, model, optimizers, rng=True):
        """Continue from the resume point: its weights, optimizer states and (rng=True) RNG
        state; a loop that draws its batches from the RNG sets run.ckpt["rng"] itself."""
        if "optimizers" not in self.ckpt:
            raise ValueError(f"{self.ckpt_path} is from an older {self.script}: rerun it with --overwrite=True")
        load_weights(model, self.ckpt["model"])
        for o, state in zip(optimizers, self.ckpt["optimizers"]):
            o.load_state_dict(state)
        if rng:
            torch.set_rng_state(self.ckpt["rng"].cpu())
            if "cuda_rng" in self.ckpt and torch.cuda.is_available():
                torch.cuda.set_rng_state(self.ckpt["cuda_rng"].cpu())

    def replica_max_diff(self, model):
        """DDP check: the largest difference between any rank's weights and rank 0's."""
        flat = torch.cat([p.detach().flatten().double() for p in unwrap(model).parameters()])
        gathered = [torch.zeros_like(flat) for _ in range(self.rt.world_size)]
        dist.all_gather(gathered, flat)
        return max((g - gathered[0]).abs().max().item() for g in gathered)

    def write_summary(self, summary):
        if self.rt.master:
            runfiles.write_json(os.path.join(self.cfg["out_dir"], "summary.json"), summary)


def read_log(out_dir):
    """The records of a run's log.jsonl (runfiles.read_records: a last line cut short by a kill is dropped)."""
    return runfiles.read_records(os.path.join(out_dir, "log.jsonl"))
