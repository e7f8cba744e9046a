"""
The command line of every script here, as nanoGPT's configurator.py: a module-level dict of
defaults, each overridden by --key=value, typed against it. A bad flag is one line, no traceback:

  configure   the defaults, then config files (plain assignments, as nanoGPT's config/*.py), then
              --key=value; an unknown key gets a did-you-mean; --help prints each key, its default
              and the comment beside it in DEFAULTS
  check       numbers inside their range (>= 0 unless said), words among their choices
  run_cli     call main(argv); a user error exits 1 with 'error: ...' (--debug=True: the traceback)"""

import ast
import difflib
import re
import runpy
import sys
from tqdm import tqdm

# What a user can cause (a bad flag or file, a folder in use, a run that diverged); a bug keeps its traceback
USER_ERRORS = (ValueError, FloatingPointError, FileNotFoundError, FileExistsError, PermissionError)


def configure(defaults, argv, doc="", source=None, files=()):
    """A copy of `defaults` with each config file's assignments, then every --key=value, applied.
    A value is read as a Python literal (--lr=3e-4, --compile=True) and must have its default's
    type (an int is a valid float; a string default takes the text as it is)."""
    cfg = dict(defaults)
    first = [f"--{k}={v}" for path in files for k, v in runpy.run_path(path).items() if not k.startswith("__")]
    for arg in first + list(argv):                           # the config files' assignments, as flags, first
        if arg in ("-h", "--help"):
            print(doc.strip() + "\n\n" + flag_help(defaults, source))
            sys.exit(0)
        key, eq, text = arg.removeprefix("--").partition("=")
        if not arg.startswith("--") or not eq:                 # e.g. --lr 3e-4, lr=3e-4
            raise ValueError(f"argument {arg!r} is not of the form --key=value (try --help)")
        if key not in defaults:
            near = "".join(f"; did you mean --{k}?" for k in difflib.get_close_matches(key, defaults, n=1))
            raise ValueError(f"unknown flag --{key}{near} (--help lists them)")
        cfg[key] = parse(key, text, defaults[key])
    return cfg


def parse(key, text, default):
    """--key's text as a value of its default's type."""
    if isinstance(default, str):
        return text
    try:
        value = ast.literal_eval(text.capitalize() if text.lower() in ("true", "false") else text)
    except (ValueError, SyntaxError):                 # not a literal: the text, refused below
        value = text
    want = type(default)
    value = float(value) if want is float and type(value) is int else value
    if type(value) is not want:                       # e.g. --depth=one, --lr=fast
        raise ValueError(f"--{key}={text}: expected a {want.__name__} like the default {default!r}")
    return value


def flag_help(defaults, source):
    """Each key with its default and the comment beside it (and its continuation lines) in DEFAULTS."""
    notes, last = {}, []
    text = open(source).read() if source else ""
    for line in text[text.find("DEFAULTS = dict("):].split("\n)\n")[0].splitlines():
        keys = re.findall(r"(?:^\s+|,\s*)(\w+)=", line.split("#")[0])
        if keys and "#" in line:
            last = [k for k in keys if k in defaults]
            notes.update({k: line.split("#", 1)[1].strip() for k in last})
        elif line.startswith(" " * 12) and line.strip().startswith("#") and last:   # a continued comment
            notes.update({k: notes[k] + " " + line.strip()[1:].strip() for k in last})
        else:
            last = []
    return "flags (--key=value), their defaults and what they do:\n" + "\n".join(
        f"  --{k}={v!r}" + (f"  # {notes[k]}" if k in notes else "") for k, v in defaults.items())


def check(cfg, positive=(), fractions=(), choices=None):
    """Refuse, in one line, a number outside its range (>= 0; > 0 for `positive`; [0, 1) for
    `fractions`) or a word outside its choices."""
    for k, v in cfg.items():
        rule = "> 0" if k in positive else "in [0, 1)" if k in fractions else ">= 0"
        if type(v) in (int, float) and not (v > 0 if k in positive else 0 <= v < 1 if k in fractions else v >= 0):
            raise ValueError(f"--{k}={v} must be {rule}")
    for k, allowed in (choices or {}).items():
        if cfg[k] not in allowed:
            raise ValueError(f"--{k}={cfg[k]!r} is not one of {', '.join(map(repr, allowed))}")


def run_cli(main, argv=None):
    """Call main(argv). A user error exits 1 with one line 'error: ...' on stderr (--debug=True
    keeps the traceback); a stop signal exits 128 + its number with what to do next."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        return main(argv)
    except (*USER_ERRORS, KeyboardInterrupt) as e:
        if "--debug=True" in argv:
            raise
        [bar.close() for bar in list(tqdm._instances)]       # a progress bar never shares the last line
        if not isinstance(e, KeyboardInterrupt):
            sys.exit("error: " + " ".join(str(e).split()))    # exit status 1
        print(str(e) or "interrupted", file=sys.stderr)       # Ctrl-C or a signal: it says how to continue
        sys.exit(getattr(e, "status", 130))
