"""
Self-pretraining (SPT) then finetuning, with every ablation of "Towards Understanding
Self-Pretraining for Sequence Classification" (Coser et al. 2026).

    python train_spt.py --task=synthetic                          # SPT, then finetune (minutes on a CPU)
    python train_spt.py --task=synthetic --pretrain_epochs=0      # from scratch
    python train_spt.py --task=synthetic --pretrain_epochs=0 --freeze=attn   # keep random attention
    python train_spt.py --task=synthetic --init_params=qk --init_from=out/x/spt_best.pt
    python train_spt.py --task=pathfinder --depth=1               # LRA, Amos et al.'s one-GPU settings
    torchrun --standalone --nproc_per_node=2 train_spt.py --task=synthetic

Phase 1 (SPT): masked-token reconstruction on the task's own training split (Amos et al. 2024). Phase 2:
classification from the best SPT weights (all, or only the group --init_params). A run writes config.json, log.jsonl,
summary.json, checkpoints and figures into out_dir. Read top to bottom: the flags, the seeds, the objectives
(MaskedReconstruction is SPT), hybrid init and freezing, train_phase (THE loop), evaluate, the data, main. training.py
holds the run folder, checkpoints and signals; synthetic.py and data_lra.py the data; analysis.py the attention
statistics.
"""

import math
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

import analysis
import synthetic
from configurator import check, configure, run_cli
from model import PARAM_GROUPS, Transformer, TransformerConfig, select_params
from training import (NonFiniteGuard, Run, choose_fast_dtype, default_out_dir, grad_sync, load_checkpoint,
                      load_weights, read_log, replica_max_diff, step_seconds, wrap)

# -----------------------------------------------------------------------------
# The flags, each a --key=value (--help lists them with these comments). DEFAULTS are the README's main command,
# `python train_spt.py --task=pathfinder --depth=1`: Amos et al.'s PathFinder run (IdoAmos/not-from-scratch, configs/
# experiment/lra/transformer-lra-pathfinder[-mlm].yaml; "-mlm" is their SPT phase) with one layer, as the paper studies.

DEFAULTS = dict(
    task="pathfinder",       # synthetic, listops, text, retrieval, image, pathfinder, pathx
    pretrain_task="",        # "" = the task itself; else pretrain on another task's data
    data_dir="data",
    data_source="auto",      # auto | generated | release  (listops, pathfinder, pathx)
    n_generate=0,            # size of a generated dataset, all splits (0 = the release size)
    difficulty="contour_length_14",  # pathfinder/pathx: baseline, contour_length_9, contour_length_14 (LRA's)
    max_len=0,               # text, retrieval, listops: longest sequence (0 = LRA's: 4096, 4000, 2000)
    n_train=0, n_eval=0,     # use only the first n training / val and test examples (0 = all)
    seed=0,
    # model: their PathFinder model (width 128, 8 heads, MLP x1) with one layer
    depth=1,                 # the paper's one-layer model (their PathFinder config has 4: --depth=4)
    n_embd=128, n_head=8, ffn_mult=1,  # width, heads, MLP width / n_embd
    pos_enc="sinusoidal", pool="mean", dropout=0.0,  # positions: sinusoidal, learned, rope, none; pool: mean, max, cls
    init="amos",             # amos: PyTorch's defaults, then W_Q = W_K = W_V = W_O, as their clones(nn.Linear(d, d),
                             # 4) (src/models/sequence/mha.py); torch: PyTorch's defaults; gpt2: N(0, 0.02)
    pixel_encoder="linear",  # linear: their [-1, 1] grey value and a mask flag through nn.Linear(2, d); token
    # self-pretraining
    pretrain_epochs=50,      # 0 = from scratch
    spt_objective="masked",  # masked | causal (next-token)
    mask_ratio=0.50,         # the share of real pixels SPT hides (theirs for the image tasks; text: 0.15)
    save_epochs="1,10,50,100,200",   # also keep the SPT weights after these epochs
    # finetuning and the ablations
    epochs=200,              # finetuning epochs (0 = SPT alone: its checkpoints are the product)
    init_from="",            # "" = this run's best SPT checkpoint | resume | a checkpoint path
    init_params="all",       # which groups to take from the SPT checkpoint (qk, qkv, attn, mlp, emb, all)
    freeze="none",           # keep these groups fixed while finetuning (attn, qk, ...): at init, or SPT's values
    patience=0,              # early stopping: epochs without a better val accuracy (0 = off, as theirs)
    max_hours=24.0,          # wall-time cap of each phase (theirs: 24 h on one GPU)
    # optimisation (AdamW)
    lr=5e-4, batch_size=32,  # peak learning rate; examples per optimizer step and process
    weight_decay=0.0, grad_clip=0.0, grad_accum=1,  # grad_clip 0 = none; grad_accum: micro-batches per step
    schedule="constant",     # after the warmup: constant, cosine or linear (to 0.1 x lr)
    warmup_steps=5000,       # linear warmup of the finetuning phase, in optimizer steps...
    pretrain_warmup_steps=2500,   # ... and of the SPT phase
    warmup_frac=0.0,         # or: warmup over this fraction of each phase (used when the steps are 0)
    pretrain_lr=0.0,         # 0 = same as lr (their -mlm file has the finetuning one)
    pretrain_schedule="",    # "" = same as schedule
    preset="",               # "", cpu or cpu_rescue: config/<task>_<preset>.py, applied before the flags
    # the run's plumbing: it changes no result, and a resumed run may change it (FREE)
    out_dir="",              # "" = out/<task>_d<depth>_<pretrain_epochs>ep[_<flags that differ>]
    overwrite=False,         # replace the results of an earlier run in out_dir
    log_every=10, ckpt_every=0,   # steps (ckpt_every 0 = at the end of each epoch only)
    snapshot_attn_every=0,   # steps; layer-0 attention maps into snapshots.jsonl (tools/attention_gif.py draws them)
    halt_after_steps=0,      # stop after this many steps, resume point saved (to test resume)
    device="auto", dtype="auto",  # auto: bf16 on a GPU that has it, else float32; fast: the faster, timed here
    compile=False, num_workers=0, debug=False,   # torch.compile; DataLoader workers; tracebacks
)
FREE = ("max_hours", "patience", "log_every", "ckpt_every", "snapshot_attn_every", "halt_after_steps",
        "device", "dtype", "compile", "num_workers", "debug", "overwrite")

# --task=NAME applies config/NAME.py (Amos et al.'s values, each file citing their config), --preset=NAME then
# config/<task>_NAME.py (ours, for a CPU), and the flags apply last; the run prints what its config files set.
# IMAGE_TASKS' sequences are square images of grey levels.
HERE = os.path.dirname(os.path.abspath(__file__))
TASKS = ("synthetic", "listops", "text", "retrieval", "image", "pathfinder", "pathx", "photos")
IMAGE_TASKS = ("image", "pathfinder", "pathx", "photos")

# Seeds. Each random stream has its own seed derived from --seed, so changing one thing (the number of epochs, the
# mask ratio) never shifts another stream.
MASK_SEED_OFFSET = 7          # the SPT masks' stream: apart from the model init, which uses --seed itself
VAL_MASK_SEED = 1234          # validation masks: the same every epoch and every seed, so SPT val losses compare
BATCH_SEED_STRIDE = 100_003   # batch order: seed * stride + 2 * epoch + (1 in SPT): a prime above
                              # 2 x any epoch count, so (seed, epoch, phase) never collide


# -----------------------------------------------------------------------------
# The two objectives, as modules so that DDP and torch.compile see one forward

class MaskedReconstruction(torch.nn.Module):
    """SPT objective (Amos et al. 2024): x~ = x with a random set M of real positions replaced by [MASK];
    L = -(1/|M|) sum_{i in M} log p(x_i | x~)  (loss only on M). Retrieval pairs (B, 2, T) are two sequences each.
    causal=True: next-token loss -(1/T) sum_t log p(x_{t+1} | x_<=t) instead. Returns L, and the hits and count of
    the read positions (argmax p = x_i): the masked-token accuracy that Amos et al. monitor."""

    def __init__(self, model, mask_id, causal=False):
        super().__init__()
        self.model, self.mask_id, self.causal = model, mask_id, causal

    def forward(self, tokens, pad_mask, hide):
        if tokens.dim() == 3:                                       # two documents each
            tokens, hide, pad_mask = (None if t is None else t.flatten(0, 1) for t in (tokens, hide, pad_mask))
        if self.causal:
            logits = self.model.reconstruct(tokens, pad_mask, causal=True)[:, :-1]
            targets = tokens[:, 1:] if pad_mask is None else tokens[:, 1:].masked_fill(pad_mask[:, 1:], -100)
        else:
            logits = self.model.reconstruct(tokens.masked_fill(hide, self.mask_id), pad_mask)
            targets = tokens.masked_fill(~hide, -100)               # read only the hidden ones
        read = targets != -100
        hits = (logits.detach().argmax(-1) == targets)[read].sum()
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100), hits, read.sum()


class Classification(torch.nn.Module):
    """Supervised objective: cross-entropy of the pooled classifier's logits."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, tokens, pad_mask, labels):
        logits = self.model.classify(tokens, pad_mask)
        return F.cross_entropy(logits.float(), labels), logits


def draw_hidden(shape, ratio, generator):
    """i.i.d. Bernoulli(ratio) candidate positions to hide."""
    return torch.rand(shape, generator=generator) < ratio


def only_real(hide, pad_mask):
    """Never hide padding; hide at least one position per batch."""
    hide = hide if pad_mask is None else hide & ~pad_mask.cpu()
    if not hide.any():
        hide.view(-1)[0] = True
    return hide


# -----------------------------------------------------------------------------
# Building the model, hybrid initialisation and freezing

def build_model(cfg, datasets):
    """One model for every dataset it will see (the pretraining task may differ)."""
    ds = datasets[0]
    conf = TransformerConfig(
        vocab_size=max(d.vocab_size for d in datasets), max_len=max(d.max_len for d in datasets), n_layer=cfg["depth"],
        n_classes=ds.n_classes, pair=ds[0][0].dim() == 2, mask_id=ds.mask_id,
        **{k: cfg[k] for k in ("n_head", "n_embd", "ffn_mult", "dropout", "pos_enc", "pool", "init", "pixel_encoder")})
    torch.manual_seed(cfg["seed"])
    return Transformer(conf)


def hybrid_init(model, ckpt_path, which):
    """Copy only the parameter group `which` from an SPT checkpoint; the rest keep their random init (claim 5)."""
    load_weights(model, ckpt_path, names := select_params(model, which))
    return names


def freeze(model, which):
    """requires_grad=False for a group: it stays bit-identical at its start (from scratch: the random init, claim 4)."""
    names = [] if which == "none" else select_params(model, which)
    [p.requires_grad_(False) for name, p in model.named_parameters() if name in names]
    return names


# -----------------------------------------------------------------------------
# One training phase (SPT or finetuning)

def lr_at(step, peak, total, warmup, schedule):
    """A linear warmup to the peak, then constant, or a cosine or linear decay to 0.1 x peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    if schedule == "constant" or total <= warmup:
        return peak
    progress = min(1.0, (step - warmup) / (total - warmup))
    decay = 0.5 * (1.0 + math.cos(math.pi * progress)) if schedule == "cosine" else 1.0 - progress
    return peak * (0.1 + 0.9 * decay)


def epoch_batches(n, cfg, rt, epoch, spt):
    """This rank's micro-batches (lists of indices) of one epoch, in an order set by (seed, epoch, phase): a resumed
    run sees the same batches. Optimizer step s takes perm[s*G:(s+1)*G], G = batch_size * grad_accum * world_size,
    split into equal micro-batches across ranks and accumulation steps: W processes equal one with W times the batch."""
    G = cfg["batch_size"] * cfg["grad_accum"] * rt.world_size
    seed = cfg["seed"] * BATCH_SEED_STRIDE + 2 * epoch + int(spt)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    return [perm[s * G:(s + 1) * G][micro_row(k, cfg, rt):][:cfg["batch_size"]]
            for s in range(n // G) for k in range(cfg["grad_accum"])]


def micro_row(k, cfg, rt):
    """The first row of this rank's micro-batch k in its step's batch: its examples, its mask rows."""
    return (k * rt.world_size + rt.rank) * cfg["batch_size"]


def train_phase(name, model, train_ds, val_ds, run):
    """Train `model` in place. name='spt': masked reconstruction, best = lowest val loss (Amos et al. keep the highest
    masked-token accuracy; REPORT's departures say why not here). name='finetune': classification, best = highest val
    accuracy. Returns the phase's state: epoch, step, best_metric, best_epoch; its best weights are in
    <out_dir>/<name>_best.pt, written before every rank returns."""
    cfg, rt, accum, spt = run.cfg, run.rt, run.cfg["grad_accum"], name == "spt"
    epochs, peak, schedule, warmup = (cfg["pretrain_epochs"], cfg["pretrain_lr"] or cfg["lr"], cfg["pretrain_schedule"]
                                      or cfg["schedule"], cfg["pretrain_warmup_steps"]) if spt else \
        (cfg["epochs"], cfg["lr"], cfg["schedule"], cfg["warmup_steps"])
    G = cfg["batch_size"] * accum * rt.world_size                        # examples per optimizer step
    steps_per_epoch = len(train_ds) // G
    total = epochs * steps_per_epoch
    warmup = warmup or int(cfg["warmup_frac"] * total)
    (unused_head := model.head if spt else model.lm_head).requires_grad_(False)   # the head this phase does not use
    objective = MaskedReconstruction(model, train_ds.mask_id, cfg["spt_objective"] == "causal") if spt \
        else Classification(model)
    train_obj = wrap(objective, rt, cfg["compile"])                      # DDP, torch.compile
    optimizer = model.configure_optimizers(cfg["weight_decay"], peak, device_type=rt.device_type)
    mask_gen = torch.Generator().manual_seed(cfg["seed"] + MASK_SEED_OFFSET)   # the SPT masks' stream
    state = dict(epoch=0, step_in_epoch=0, step=0, best_metric=None, best_epoch=-1, bad_epochs=0)
    guard = NonFiniteGuard(rt, name, run.ckpt_path)

    def save_resume():                       # ckpt.pt: weights, optimizer, masks' stream, RNG, counters
        guard.check()
        run.save_resume(model, [optimizer], phase=name, mask_gen=mask_gen.get_state(), **state)
    rng = run.ckpt["rng"] if run.ckpt and run.ckpt["phase"] == name else None    # --init_from=resume
    if rng is not None:
        run.restore(model, [optimizer], rng=False)
        state.update({k: run.ckpt[k] for k in state})
        mask_gen.set_state(run.ckpt["mask_gen"])
    params = [p for p in model.parameters() if p.requires_grad]
    say(rt, f"[{name}] {len(train_ds)} train / {len(val_ds)} val examples, {epochs} epochs x {steps_per_epoch} "
            f"steps, lr {peak:g}, {sum(p.numel() for p in params):,} trainable parameters")
    run.saver, t0 = save_resume, time.time()                             # a stop signal saves ckpt.pt first
    while state["epoch"] < epochs:
        batches = epoch_batches(len(train_ds), cfg, rt, state["epoch"], spt)[state["step_in_epoch"] * accum:]
        bar = tqdm(total=steps_per_epoch, initial=state["step_in_epoch"], disable=not rt.master, leave=False,
                   desc=f"{os.path.basename(cfg['out_dir'])} {name} epoch {state['epoch'] + 1}/{epochs}")
        # a DataLoader draws its seed from the torch RNG when its iterator is made: a resumed run
        # rewinds the RNG before that at an epoch's start, after it mid-epoch
        if rng is not None and state["step_in_epoch"] == 0:
            torch.set_rng_state(rng)
        data = iter(rt.loader(train_ds, batches, cfg["num_workers"]))
        if rng is not None and state["step_in_epoch"] > 0:
            torch.set_rng_state(rng)
        rng = None
        for micro, batch in enumerate(data):
            tokens, pad_mask, labels = (None if t is None else t.to(rt.device) for t in batch)
            k = micro % accum                                            # micro-batch k of this step
            with grad_sync(train_obj, rt, last_micro=k == accum - 1), rt.autocast():
                if spt:  # hide a random mask_ratio of the real tokens, to reconstruct. The mask is drawn once for
                    # the whole global batch, then this micro-batch takes its rows: the same for any GPUs, micro-batches
                    if k == 0:
                        step_hide = draw_hidden((G, *tokens.shape[1:-1], train_ds.max_len), cfg["mask_ratio"], mask_gen)
                    start = micro_row(k, cfg, rt)
                    hide = only_real(step_hide[start:start + len(tokens), ..., :tokens.size(-1)], pad_mask)
                loss = train_obj(tokens, pad_mask, hide.to(rt.device) if spt else labels)[0]   # SPT, or classify
            (loss / accum).backward()
            if k < accum - 1:
                continue
            for group in optimizer.param_groups:                         # warmup, then the schedule
                group["lr"] = lr_at(state["step"], peak, total, warmup, schedule)
            gnorm = torch.nn.utils.clip_grad_norm_(params, cfg["grad_clip"] or float("inf"))
            guard.record(loss, gnorm, state["step"] + 1)                 # on a CPU: stops before the update
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            state.update(step=state["step"] + 1, step_in_epoch=state["step_in_epoch"] + 1)
            step = state["step"]
            bar.update(1)
            if step % cfg["log_every"] == 0 or step == 1:
                guard.check()                                            # on a GPU: here
                run.log(phase=name, step=step, epoch=state["epoch"], loss=loss.item(),
                        lr=optimizer.param_groups[0]["lr"], grad_norm=gnorm.item())
                bar.set_postfix(loss=f"{loss.item():.4f}")
            if step == 20:
                say(rt, f"[{name}] ~{(time.time() - t0) / 20 * (total - 20) / 60:.1f} min for this phase at the "
                        f"speed of its first 20 steps")
            if cfg["snapshot_attn_every"] and step % cfg["snapshot_attn_every"] == 0 and rt.master:
                run.log("snapshots.jsonl", phase=name, step=step, **analysis.attention_snapshot(model, val_ds,
                                                                                               rt.device))
            if cfg["ckpt_every"] and step % cfg["ckpt_every"] == 0:
                save_resume()
            run.tick()                                # a stop signal or --halt_after_steps stops here
        bar.close()                                 # the epoch's end: evaluate, keep the best weights, save ckpt.pt
        guard.check()
        metrics = evaluate(objective, val_ds, cfg, rt, name)
        if not math.isfinite(metrics["loss"]):                           # a NaN val loss is never "best"
            guard.at.fill_(state["step"])
            guard.check()
        metric, best = metrics["loss"] if spt else metrics["acc"], state["best_metric"]
        improved = best is None or (metric < best if spt else metric > best)
        epoch = state["epoch"] + 1
        state.update(epoch=epoch, step_in_epoch=0, bad_epochs=0 if improved else state["bad_epochs"] + 1)
        run.log(phase=name, step=state["step"], epoch=epoch, val_loss=metrics["loss"], val_acc=metrics["acc"],
                **({} if spt else {"val_loss_se": metrics["loss_se"]}))
        if improved:
            state.update(best_metric=metric, best_epoch=epoch)
            run.save_weights(os.path.join(cfg["out_dir"], f"{name}_best.pt"), model, epoch=epoch, **metrics)
        if spt and epoch in {int(e) for e in cfg["save_epochs"].split(",") if e.strip()}:
            run.save_weights(os.path.join(cfg["out_dir"], f"spt_epoch{epoch}.pt"), model, epoch=epoch)
        say(rt, f"[{name}] epoch {epoch}/{epochs}: val loss {metrics['loss']:.4f}"
                + ("" if spt else f", val acc {metrics['acc']:.4f}") + (" (best)" if improved else ""))
        save_resume()
        if (not spt and cfg["patience"] and state["bad_epochs"] >= cfg["patience"]) or \
                time.time() - t0 > cfg["max_hours"] * 3600:            # early stopping; the wall-time cap
            break
    run.saver = None
    unused_head.requires_grad_(True)                                     # the other phase's head
    if rt.ddp:
        dist.barrier()                                                   # rank 0 has written <name>_best.pt
    return state


@torch.no_grad()
def evaluate(objective, ds, cfg, rt, phase):
    """Mean loss and accuracy (SPT: of the masked tokens), and for the classifier the standard error of the mean
    loss (sd of the per-example losses / sqrt(n)). SPT's masks come from a fixed generator: its epochs compare."""
    objective.eval()
    idx = list(range(rt.rank, len(ds), rt.world_size))
    batches = [idx[i:i + cfg["batch_size"]] for i in range(0, len(idx), cfg["batch_size"])]
    gen = torch.Generator().manual_seed(VAL_MASK_SEED)
    totals = torch.zeros(5, dtype=torch.float64, device=rt.device)   # loss sum, examples, squares, hits, read
    for batch in tqdm(rt.loader(ds, batches, cfg["num_workers"]), leave=False, disable=not rt.master,
                      desc=f"{os.path.basename(cfg['out_dir'])} eval {phase}"):
        tokens, pad_mask, labels = (None if t is None else t.to(rt.device) for t in batch)
        with rt.autocast():
            if phase == "spt":
                hide = only_real(draw_hidden(tokens.shape, cfg["mask_ratio"], gen), pad_mask).to(rt.device)
                (loss, hits, read), squares = objective(tokens, pad_mask, hide), 0.0
            else:
                loss, logits = objective(tokens, pad_mask, labels)
                hits, read = (logits.argmax(-1) == labels).sum(), len(labels)
                squares = (F.cross_entropy(logits.float(), labels, reduction="none") ** 2).sum()
        totals += totals.new_tensor([loss.item() * len(labels), len(labels), float(squares), float(hits), float(read)])
    if rt.ddp:
        dist.all_reduce(totals)
    objective.train()
    loss_sum, n, squares, hits, read = totals.tolist()
    se = math.sqrt(max(squares / n - (loss_sum / n) ** 2, 0.0) / n) if phase != "spt" else None
    return {"loss": loss_sum / n, "acc": hits / read, "loss_se": se}


# -----------------------------------------------------------------------------
# The flags and the data, checked before anything is written

def get_config(argv):
    """DEFAULTS, then config/<task>.py, config/<task>_<preset>.py and the flags, checked: a bad
    value is one line naming what is allowed, before any work is done."""
    first = configure(DEFAULTS, argv, __doc__, __file__)                  # which task and preset
    task = first["task"]
    if task not in TASKS:
        raise ValueError(f"--task={task} is not one of {', '.join(TASKS)}")
    files = [f"config/{task}.py"] + ([f"config/{task}_{first['preset']}.py"] if first["preset"] else [])
    if not os.path.exists(os.path.join(HERE, files[-1])):
        raise ValueError(f"--preset={first['preset']}: there is no {files[-1]}; the presets are "
                         + ", ".join(sorted(f[:-3] for f in os.listdir(os.path.join(HERE, "config")) if "_" in f)))
    base = configure(DEFAULTS, [], files=[os.path.join(HERE, f) for f in files])
    cfg = dict(configure(base, argv), config_files=", ".join(files))
    groups = tuple(PARAM_GROUPS) + ("all",)
    check(cfg, positive=("depth", "n_embd", "n_head", "ffn_mult", "lr", "batch_size", "grad_accum", "log_every",
                         "max_hours"), fractions=("dropout", "warmup_frac", "mask_ratio"),
          choices=dict(pretrain_task=("",) + TASKS, spt_objective=("masked", "causal"), dtype=("auto", "fast",
                       "float32", "bfloat16", "float16"), data_source=("auto", "generated", "release"),
                       schedule=("constant", "cosine", "linear"), pretrain_schedule=("", "constant", "cosine", "linear")))
    for key in ("freeze", "init_params"):
        if any(g.strip() not in groups + ("none",) for g in cfg[key].split(",")):
            raise ValueError(f"--{key}={cfg[key]}: choose from {', '.join(groups)}, a comma list of them, or none")
    TransformerConfig(n_layer=cfg["depth"], n_head=cfg["n_head"], n_embd=cfg["n_embd"], ffn_mult=cfg["ffn_mult"],
                      pos_enc=cfg["pos_enc"], pool=cfg["pool"], init=cfg["init"], pixel_encoder=cfg["pixel_encoder"])
    for wrong, why in [
            (task == "photos", "--task=photos has no labels; use it as --pretrain_task=photos with --task=pathfinder"),
            (cfg["pixel_encoder"] == "linear" and task not in IMAGE_TASKS,
             f"--pixel_encoder=linear reads grey levels, of {', '.join(IMAGE_TASKS)}; use token here"),
            (cfg["epochs"] == 0 and (cfg["pretrain_epochs"] == 0 or cfg["init_from"] not in ("", "resume")),
             "--epochs=0 runs the SPT phase alone: it needs --pretrain_epochs > 0 and no --init_from"),
            ("all" in cfg["freeze"].split(","), "--freeze=all leaves nothing to train; freeze attn, qk, qkv, mlp or emb")]:
        if wrong:
            raise ValueError(why)
    if cfg["init_from"] not in ("", "resume"):
        theirs = load_checkpoint(cfg["init_from"]).get("config", {})      # one line if missing or damaged
        if any(theirs.get(k) != cfg[k] for k in ("depth", "n_embd", "n_head", "ffn_mult")):
            raise ValueError(f"--init_from={cfg['init_from']} is a model of another shape; give the same model flags")
    return cfg


def auto_out_dir(cfg):
    """--out_dir="": out/<task>_d<depth>_<pretrain_epochs>ep, then each flag that differs from
    DEFAULTS and the config files, so two different runs never share a folder."""
    base = configure(DEFAULTS, [], files=[os.path.join(HERE, f) for f in cfg["config_files"].split(", ")])
    return default_out_dir(f"{cfg['task']}_d{cfg['depth']}_{cfg['pretrain_epochs']}ep", cfg, base,
                           skip=("task", "depth", "pretrain_epochs", *FREE))


class Subset(torch.utils.data.Subset):
    """The first n examples of a dataset, keeping its attributes (vocab_size, collate, ...)."""

    def __getattr__(self, name):
        return getattr(self.dataset, name)


def load_data(task, split, cfg):
    """One split of `task`: synthetic.py's, made in memory, or data_lra.py's (generated once and
    cached, or read from the release files); the first --n_train (train) or --n_eval examples."""
    if task == "synthetic":
        ds = synthetic.load_split(split, seed=cfg["seed"])
    else:
        import data_lra   # here: the synthetic task needs nothing else
        options = dict(n=cfg["n_generate"] or None, data_source=cfg["data_source"], difficulty=cfg["difficulty"],
                       max_len=cfg["max_len"] or None)                   # what this task takes of them:
        ds = data_lra.load_task(task, split, cfg["data_dir"], **{k: v for k, v in options.items() if v is not None
                                                                 and k in data_lra.TASK_OPTIONS[task][1]})
    n = cfg["n_train"] if split == "train" else cfg["n_eval"]
    return Subset(ds, range(n)) if 0 < n < len(ds) else ds


def load_splits(cfg, rt):
    """{train, val, test, pretrain, pretrain_val}: the task's splits and the pretraining task's,
    checked: none is empty, a training split holds a global batch, the vocabularies agree."""
    task, pre = cfg["task"], cfg["pretrain_task"] or cfg["task"]
    data = {s: load_data(task, s, cfg) for s in ("train", "val", "test")}
    data.update(pretrain=load_data(pre, "train", cfg), pretrain_val=load_data(pre, "val", cfg)) if pre != task else \
        data.update(pretrain=data["train"], pretrain_val=data["val"])
    if (data["pretrain"].vocab_size, data["pretrain"].mask_id) != (data["train"].vocab_size, data["train"].mask_id):
        raise ValueError(f"--pretrain_task={pre} has another vocabulary than --task={task}; pretrain on an image task")
    G = cfg["batch_size"] * cfg["grad_accum"] * rt.world_size
    for name, ds in data.items():
        if len(ds) < (need := G if name in ("train", "pretrain") else 1):
            raise ValueError(f"the {name} split of --task={task} has {len(ds)} examples, fewer than {need}; check "
                             f"--n_train, --n_eval, --batch_size")
    return data


def announce_cost(cfg, rt):
    """An image task's run says first, before any data is made or read, what it costs here: a step
    of a model of its size on random images (timed after a warm-up, the best of 2, so a busy machine
    inflates it little) times its steps. Then it goes on."""
    if cfg["task"] not in ("image", "pathfinder", "pathx") or not rt.master:
        return
    side, n = (128 if cfg["task"] == "pathx" else 32), cfg["n_generate"] or 200_000
    n_train = cfg["n_train"] or (45_000 if cfg["task"] == "image" else int(0.8 * n))   # their 80/10/10 split
    conf = TransformerConfig(vocab_size=258, n_classes=2, max_len=side * side, mask_id=257, n_layer=cfg["depth"],
                             **{k: cfg[k] for k in ("n_head", "n_embd", "ffn_mult", "pixel_encoder")})
    with torch.random.fork_rng(devices=[]):
        model, x = Transformer(conf).to(rt.device), torch.randint(0, 256, (2, side * side), device=rt.device)
        step_s = step_seconds(model, lambda: model.classify(x).float().logsumexp(-1).mean(), rt, rt.ptdtype)
    hours = step_s / 2 * (cfg["pretrain_epochs"] + cfg["epochs"]) * n_train / 3600
    if hours > 0.2:
        say(rt, f"This run takes about {hours:,.1f} h ({hours / 24:.1f} days) here: {step_s / 2 * cfg['batch_size']:.2f} s "
                f"a step, measured now after a warm-up, and {(cfg['pretrain_epochs'] + cfg['epochs'])} epochs of "
                f"{n_train:,} images. Sooner: `python train_spt.py --task=synthetic` (minutes) or `--task=pathfinder "
                f"--preset=cpu_rescue` (hours). Going on; Ctrl-C stops it (images made so far are kept), and the "
                f"same command continues it (with --init_from=resume once it trains).")


# -----------------------------------------------------------------------------
# The run: SPT, then finetuning, then the test accuracy, the summary and the figures

def main(argv):
    cfg = get_config(argv)
    cfg["out_dir"] = cfg["out_dir"] or auto_out_dir(cfg)
    with Run(cfg, "train_spt.py", argv, FREE) as run:                  # the folder checked and locked
        cfg, rt = run.cfg, run.rt
        announce_cost(cfg, rt)                                        # a long run says so first
        data = load_splits(cfg, rt)
        cfg["data"] = {k: getattr(data[k], "source", "made in memory") for k in ("train", "pretrain")}
        model = build_model(cfg, [data["train"], data["pretrain"]]).to(rt.device)
        choose_fast_dtype(cfg, rt, model, lambda: model.classify(data["train"].collate([data["train"][0]])[0]).sum())
        # on resume, keep the records written before ckpt.pt; an epoch's val record only if ckpt.pt has it
        order = lambda r: (("spt", "finetune").index(r["phase"]), r["step"])
        at = order(run.ckpt) if run.ckpt else (0, 0)
        run.begin(keep=lambda r: order(r) < at or order(r) == at and r.get("epoch", 0) <= run.ckpt.get("epoch", 0))
        say(rt, f"device {rt.device} ({rt.ptdtype}), world size {rt.world_size}; task {cfg['task']}: "
                f"{len(data['train'])}/{len(data['val'])}/{len(data['test'])} train/val/test ({cfg['data']['train']}); "
                f"{cfg['config_files']}; pretraining on {cfg['pretrain_task'] or cfg['task']}; "
                f"{model.num_params():,} parameters; out_dir {cfg['out_dir']}")
        seen = analysis.Observations(cfg["out_dir"], cfg["task"] in IMAGE_TASKS, rt.master)
        seen.observe("init", model, data["val"], rt.device)
        # phase 1: SPT (unless finetuning from a given checkpoint, or resuming into phase 2)
        given, spt_steps = cfg["init_from"] not in ("", "resume"), 0
        pretrain = cfg["pretrain_epochs"] > 0 and not given
        spt_ckpt = cfg["init_from"] if given else os.path.join(cfg["out_dir"], "spt_best.pt") if pretrain else None
        if pretrain and not (run.ckpt and run.ckpt["phase"] == "finetune"):
            spt_steps = train_phase("spt", model, data["pretrain"], data["pretrain_val"], run)["step"]
        best = load_checkpoint(spt_ckpt) if pretrain else {}          # the best SPT weights: their epoch, val loss
        results = dict(pretrain_epochs=cfg["pretrain_epochs"] if pretrain else 0, spt_best_epoch=best.get("epoch"),
                       spt_best_val_loss=best.get("loss"), spt_best_val_masked_acc=best.get("acc"))
        if cfg["epochs"] == 0:                  # SPT alone: its checkpoints are what other runs finetune from
            load_weights(model, spt_ckpt)
            seen.observe("spt", model, data["val"], rt.device)
            results.update(steps=0, spt_steps=spt_steps)
        else:                                   # phase 2: finetuning, a fresh model holding (part of) the SPT weights
            model = build_model(cfg, [data["train"], data["pretrain"]]).to(rt.device)
            copied = hybrid_init(model, spt_ckpt, cfg["init_params"]) if spt_ckpt else []
            if spt_ckpt:                        # "start": the model finetuning starts from, after the copy
                seen.observe("start", model, data["val"], rt.device)
                say(rt, f"finetuning from {spt_ckpt}: copied {len(copied)} tensors ({cfg['init_params']})")
            frozen = freeze(model, cfg["freeze"])
            ft = train_phase("finetune", model, data["train"], data["val"], run)
            load_weights(model, os.path.join(cfg["out_dir"], "finetune_best.pt"))
            test = evaluate(Classification(model), data["test"], cfg, rt, "finetune")
            seen.observe("finetune", model, data["val"], rt.device)
            results.update(best_val_acc=ft["best_metric"], best_epoch=ft["best_epoch"], test_acc=test["acc"],
                           frozen=len(frozen), copied=len(copied), steps=ft["step"])
        # summary.json (the run's flags, results and the attention statistics at each stage), the figures (curves,
        # proximity, attention), and the run's last line
        keys = "task depth epochs init_from init_params freeze pos_enc pool init pixel_encoder".split()
        summary = dict({k: cfg[k] for k in keys}, pretrain_task=cfg["pretrain_task"] or cfg["task"], **results,
                       wall_time_s=run.elapsed(), n_params=model.num_params(), world_size=rt.world_size)
        if rt.ddp:                                  # DDP's promise, checked: every replica holds rank 0's weights
            summary["replica_max_diff"] = replica_max_diff(model, rt)
        if not rt.master:
            return summary
        summary.update(analysis.stage_statistics(seen.reports), proximity=seen.reports)
        run.write_summary(summary)
        seen.plot(data["val"][0][0])
        analysis.plot_curves(read_log(cfg["out_dir"]), os.path.join(cfg["out_dir"], "curves.png"))
        last = "finetune" if "test_acc" in summary else "spt"             # "spt": SPT alone (--epochs=0)
        done = ("best val acc {best_val_acc:.4f} (epoch {best_epoch}), test acc {test_acc:.4f}" if last == "finetune"
                else "SPT best val loss {spt_best_val_loss:.4f} (epoch {spt_best_epoch})").format(**summary)
        print(f"[{os.path.basename(cfg['out_dir'])}] {done}; attention mass within |i-j|<=2: init "
              f"{summary['mass_w2_init']:.3f}, final {summary['mass_w2_' + last]:.3f} (uniform "
              f"{summary['mass_w2_uniform']:.3f}); files in {cfg['out_dir']}")
        return summary


def say(rt, text):
    """A line on the master rank, never glued to a progress bar."""
    if rt.master:
        tqdm.write(text)


if __name__ == "__main__":
    run_cli(main)
