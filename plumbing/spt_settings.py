"""
The named settings of train_spt.py, whose DEFAULTS sit at the top of the script:
--task=NAME starts from that task's values (TASKS: Amos et al.'s configs), --preset=NAME
then applies a named set of overrides (PRESETS), and the command line applies last.
check_config refuses a bad value, or a flag that does not apply to the run
(flag_scope), in one line before any work is done; resume_config says what
--init_from=resume continues with.

    python train_spt.py --task=synthetic --pretrain_epochs=0     # any key, as --key=value
    python train_spt.py --task=pathfinder --preset=cpu           # a named set of overrides
    python train_spt.py --help                                   # every key and its default
"""

import hashlib
import os

import configurator
from configurator import check_memory, check_ranges, configure, flag_value, given_keys, parse_int_list
from model import PARAM_GROUPS, TransformerConfig
from plumbing.runfiles import load_checkpoint

IMAGE_TASKS = ("image", "pathfinder", "pathx")   # their sequences are square images

# What each other task changes in train_spt.py's DEFAULTS (which are PathFinder's run, the
# README's main command). Amos et al.'s configs (IdoAmos/not-from-scratch, configs/experiment/
# lra/transformer-lra-<task>[-mlm].yaml: "-mlm" is their SPT phase); where a value is not in
# those files it says so. Every LRA task keeps DEFAULTS' init="amos" (their attention, mhfa:
# src/models/sequence/mha.py, whose clones(nn.Linear(d, d), 4) starts W_Q = W_K = W_V = W_O);
# the text tasks read tokens (pixel_encoder="token"), the pixel tasks keep their `encoder: linear`
# (configs/pipeline/{cifar,pathfinder}[-lm].yaml). SPT learning rate: their -mlm files have the
# finetuning one (PathFinder 5e-4 / 5e-4, Image 1e-3 / 1e-3), so pretrain_lr stays 0 (= lr); the
# per-task SPT rates said to be in their paper's hyper-parameter table (PathFinder 1e-3, ListOps
# 1e-3) are unverified here and not adopted.
TEXT = dict(init="amos", pixel_encoder="token")          # the LRA text tasks' common part
TASKS = {   # depth = n_layer
    "pathfinder": {},    # DEFAULTS (pathfinder(-mlm).yaml: 128 wide, 8 heads, ffn x1, lr 5e-4, batch 32,
                         # 50/200 epochs, warmup 2500 (SPT) / 5000), with one layer: --depth=4 is theirs
    "synthetic": dict(   # ours (the task is ours): the CPU recipe of REPORT.md's synthetic tables
        depth=1, n_embd=64, n_head=4, ffn_mult=2, lr=1e-3, batch_size=64, pretrain_epochs=10, epochs=20,
        mask_ratio=0.15, schedule="cosine", warmup_steps=0, pretrain_warmup_steps=0, warmup_frac=0.05,
        grad_clip=1.0, patience=20, init="torch", pixel_encoder="token"),
    "listops": dict(     # listops(-mlm).yaml: 6/512/8 heads, ffn x4, batch 32, 100/100 epochs, warmup 2000
        **TEXT, depth=6, n_embd=512, n_head=8, ffn_mult=4, batch_size=32, pretrain_epochs=100, epochs=100,
        warmup_steps=2000, pretrain_warmup_steps=2000,
        lr=1e-4,         # not checkable: the yaml says 0.05, surely overridden on their command line
        mask_ratio=0.10),   # set on their command line, not checkable in the yaml
    "text": dict(        # imdb(-mlm).yaml: weight decay 0.1, 32/65 epochs, warmup 5000 (SPT) / 2000
        **TEXT, depth=6, n_embd=512, n_head=8, ffn_mult=4, batch_size=32, pretrain_epochs=32, epochs=65,
        weight_decay=0.1, warmup_steps=2000, pretrain_warmup_steps=5000,
        lr=1e-4, mask_ratio=0.15),   # not checkable, as for listops
    "retrieval": dict(   # aan(-mlm).yaml: 4/128/4 heads, ffn x4, 32/32 epochs, warmup 2000 (SPT) / 5000
        **TEXT, depth=4, n_embd=128, n_head=4, ffn_mult=4, batch_size=32, pretrain_epochs=32, epochs=32,
        warmup_steps=5000, pretrain_warmup_steps=2000,
        lr=1e-4, mask_ratio=0.15),   # not checkable, as for listops
    "image": dict(       # cifar(-mlm).yaml: 3/64/4 heads, ffn x2, lr 1e-3, 50/200 epochs, warmup 2500 / 2000,
        depth=3, n_embd=64, n_head=4, ffn_mult=2, lr=1e-3, batch_size=50,   # finetuning batch 50 (SPT: 32)
        pretrain_epochs=50, epochs=200, warmup_steps=2000, pretrain_warmup_steps=2500, mask_ratio=0.50),
    "pathx": dict(       # pathx-small.yaml: 4 layers, 4 heads, max pooling, batch 32, 200 epochs, warmup 5000
        depth=4, n_head=4, pool="max", pretrain_warmup_steps=5000,
        pretrain_epochs=50),   # not checked: their PathX SPT config was not read; PathFinder's value
    "photos": dict(      # ours: crops of a photograph (data_lra.load_photos), only ever a --pretrain_task
        depth=1, n_embd=64, n_head=4, ffn_mult=1, lr=1e-3, batch_size=32, pretrain_epochs=10, epochs=1,
        warmup_steps=0, pretrain_warmup_steps=0),
}
PRETRAIN_ONLY = ("photos",)   # no labels: SPT data for another task, never a task to finetune on

# Named sets of overrides (--preset=...), applied after the task's defaults and before
# the command line: "*" for every task, then the task's own. Ours, not Amos et al.'s:
# see REPORT.md's departures table and its CPU-scale LRA setting.
PRESETS = {
    "": {},
    "cpu": {
        # Runs of a few epochs: a warmup of 5% of the phase and a cosine decay instead of
        # thousands of warmup steps at a constant rate; clipping and early stopping. dtype
        # fast: float32 or bf16 autocast, whichever steps faster on this CPU, timed on the
        # run's own model (cost.choose_dtype): bf16 took 0.87-0.88 of the float32 step at
        # depth 1 and 4 on one CPU that computes it, 5x on an AVX2-only one that emulates it.
        # Every core by default when a run is alone.
        "*": dict(schedule="cosine", warmup_steps=0, pretrain_warmup_steps=0, warmup_frac=0.05,
                  grad_clip=1.0, patience=20, dtype="fast"),
        # About 40 min on one core that computes bf16, at depth 1 (SPT 12 + finetuning 5 epochs on
        # 8,000 images of 1,024 pixels; 12 + 1 epochs measured in 30 min, REPORT.md's LRA setting);
        # about 1.6 h in float32 on an AVX2-only CPU (the command's own estimate). SPT at a higher lr,
        # as it must get below the pixels' unigram entropy (0.79 nats) to teach anything.
        # --depth=4 is about 4x slower.
        "pathfinder": dict(difficulty="baseline", n_generate=10_000, depth=1, n_embd=64, n_head=4,
                           lr=1e-3, pretrain_lr=3e-3, batch_size=32, pretrain_epochs=12, epochs=5,
                           save_epochs="1,2,5,10"),
        # About an hour at depth 1 (2 s a step on one core): 4,800 training expressions of
        # 500-2,000 tokens, SPT 6 + finetuning 4 epochs; 250 val and 250 test expressions (the
        # 2% splits of 12,500, cut by n_train), as 100 would leave +-4 points of sampling noise.
        "listops": dict(n_generate=12_500, n_train=4_800, depth=1, n_embd=64, n_head=4, ffn_mult=2, lr=1e-3,
                        pretrain_lr=3e-3, batch_size=32, pretrain_epochs=6, epochs=4, save_epochs="1,2,5"),
    },
    # SPT against scratch on PathFinder on a CPU (tools/lra_rescue.py runs its arms; REPORT.md,
    # A9, says why each value). Two layers: joining two markers means chaining local hops along
    # a contour, and one attention layer makes one hop. 10,000 images at the baseline
    # difficulty (8,000 to train), batch 32, constant rates after a 5% warmup, so that a longer
    # from-scratch run starts as the shorter one. SPT 11 epochs (2,750 steps) at 3e-3, then
    # finetuning 16 epochs (4,000 steps) at 1e-3: a seed-0 probe took off in its 7th epoch.
    # float32: the probe's dtype, and one dtype for every seed and every machine of a sweep.
    # About 3 h a run on one core, two runs side by side: 1.3 s a step on a Zen 5 EPYC, 1.76 s (3.3 h
    # a scratch run) on a Zen 3 EPYC without AVX-512 (REPORT.md, take-off rates).
    "cpu_rescue": {
        "*": dict(schedule="constant", pretrain_schedule="constant", warmup_steps=0, pretrain_warmup_steps=0,
                  warmup_frac=0.05, grad_clip=1.0, patience=0, dtype="float32"),
        "pathfinder": dict(difficulty="baseline", n_generate=10_000, depth=2, n_embd=64, n_head=4,
                           lr=1e-3, pretrain_lr=3e-3, batch_size=32, pretrain_epochs=11, epochs=16,
                           save_epochs="1,5,11"),
    },
}


# The run's plumbing flags: where it writes, how it logs and checkpoints, on what device.
# They change no result (a resumed run may change most of them: RESUME_SAFE).
RUN_DEFAULTS = dict(
    out_dir="",              # "" = out/<task>_d<depth>_<pretrain_epochs>ep[_<flags that differ>]
    overwrite=False,         # replace the results of an earlier run in out_dir
    log_every=10, ckpt_every=0,   # steps (ckpt_every 0 = end of each epoch only)
    snapshot_attn_every=0,   # steps; save layer-0 attention maps to plot their evolution
    halt_after_steps=0,      # stop as if killed after this many steps (to test resume)
    report="",               # comma list of folders: their summary.json as one table (spt_report.report)
    device="auto", dtype="auto",   # auto: bf16 on a GPU that has it, else float32; fast: timed (cost.choose_dtype)
    compile=False, num_workers=0, debug=False,
)
# The model size, optimisation and epochs every task sets: a run folder's name lists them last.
SIZE_KEYS = ("depth", "n_embd", "n_head", "ffn_mult", "lr", "batch_size", "pretrain_epochs", "epochs")


def settings_help():
    """--help's last part: each task's values and each preset's overrides."""
    lines = ["", "--task=NAME changes (Amos et al.'s values for the other tasks; spt_settings.TASKS):"]
    lines += [f"  {t}: " + (", ".join(f"{k}={v!r}" for k, v in values.items()) or "DEFAULTS' values")
              for t, values in TASKS.items()]
    lines += ["--preset=NAME then sets (spt_settings.PRESETS; '*' = every task):"]
    lines += [f"  {p} [{t}]: " + ", ".join(f"{k}={v!r}" for k, v in values.items())
              for p, per_task in PRESETS.items() for t, values in per_task.items()]
    return "\n".join(lines)


def preset_values(preset, task):
    """The overrides --preset=<preset> makes for --task=<task>."""
    return {**PRESETS[preset].get("*", {}), **PRESETS[preset].get(task, {})}


RESUME_SAFE = ("lr", "pretrain_lr", "grad_clip", "max_hours", "patience", "log_every", "ckpt_every",
               "halt_after_steps", "device", "dtype", "compile", "num_workers", "debug")


def flag_scope(cfg):
    """Where each flag that not every run reads applies: flag -> (does it apply to this
    run?, where it applies). A flag given on the command line where it does not apply
    is refused (check_config), so no flag is ever silently ignored."""
    tasks = {cfg["task"], cfg["pretrain_task"] or cfg["task"]}
    on = lambda *names: (bool(tasks & set(names)), "--task=" + "|".join(names))
    given_weights = cfg["init_from"] not in ("", "resume")
    spt = (cfg["pretrain_epochs"] > 0 and not given_weights, "a run with an SPT phase (--pretrain_epochs > 0 "
                                                                "and no --init_from checkpoint)")
    return dict(
        max_len=on("listops", "text", "retrieval"), n_generate=on("listops", "pathfinder", "pathx", "photos"),
        data_source=on("listops", "pathfinder", "pathx"), difficulty=on("pathfinder", "pathx"),
        data_dir=(tasks != {"synthetic"}, "the LRA tasks (the synthetic task is made in memory)"),
        pretrain_task=spt, spt_objective=spt, mask_ratio=spt, pretrain_lr=spt, pretrain_schedule=spt,
        pretrain_warmup_steps=spt, save_epochs=spt,
        init_params=(spt[0] or given_weights, "finetuning from SPT weights (an SPT phase or --init_from=CHECKPOINT)"),
        pretrain_epochs=(cfg["pretrain_epochs"] == 0 or not given_weights,
                         "a run that pretrains itself; --init_from=CHECKPOINT finetunes from that checkpoint instead"))


def layered_config(defaults, argv, doc=""):
    """The flags before any check: DEFAULTS and RUN_DEFAULTS, then --task's values (TASKS),
    then --preset's overrides (PRESETS), then every --key=value. What a command line means
    under this code, whether or not its files exist here (tools/lra_rescue.py reads records so)."""
    task = flag_value(argv, "task", defaults["task"])
    if task not in TASKS:
        raise ValueError(f"--task={task} is unknown; choose one of {list(TASKS)}")
    preset = flag_value(argv, "preset", defaults["preset"])
    if preset not in PRESETS:
        raise ValueError(f"--preset={preset} is unknown; choose one of {[p for p in PRESETS if p]}")
    return configure({**defaults, **RUN_DEFAULTS, **TASKS[task], **preset_values(preset, task)}, argv,
                     doc + settings_help())


def get_config(defaults, argv, doc=""):
    """Two passes: --task picks the task's values and --preset its overrides, then every
    --key=value applies; then the checks. A run's out_dir defaults to default_out_dir."""
    cfg = check_config(layered_config(defaults, argv, doc), given_keys(argv))
    if cfg["init_from"] == "resume":
        configurator.note_code_changes(cfg["out_dir"], lambda first: layered_config(defaults, first),
                                        ("halt_after_steps", "debug"))
    if not cfg["report"]:
        cfg["out_dir"] = cfg["out_dir"] or default_out_dir(cfg, defaults)
        if {cfg["task"], cfg["pretrain_task"] or cfg["task"]} != {"synthetic"}:     # data_dir is read
            configurator.check_apart([cfg["data_dir"]], cfg["out_dir"])
    return cfg


def resume_config(ckpt, cfg, argv):
    """--init_from=resume: the checkpoint's config, with the RESUME_SAFE flags given now
    (configurator.resume_config); a checkpoint of train_flt.py is refused."""
    if "task" not in ckpt["config"]:
        raise ValueError(f"{cfg['out_dir']}/ckpt.pt was not written by train_spt.py (train_flt.py's?); "
                         f"resume it with the script that wrote it")
    cfg, changed = configurator.resume_config(ckpt["config"], cfg, given_keys(argv), RESUME_SAFE,
                                              per_call=("halt_after_steps", "debug"))
    if changed:
        print(f"resuming with changed flags (checkpoint's -> now): {changed}")
    return cfg


def check_config(cfg, given=()):
    """Refuse bad values before any work is done, naming what is allowed. `given`: the
    keys on the command line (a flag that does not apply to this run is refused)."""
    if cfg["report"] and set(given) - {"report", "out_dir", "debug"}:
        raise ValueError(f"--report gathers finished runs and takes no other flag but --out_dir (got "
                         f"{', '.join('--' + k for k in given if k not in ('report', 'out_dir', 'debug'))})")
    schedules = ("cosine", "linear", "constant")   # training.Schedule's (warmdown is train_flt's)
    choices = dict(pretrain_task=("",) + tuple(TASKS), spt_objective=("masked", "causal"),
                   data_source=("auto", "generated", "release"),
                   schedule=schedules, pretrain_schedule=("",) + schedules)
    for key, allowed in choices.items():
        if cfg[key] not in allowed:
            raise ValueError(f"--{key}={cfg[key]} is not one of {allowed}")
    groups = set(PARAM_GROUPS) | {"all"}
    for key in ("freeze", "init_params"):
        bad = [g for g in cfg[key].split(",") if g.strip() not in groups | {"none"}]
        if bad:
            raise ValueError(f"--{key}={cfg[key]}: unknown parameter group {bad[0]!r}; choose from "
                             f"{sorted(groups)}, a comma list of them, or none")
    check_ranges(cfg, positive=("depth", "n_embd", "n_head", "ffn_mult", "lr", "batch_size", "grad_accum",
                                "log_every", "max_hours"),
                 nonnegative=("epochs", "pretrain_epochs", "n_generate", "max_len", "n_train", "n_eval", "patience",
                              "weight_decay", "grad_clip", "pretrain_lr", "ckpt_every", "warmup_steps",
                              "pretrain_warmup_steps",
                              "snapshot_attn_every", "halt_after_steps", "num_workers"),
                 fractions=("dropout", "warmup_frac"))
    TransformerConfig(n_layer=cfg["depth"], n_head=cfg["n_head"], n_embd=cfg["n_embd"],   # model flags,
                      ffn_mult=cfg["ffn_mult"], pos_enc=cfg["pos_enc"], pool=cfg["pool"],   # before
                      init=cfg["init"], pixel_encoder=cfg["pixel_encoder"])            # the data
    if cfg["task"] in PRETRAIN_ONLY:
        raise ValueError(f"--task={cfg['task']} has no labels to finetune on; use it as --pretrain_task="
                         f"{cfg['task']} with --task=pathfinder (or another image task)")
    if cfg["pixel_encoder"] == "linear" and cfg["task"] not in IMAGE_TASKS:   # (a pretraining task is
        raise ValueError(f"--pixel_encoder=linear reads grey levels: it applies only to "   # one of them too:
                         f"{', '.join(IMAGE_TASKS)}; use --pixel_encoder=token here")        # check_data)
    if cfg["epochs"] == 0 and (cfg["pretrain_epochs"] == 0 or cfg["init_from"] not in ("", "resume")):
        raise ValueError("--epochs=0 runs the SPT phase alone; it needs --pretrain_epochs > 0 and no "
                         "--init_from checkpoint")
    if not 0 < cfg["mask_ratio"] < 1:
        raise ValueError(f"--mask_ratio={cfg['mask_ratio']} must be between 0 and 1")
    parse_int_list("save_epochs", cfg["save_epochs"])
    for key, (applies, where) in flag_scope(cfg).items():
        if key in given and not applies and cfg["init_from"] != "resume":
            raise ValueError(f"--{key}={cfg[key]} does not apply to --task={cfg['task']} here: it applies only "
                             f"to {where}; leave it out")
    if "all" in cfg["freeze"].split(","):
        raise ValueError("--freeze=all leaves nothing to train; freeze a group: attn, qk, qkv, mlp, emb")
    d, depth = cfg["n_embd"], cfg["depth"]
    check_memory(depth * (4 + 2 * cfg["ffn_mult"]) * d * d, cfg["device"])    # the blocks alone: a lower bound
    if cfg["pretrain_task"] not in ("", cfg["task"]) and task_vocabulary(cfg["pretrain_task"]) != \
            task_vocabulary(cfg["task"]):
        raise ValueError(vocabulary_mismatch(cfg, task_vocabulary(cfg["pretrain_task"]), task_vocabulary(cfg["task"])))
    if cfg["n_generate"] and cfg["task"] in ("listops", "pathfinder", "pathx"):
        import data_lra
        data_lra.check_generate(cfg["task"], cfg["n_generate"])
    if cfg["init_from"] not in ("", "resume"):
        if not os.path.exists(cfg["init_from"]):
            raise FileNotFoundError(f"--init_from={cfg['init_from']}: no such checkpoint")
        given_ckpt = load_checkpoint(cfg["init_from"])
        if not all(v.isfinite().all() for v in given_ckpt["model"].values() if v.is_floating_point()):
            raise ValueError(f"--init_from={cfg['init_from']} holds NaN or inf weights (its run diverged); "
                             f"finetune from an earlier checkpoint of it")
        check_shape_of(given_ckpt, cfg)
    return cfg


def check_shape_of(ckpt, cfg, keys=("depth", "n_embd", "n_head", "ffn_mult")):
    """An --init_from checkpoint is a train_spt.py model of this run's shape (before anything is written)."""
    theirs = ckpt.get("config") if isinstance(ckpt.get("config"), dict) else {}
    if "task" not in theirs:
        raise ValueError(f"--init_from={cfg['init_from']} was not written by train_spt.py (no task in its config); "
                         f"finetune from a train_spt.py checkpoint such as RUN/spt_best.pt")
    differ = [f"--{k}={theirs.get(k)} there, {cfg[k]} here" for k in keys if theirs.get(k) != cfg[k]]
    if differ:
        raise ValueError(f"--init_from={cfg['init_from']} is a model of another shape ({'; '.join(differ)}); "
                         f"give this run the same model flags")


def default_out_dir(cfg, defaults):
    """out/<task>_d<depth>_<pretrain_epochs>ep, plus every other flag that differs
    from the task's defaults, so two different runs never share a folder."""
    base = {**defaults, **RUN_DEFAULTS, **TASKS[cfg["task"]], **preset_values(cfg["preset"], cfg["task"])}
    skip = {"task", "depth", "pretrain_epochs", "out_dir", "overwrite", "device", "dtype", "compile",
            "num_workers", "debug", "log_every", "halt_after_steps"}
    size = [k for k in TASKS[cfg["task"]] if k in SIZE_KEYS]
    extra = "".join(f"_{k}-{cfg[k]}" for k in [k for k in base if k not in size] + size
                    if k not in skip and cfg[k] != base[k])
    extra = extra.replace("/", "-").replace(",", "+")
    if len(extra) > 100:                                  # long: keep it unique, not readable
        extra = extra[:80] + "_" + hashlib.sha1(extra.encode()).hexdigest()[:10]
    return os.path.join("out", f"{cfg['task']}_d{cfg['depth']}_{cfg['pretrain_epochs']}ep{extra}")



def task_vocabulary(task):
    """(vocab size, pad id, mask id) of a task, known without reading its data."""
    if task == "synthetic":
        import synthetic                                          # here: parsing flags loads no data code
        ds = synthetic.load_split("val", n=2)                     # made in memory: instant
        return ds.vocab_size, ds.pad_id, ds.mask_id
    import data_lra
    if task == "listops":
        return data_lra.LISTOPS_VOCAB, data_lra.LISTOPS_PAD, data_lra.LISTOPS_MASK
    return data_lra.BYTE_VOCAB, data_lra.BYTE_PAD, data_lra.BYTE_MASK


def vocabulary_mismatch(cfg, pre, task):
    return (f"--pretrain_task={cfg['pretrain_task']} has vocabulary (size, pad, mask) {pre} but "
            f"--task={cfg['task']} has {task}: its token ids would mean other tokens here. Pretrain on a task "
            f"with the same vocabulary (image, pathfinder and pathx share one), or copy only weights that do "
            f"not read tokens from its checkpoint: --init_from=RUN/spt_best.pt --init_params=attn")


def check_data(cfg, rt, splits):
    """Every split holds examples, the training sets at least one global batch, and a
    pretraining task speaks the task's vocabulary (else its ids would alias silently)."""
    vocab = lambda ds: (ds.vocab_size, ds.pad_id, ds.mask_id)
    if vocab(splits["pretrain"]) != vocab(splits["train"]):
        raise ValueError(vocabulary_mismatch(cfg, vocab(splits["pretrain"]), vocab(splits["train"])))
    G = cfg["batch_size"] * cfg["grad_accum"] * rt.world_size
    for name, ds in splits.items():
        if len(ds) == 0:
            raise ValueError(f"the {name} split of --task={cfg['task']} is empty (data under "
                             f"{cfg['data_dir']}); check the files or --n_train/--n_eval")
        if name in ("train", "pretrain") and len(ds) < G:
            raise ValueError(f"the {name} split has {len(ds)} examples, fewer than one global batch "
                             f"of {G}; lower --batch_size or --grad_accum")
    d, T = cfg["n_embd"], max(ds.max_len for ds in splits.values())        # a lower bound of the activations
    check_memory(cfg["depth"] * (4 + 2 * cfg["ffn_mult"]) * d * d, rt.device,
                 cfg["batch_size"] * T * d * cfg["depth"] * 4)

