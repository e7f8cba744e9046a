"""
The command line of every script here, as nanoGPT's configurator.py: the defaults are a
module-level dict, and --key=value overrides a key, typed against its default. A bad flag
is one line on stderr before any work is done, never a traceback:

  configure   the defaults, then the config files' values (nanoGPT's config/*.py: plain assignments),
              then --key=value; unknown keys get a did-you-mean; --help prints each key, its
              default and the comment beside it in DEFAULTS
  check       numbers inside their range (>= 0 unless said), words among their choices
  run_cli     call main(argv); a user error exits 1 with 'error: ...' (--debug=True: the traceback)
"""

import ast
import difflib
import re
import runpy
import sys

# What a user can cause: a bad flag, a missing or malformed file, a folder in use, a run that
# diverged. Anything else is a bug in this code and keeps its traceback.
USER_ERRORS = (ValueError, FloatingPointError, FileNotFoundError, FileExistsError, PermissionError)


def configure(defaults, argv, doc="", source=None, files=()):
    """A copy of `defaults` with each config file's assignments, then every --key=value, applied.
    A value is read as a Python literal (--lr=3e-4, --compile=True) and must have its default's
    type (an int is a valid float; a string default takes the text as it is)."""
    cfg = dict(defaults)
    for path in files:
        for key, value in runpy.run_path(path).items():
            if not key.startswith("__"):
                cfg[key] = parse(key, str(value), defaults.get(key, KeyError(f"{path}: unknown flag {key}")))
    for arg in argv:
        if arg in ("-h", "--help"):
            print(doc.strip() + "\n\n" + flag_help(defaults, source))
            sys.exit(0)
        key, eq, text = arg.removeprefix("--").partition("=")
        if not arg.startswith("--") or not eq:
            raise ValueError(f"argument {arg!r} is not of the form --key=value (try --help)")
        if key not in defaults:
            near = difflib.get_close_matches(key, defaults, n=1)
            raise ValueError(f"unknown flag --{key}" + (f"; did you mean --{near[0]}?" if near else "")
                             + " (--help lists them)")
        cfg[key] = parse(key, text, defaults[key])
    return cfg


def parse(key, text, default):
    """--key's text as a value of its default's type."""
    if isinstance(default, Exception):
        raise ValueError(str(default))
    if isinstance(default, str):
        return text
    try:
        value = ast.literal_eval(text.capitalize() if text.lower() in ("true", "false") else text)
    except (ValueError, SyntaxError):
        value = text
    want = type(default)
    if want is float and type(value) is int:
        value = float(value)
    if type(value) is not want:
        raise ValueError(f"--{key}={text}: expected a {want.__name__} like the default {default!r}")
    return value


def flag_help(defaults, source):
    """Each key with its default and the comment beside it in the source's DEFAULTS (and the
    comment lines that continue it)."""
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
        if type(v) in (int, float) and not (v > 0 if k in positive else v >= 0):
            raise ValueError(f"--{k}={v} must be {'>' if k in positive else '>='} 0")
    for k in fractions:
        if not 0 <= cfg[k] < 1:
            raise ValueError(f"--{k}={cfg[k]} must be in [0, 1)")
    for k, allowed in (choices or {}).items():
        if cfg[k] not in allowed:
            raise ValueError(f"--{k}={cfg[k]!r} is not one of {', '.join(map(repr, allowed))}")


def run_cli(main, argv=None):
    """Call main(argv). A user error exits 1 with one line 'error: ...' on stderr (--debug=True
    keeps the traceback); a stop signal exits 128 + its number with what to do next."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        return main(argv)
    except USER_ERRORS as e:
        if "--debug=True" in argv:
            raise
        sys.exit("error: " + " ".join(str(e).split()))
    except KeyboardInterrupt as e:
        print(str(e) or "interrupted", file=sys.stderr)
        sys.exit(getattr(e, "status", 130))
