"""
The command line of every script here, as nanoGPT's configurator.py: module-level
defaults in a dict, overridden by --key=value, type-checked and range-checked
before any work; a user error is one line on stderr, never a traceback.

  run_cli        call main(argv): a user error exits 1 with 'error: ...' (--debug=True shows the traceback)
  configure      the defaults with --key=value applied; --help lists every key
  flag_value     the raw value of one flag (for the flags that pick other defaults)
  check_ranges   every numeric flag inside its range (integers, counts and path lengths are bounded
                 when parsed, and by check_ranges' counts)
  resume_config  what a resumed run continues with (safe flags may change)
  note_code_changes  a resumed run that began under other defaults says which, and keeps its own
  check_memory   a model or batch too large for this machine, refused before anything is allocated
  check_open_files  an open-file limit (ulimit -n) too low for a run, refused first
  check_threads  an OMP_NUM_THREADS that torch would ignore (0, empty, not a number), refused first
  check_apart    a data folder that is the run folder, or inside it, refused
  check_device   the --device flag names a device this machine has
"""

import ast
import errno
import json
import math
import os
import shlex
import sys

import torch


# What a user can cause: a bad flag, a missing or malformed file, a folder in use, a
# run that diverged. Anything else is a bug in this code and keeps its traceback.
USER_ERRORS = (ValueError, FloatingPointError, FileNotFoundError, FileExistsError,
               PermissionError, IsADirectoryError, NotADirectoryError)
FULL_DISK = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO)   # a disk that takes no more writes
LIMITS = (errno.EMFILE, errno.ENFILE)        # too many open files: `ulimit -n` is too low
BAD_PATH = (errno.ELOOP, errno.ENOTDIR, errno.ENAMETOOLONG)   # a path that links to itself, runs through a file, ...
MAX_COUNT = 10**7         # examples to make or read at most: 50x LRA's largest split
MAX_SEED = 2**31 - 1      # every generator here (torch, numpy, Python) accepts it
MAX_INT = 2**63 - 1       # any integer flag: what numpy and torch can hold
NAME_MAX, PATH_MAX = 255, 4096   # bytes in one component of a path, and in a whole path (Linux)


def run_cli(main, argv=None):
    """Call main(argv). A user error (or a full disk) exits with status 1 and the single
    line 'error: ...' on stderr; --debug=True shows the traceback instead. Ctrl-C exits
    with 130, SIGTERM (Stopped) with 143, each with the message main attached to it (how
    to continue, if anything can)."""
    argv = sys.argv[1:] if argv is None else argv
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = SoftStream(sys.stdout), SoftStream(sys.stderr)
    try:
        return main(argv)
    except (*USER_ERRORS, OSError) as e:
        user = isinstance(e, USER_ERRORS) or getattr(e, "errno", None) in FULL_DISK + BAD_PATH + LIMITS
        if not user or str(flag_value(argv, "debug", "false")).lower() == "true":
            raise
        hint = "; raise the limit (ulimit -n 1024) and run it again" if getattr(e, "errno", None) in LIMITS else ""
        sys.exit("error: " + " ".join(str(e).split()) + hint)   # exit status 1, one line whatever the message
    except MemoryError as e:                           # numpy's too: an allocation the checks did not foresee
        if str(flag_value(argv, "debug", "false")).lower() == "true":
            raise
        sys.exit(f"error: out of memory ({' '.join(str(e).split())[:160]}); lower --batch_size or the model size")
    except KeyboardInterrupt as e:
        word = getattr(e, "word", "interrupted")
        print(word + (f"; {e}" if str(e) and str(e) != word else ""), file=sys.stderr)
        sys.exit(getattr(e, "status", 130))
    finally:
        sys.stdout, sys.stderr = streams


class SoftStream:
    """stdout or stderr as a run sees it: a character the terminal's encoding lacks is
    written escaped, and a stream that fails (a closed pipe, `| head -1`; a full device)
    never stops training, whose files are what count: the first failed write points the
    stream at /dev/null and the run goes on."""

    def __init__(self, stream):
        self.stream = stream
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError, OSError):
            pass

    def write(self, text):
        try:
            return self.stream.write(text)
        except OSError:
            self.silence()
            return len(text)

    def flush(self):
        try:
            self.stream.flush()
        except OSError:
            self.silence()

    def silence(self):
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self.stream.fileno())
            os.close(null)
        except (OSError, ValueError, AttributeError):
            pass

    def __getattr__(self, name):
        return getattr(self.stream, name)


class Stopped(KeyboardInterrupt):
    """A run stopped by Ctrl-C ("interrupted", exit 130) or SIGTERM ("terminated", exit
    143, as a shell reports a job killed by it); the message says how to continue."""

    def __init__(self, word, message, status):
        super().__init__(message)
        self.word, self.status = word, status


# -----------------------------------------------------------------------------
# --key=value overrides of a script's module-level defaults

def configure(defaults, argv=None, doc=""):
    """A copy of `defaults` with --key=value overrides applied. Values are parsed as
    Python literals (--lr=3e-4, --depth=2, --compile=True) and keep the default's type
    (a float also takes an int). Unknown keys and wrong types raise ValueError naming
    the valid keys. --help prints every key with its default and exits."""
    argv = sys.argv[1:] if argv is None else argv
    config = dict(defaults)
    for arg in argv:
        if arg in ("-h", "--help"):
            print(doc.strip() + "\n\nkeys (--key=value) and their defaults:")
            print("\n".join(f"  --{k}={v!r}" for k, v in defaults.items()))
            sys.exit(0)
        if not arg.startswith("--") or "=" not in arg:
            raise ValueError(f"argument {arg!r} is not of the form --key=value (try --help)")
        key, text = arg[2:].split("=", 1)
        if key not in defaults:
            raise ValueError(f"unknown key {key!r}; valid keys: {', '.join(defaults)}")
        config[key] = _parse_value(key, text, defaults[key])
    return config


def _parse_value(key, text, default):
    if isinstance(default, str):
        return check_path_length(key, text)           # strings are taken verbatim
    if len(text) > 40 and text.lstrip("+-").isdigit():
        raise ValueError(f"--{key}={text[:12]}... ({len(text)} digits) is too large; at most {MAX_INT}")
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        value = text.lower() if text.lower() in ("true", "false", "nan", "inf", "-inf") else text
        value = {"true": True, "false": False}.get(value, value)
        if isinstance(default, float) and value in ("nan", "inf", "-inf"):
            value = float(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"--{key}={text} is not a finite number")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
        raise ValueError(f"--{key}={text} is too large; at most {MAX_INT}")
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, (int, float)):
        ok = isinstance(value, (int, float) if isinstance(default, float) else int) and not isinstance(value, bool)
        value = float(value) if ok and isinstance(default, float) else value
    else:                                             # None or a container default
        ok = default is None or isinstance(value, type(default))
    if not ok:
        raise ValueError(f"--{key}={text} has the wrong type: expected {type(default).__name__} "
                         f"like the default {default!r}")
    return value


def check_path_length(key, text):
    """A string flag (often a path) whose components fit the file system: each at most
    NAME_MAX bytes, the whole at most PATH_MAX. Returns the text."""
    long = [c for c in text.split(os.sep) if len(c.encode(errors="surrogateescape")) > NAME_MAX]
    if long or len(text.encode(errors="surrogateescape")) > PATH_MAX:
        what = f"the name {long[0][:24]}... has {len(long[0].encode(errors='surrogateescape'))} bytes, more than " \
               f"{NAME_MAX}" if long else f"it has more than {PATH_MAX} bytes"
        raise ValueError(f"--{key}: {what}; choose a shorter one")
    return text


def given_keys(argv):
    """The keys set explicitly on this command line."""
    return [a[2:].split("=", 1)[0] for a in argv if a.startswith("--") and "=" in a]


def flag_value(argv, key, default):
    """The raw text of --key=... on this command line, the last one winning as in
    configure(); default if it is absent. For the keys that pick other defaults."""
    given = [a.split("=", 1)[1] for a in argv if a.startswith(f"--{key}=")]
    return given[-1] if given else default


def check_ranges(cfg, positive=(), nonnegative=(), fractions=(), seeds=("seed",), counts=()):
    """Refuse, before any work, a flag outside its range: `positive` > 0, `nonnegative`
    >= 0, `fractions` in [0, 1), `seeds` in [0, MAX_SEED], `counts` in [0, MAX_COUNT]."""
    for keys, ok, allowed in ((positive, lambda v: v > 0, "> 0"),
                              (nonnegative, lambda v: v >= 0, ">= 0"),
                              (counts, lambda v: 0 <= v <= MAX_COUNT, f"in [0, {MAX_COUNT:,}]"),
                              (fractions, lambda v: 0 <= v < 1, "in [0, 1)"),
                              (seeds, lambda v: 0 <= v <= MAX_SEED, f"in [0, {MAX_SEED}]")):
        for k in keys:
            if not ok(cfg[k]):
                raise ValueError(f"--{k}={cfg[k]} is out of range: it must be {allowed}")


def parse_int_list(key, text):
    """'1,10,50' -> {1, 10, 50}; anything else names the flag."""
    try:
        values = {int(e) for e in text.split(",") if e.strip()}
    except ValueError:
        values = {0}
    if any(v <= 0 for v in values):
        raise ValueError(f"--{key}={text} must be a comma list of positive integers, e.g. 1,10,50")
    return values


def resume_config(saved, given, explicit, safe, per_call=("debug",)):
    """The config a resumed run continues with: the checkpoint's, with out_dir the folder
    given (a moved folder resumes where it now is), and each flag named on this command
    line (`explicit`) applied when it is in `safe` (it cannot change what was computed so
    far, e.g. lr, max_hours); any other that differs is refused. `per_call` flags (where
    to stop this call) always take this command line's value; init_from keeps the run's
    own (where its weights came from), and each resume is listed under "resumes". A key
    the checkpoint lacks takes this command line's value, so a checkpoint saved before a
    flag existed still resumes. A folder whose log.jsonl is gone, or whose ckpt.pt is another
    run's, is refused. Returns (config, changed), changed = {key: [checkpoint's value, new value]}."""
    check_own_checkpoint(saved, given["out_dir"], set(safe) | set(per_call))
    if not os.path.exists(os.path.join(given["out_dir"], "log.jsonl")):
        raise FileNotFoundError(f"{os.path.join(given['out_dir'], 'log.jsonl')} is gone: the curves and the summary "
                                f"are read from the whole log, so this run cannot be resumed; start it again with "
                                f"--overwrite=True")
    config, changed, refused = dict(saved), {}, []
    config.update({k: v for k, v in given.items() if k not in saved})       # flags the checkpoint lacks
    for k in explicit:
        if k in ("init_from", "out_dir") or given[k] == saved.get(k):
            continue
        if k in safe:
            config[k], changed[k] = given[k], [saved.get(k), given[k]]
        else:
            refused.append(f"--{k}={given[k]} (the checkpoint has {saved.get(k)!r})")
    if refused:
        raise ValueError(f"--init_from=resume cannot change {', '.join(refused)}: the run would no longer be the "
                         f"one checkpointed. Flags it may change: {', '.join(safe)}. To change the others, start "
                         f"a new run in another --out_dir")
    if saved.get("out_dir") != given["out_dir"]:
        changed["out_dir"] = [saved.get("out_dir"), given["out_dir"]]
    config.update({k: given[k] for k in per_call}, out_dir=given["out_dir"])   # init_from stays the run's
    config["resumes"] = list(saved.get("resumes", [])) + [changed]
    return config, changed


def note_code_changes(out_dir, config_of, per_call=()):
    """Resume across versions: a resumed run keeps its own config (its checkpoint's), whatever
    this code's defaults are now. When this code would give the run's first command (the first
    line of command.txt) other values, or flags the run lacks, say which in one line.
    config_of(argv): the config of a command line under this code, before any check; per_call:
    the flags each call sets anew (where to stop), never a change."""
    try:
        with open(os.path.join(out_dir, "command.txt")) as f:
            first = shlex.split(f.readline())[2:]                 # python SCRIPT --key=value ...
        with open(os.path.join(out_dir, "config.json")) as f:
            saved = json.load(f)
    except (OSError, ValueError):
        return                                    # not a run folder: the folder check says so
    try:
        now = config_of(first)
    except ValueError as e:
        return print(f"note: this run's first command does not parse under this code ({e}); it resumes with "
                     f"its checkpoint's config")
    resumed = {k for r in saved.get("resumes", []) for k in r}    # changed on purpose at a resume
    skip = {"out_dir", "init_from", "overwrite", "resumes", "data_fingerprint", *per_call} | resumed
    differ = [f"{k}={saved[k]!r} (this code: {now[k]!r})" for k in sorted(set(saved) & set(now) - skip)
              if saved[k] != now[k]]
    new = [f"{k}={now[k]!r}" for k in sorted(set(now) - set(saved) - skip)]
    if differ or new:
        print("note: this run began under other defaults than this code's and keeps its own: "
              + (", ".join(differ) or "none differ") + (f"; flags new since, at this code's value: {', '.join(new)}"
                                                        if new else ""))


def check_own_checkpoint(saved, out_dir, free):
    """A ckpt.pt resumes only the run of its folder: the checkpoint's config must agree
    with the folder's config.json on every flag a resume may not change (`free` and the
    folder's own name aside), else it is another run's checkpoint copied in (another size,
    task or seed), and resuming it here would pass it off as this folder's run."""
    try:
        with open(os.path.join(out_dir, "config.json")) as f:
            folder = json.load(f)
    except (OSError, ValueError):
        return                                    # no config.json: the folder check refuses it, if need be
    skip = set(free) | {"out_dir", "init_from", "overwrite", "resumes"}
    for k in sorted(set(saved) & set(folder) - skip):
        if saved[k] != folder[k]:
            raise ValueError(f"{os.path.join(out_dir, 'ckpt.pt')} is not the run of this folder: its {k} is "
                             f"{saved[k]!r}, {os.path.join(out_dir, 'config.json')} says {folder[k]!r}. A "
                             f"checkpoint resumes only in its own run's folder: copy the whole folder, not ckpt.pt")


def memory_available():
    """Bytes of RAM the kernel says can be had without swapping (MemAvailable), or less
    where this process's address space is capped (ulimit -v) nearer its present size."""
    try:
        with open("/proc/meminfo") as f:
            free = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable"))
    except (OSError, StopIteration):
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        import resource
        cap = resource.getrlimit(resource.RLIMIT_AS)[0]
        with open("/proc/self/status") as f:
            size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize"))
    except (ImportError, OSError, StopIteration, ValueError):
        return free
    return free if cap == resource.RLIM_INFINITY else max(0, min(free, cap - size))


def check_memory(n_params, device, batch_values=0, bytes_per_param=16):
    """Refuse, before anything is allocated, a model whose weights, gradients and two AdamW
    moments (4 x 4 bytes a parameter), or a batch whose activations (batch_values float32
    numbers kept for backward: a lower bound), exceed the memory this device has free."""
    cuda = torch.cuda.is_available() and (str(device).startswith("cuda") or device == "auto")
    free = torch.cuda.mem_get_info()[0] if cuda else memory_available()
    if n_params * bytes_per_param > free:
        raise ValueError(f"the model has about {n_params:,} parameters: {n_params * bytes_per_param / 2**30:.1f} GiB "
                         f"to train, more than the {free / 2**30:.1f} GiB free here; lower --n_embd or the depth")
    if n_params * bytes_per_param + 4 * batch_values > free:
        raise ValueError(f"one batch keeps at least {4 * batch_values / 2**30:.1f} GiB of activations for backward, "
                         f"more than the {free / 2**30:.1f} GiB free here; lower --batch_size (use --grad_accum)")


def check_apart(data_dirs, out_dir):
    """A data folder is neither the run folder nor inside it: the run folder holds the
    run's own files only (data cached there would refuse its resume)."""
    run = os.path.join(os.path.realpath(out_dir), "")
    for d in data_dirs:
        if out_dir and os.path.join(os.path.realpath(d), "").startswith(run):
            raise ValueError(f"the data folder {d} is --out_dir={out_dir} or lies in it; give the data and the run "
                             f"separate folders")


def check_open_files(least=32):
    """Refuse, before any work, an open-file limit (ulimit -n) below what a run needs: its
    files, checkpoints, figures and data workers (a pool that cannot open its pipes hangs)."""
    try:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return
    if soft != resource.RLIM_INFINITY and soft < least:
        raise ValueError(f"the open-file limit is {soft} (ulimit -n), under the {least} a run needs; raise it "
                         f"(ulimit -n 1024) and run it again")


def check_threads():
    """OMP_NUM_THREADS, when set, is a positive whole number (or a comma list of them): torch
    ignores 0, an empty value or a word, and takes every core, which is not what was asked."""
    text = os.environ.get("OMP_NUM_THREADS")
    if text is not None and not all(t.strip().isdigit() and int(t) > 0 for t in text.split(",")):
        raise ValueError(f"OMP_NUM_THREADS={text!r} is not a positive whole number, so torch ignores it and "
                         f"uses {torch.get_num_threads()} threads; set it to the threads a run may use "
                         f"(OMP_NUM_THREADS=1), or unset it")


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
