"""
The flags of train_flt.py beyond DEFAULTS and RECIPES (which the script keeps, with the
recipe): the checks run on the flags before any work, so that a bad flag is one line
and nothing is written.

  RUN_DEFAULTS     the run's plumbing flags (out_dir, device, checkpoints, --compare, --evaluate)
  get_config       DEFAULTS and RUN_DEFAULTS, then the recipe, then every --key=value, then the checks
  model_args       looped.LoopedConfig's arguments from the flags
  check_config     every flag in its range, and only the flags that apply to this data and recipe
  only_flags       --compare and --evaluate read finished runs: no training flag beside them
  resume_config    what --init_from=resume continues with (RESUME_SAFE flags may change)
  check_reference  the 1-loop reference run of --reference, checked to be trained alike
"""

import json
import os

import configurator
from plumbing.training import read_log
from looped import LOSS_TYPES, VARIANTS

MAX_TEST_LOOPS = 1024               # the test-time loop curve's longest reach

# The run's plumbing flags: where it writes and reads, how often it checkpoints, on what
# device, and the two modes that read finished runs instead of training.
RUN_DEFAULTS = dict(
    out_dir="out/flt",
    data_dir="data/stdlib_docstrings",   # where the stdlib corpus is cached
    block_grads_every=1,     # log the per-(loop, block) gradient norms every N steps (0 = never; the
                             # gradient statistics read every step's total norm, never these)
    ckpt_interval=200,
    init_from="scratch",     # scratch or resume (from out_dir/ckpt.pt)
    stop_step=0,             # stop after this many steps (checkpointed), keeping max_steps' schedule; 0 = none
    sample_tokens=0,         # print a sample of this many bytes at the end (byte data)
    device="auto",           # auto, cpu, cuda, cuda:1, mps
    dtype="auto",            # auto (bfloat16 on a capable GPU, else float32), fast (the faster of the two here,
                             # timed on this run's model: cost.choose_dtype), float32, bfloat16
    compile=False,           # torch.compile the model
    compare="",              # DIR1,DIR2,...: draw the figures of finished runs into out_dir and exit (flt_report.py)
    evaluate="",             # DIR: print the test-time loop curve of the run in DIR (its ckpt.pt) and exit
    overwrite=False,         # replace the results of an earlier run in out_dir
    debug=False,             # show the traceback of a user error
)

# --init_from=resume continues the run in --out_dir, wherever that folder now is, with the
# checkpoint's config. Of the flags given with it, these are applied and recorded in config.json
# and log.jsonl (they cannot change what was computed so far); any other that differs is refused.
RESUME_SAFE = ("lr", "embedding_lr", "unembedding_lr", "lr_mult", "grad_clip", "eval_interval", "ckpt_interval",
               "stop_step", "sample_tokens", "block_grads_every", "device", "dtype", "compile", "debug")


def layered_config(defaults, recipes, argv, doc=""):
    """The flags before any check: DEFAULTS and RUN_DEFAULTS, then --optim's recipe (recipes:
    train_flt.RECIPES; a key given as a flag keeps the flag's value), then every --key=value:
    what a command line means under this code."""
    optim = configurator.flag_value(argv, "optim", defaults["optim"])
    if optim not in recipes:
        raise ValueError(f"--optim={optim} is not one of {tuple(recipes)}")
    listing = "\n".join(f"  --optim={name}: " + (", ".join(f"{k}={v!r}" for k, v in values.items()) or "DEFAULTS' values")
                        for name, values in recipes.items())
    return configurator.configure({**defaults, **RUN_DEFAULTS, **recipes[optim]}, argv,
                                  doc + "\n--optim=NAME sets (train_flt.RECIPES):\n" + listing)


def get_config(defaults, recipes, argv, doc):
    """Two passes: --optim picks the recipe's values, then every --key=value applies.
    Then the checks: a run's flags all of them, --compare's and --evaluate's their own."""
    cfg = layered_config(defaults, recipes, argv, doc)
    check_test_loops(cfg)
    given = configurator.given_keys(argv)
    if cfg["compare"]:
        only_flags(given, "compare", ("out_dir",))
        cfg["out_dir"] = cfg["out_dir"] if "out_dir" in given else ""     # "": flt_report.COMPARE_DIR
    elif cfg["evaluate"]:
        only_flags(given, "evaluate", ("test_loops", "device"))
    else:
        check_config(cfg, given)
        if cfg["init_from"] == "resume":
            configurator.note_code_changes(cfg["out_dir"], lambda first: layered_config(defaults, recipes, first),
                                            ("stop_step", "debug"))
        if cfg["reference"]:
            check_reference(cfg)
    return cfg


def model_args(cfg):
    """looped.LoopedConfig's arguments from the flags (byte data: 256 tokens)."""
    byte_data = cfg["data"] == "stdlib" or not os.path.isdir(cfg["data"])
    return dict(vocab_size=256 if byte_data else cfg["vocab_size"], **{k: cfg[k] for k in (
        "block_size", "n_layer", "n_loops", "n_head", "n_embd", "ffn_mult", "variant", "loss_type", "qk_norm",
        "softcap", "lm_head_std")})


def check_test_loops(cfg):
    """--test_loops in [0, MAX_TEST_LOOPS] (it also bounds --evaluate's curve)."""
    if not 0 <= cfg["test_loops"] <= MAX_TEST_LOOPS:
        raise ValueError(f"--test_loops={cfg['test_loops']} is out of range: it must be in [0, {MAX_TEST_LOOPS}] "
                         f"(0 = max(2 * n_loops, 12))")


def only_flags(given, mode, allowed):
    """--compare and --evaluate read finished runs: a training flag beside them would do nothing."""
    extra = [k for k in given if k not in (mode, "debug", *allowed)]
    if extra:
        raise ValueError(f"--{mode} reads finished runs and takes only {', '.join('--' + a for a in allowed)}; "
                         f"leave out {', '.join('--' + k for k in extra)}")


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
                                           "sample_tokens", "softcap", "lm_head_std", "block_grads_every"),
                              fractions=("beta1", "beta2", "warmdown_frac", "min_lr_frac"),
                              counts=("listops_examples", "listops_val"))
    d = cfg["n_embd"]
    configurator.check_memory(cfg["n_layer"] * (4 + 2 * cfg["ffn_mult"]) * d * d, cfg["device"],   # blocks: lower
                              cfg["batch_size"] * cfg["block_size"] * d * cfg["n_layer"] * cfg["n_loops"] * 4)  # bounds
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
    configurator.check_apart([cfg["data_dir"]] if data == "stdlib" else [data] if os.path.isdir(data) else [],
                             cfg["out_dir"])


def resume_config(ckpt, cfg, argv):
    """--init_from=resume: the checkpoint's config, with the RESUME_SAFE flags given now
    (configurator.resume_config); a checkpoint of train_spt.py is refused."""
    if "variant" not in ckpt["config"]:
        raise ValueError(f"{cfg['out_dir']}/ckpt.pt was not written by train_flt.py (train_spt.py's?); resume it "
                         f"with the script that wrote it")
    cfg, changed = configurator.resume_config(ckpt["config"], cfg, configurator.given_keys(argv), RESUME_SAFE,
                                              per_call=("stop_step", "debug"))
    if changed:
        print(f"resuming with changed flags (checkpoint's -> now): {changed}")
    if cfg["reference"]:
        check_reference(cfg)
    return cfg


def check_reference(cfg):
    """--reference names a finished 1-loop run trained and evaluated like this run: one
    loop, same data, recipe, lr, budget, sizes and eval set. Returns its val curve."""
    folder = cfg["reference"]
    try:
        with open(os.path.join(folder, "config.json")) as f:
            ref = json.load(f)
        with open(os.path.join(folder, "summary.json")) as f:
            finished = "final_val_loss" in json.load(f)
        records = read_log(folder)
    except (OSError, ValueError) as e:
        raise FileNotFoundError(f"--reference={folder} is not a finished run folder ({e})") from None
    if not finished:
        raise FileNotFoundError(f"--reference={folder}: its summary.json has no final_val_loss")
    keys = ["data", "optim", "lr", "lr_mult", "max_steps", "batch_size", "block_size", "n_layer", "n_embd",
            "eval_interval"] + (["listops_val", "listops_depth"] if cfg["data"] == "listops" else ["eval_batches"])
    differ = [k for k in keys if ref.get(k) != cfg[k]]
    if ref.get("n_loops") != 1 or differ:
        raise ValueError(f"--reference={folder} must be a 1-loop run trained like this one; it has "
                         f"n_loops={ref.get('n_loops')}" + (f" and differs in {differ}" if differ else ""))
    return {x["step"]: x["val_loss"] for x in records if "val_loss" in x}    # its val curve
