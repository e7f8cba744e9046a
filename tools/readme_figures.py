"""The README's two figures, drawn from the quick start's own run folders (README, "Quick
start"; run the two pairs first):

    python tools/readme_figures.py               # -> out/readme_figures/readme_spt.png, readme_flt.png
    python tools/readme_figures.py --out=assets  # refresh the README's own PNGs

Paper A (--spt, --scratch): val accuracy by epoch of both runs, with the SPT run's epochs
counted after its SPT; then the layer-0 attention of one val sequence, head-averaged,
after finetuning: with SPT first it sits near the diagonal, from scratch it stays flat.
Paper B (--lt, --flt): val loss by step against the unigram entropy (the loss of a model
that ignores context), and the residual norm of the last loop by step: LT's grows and
its loss stays at the unigram level, FLT's stays low and it learns.
"""

import json
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import analysis  # noqa: E402
from configurator import configure, run_cli  # noqa: E402
from train_spt import build_model, load_data  # noqa: E402
from training import load_weights, read_log  # noqa: E402

DEFAULTS = dict(spt="out/quick/spt", scratch="out/quick/scratch", lt="out/quick/LT_K12", flt="out/quick/FLT_K12",
                out="out/readme_figures")


def finished(d):
    """A run folder's config and summary; a clear error when the run has not finished."""
    if not os.path.exists(os.path.join(d, "summary.json")):
        raise FileNotFoundError(f"{d} holds no finished run (no summary.json): run the README's quick start first")
    return [json.load(open(os.path.join(d, name))) for name in ("config.json", "summary.json")]


def finetuned_attention(d):
    """Layer 0's attention on the first val sequence, head-averaged, after finetuning (T, T)."""
    cfg, _ = finished(d)
    val = load_data(cfg["task"], "val", cfg)
    model = build_model(cfg, [val])
    load_weights(model, os.path.join(d, "finetune_best.pt"))
    maps, _ = analysis.attention_maps(model, val, "cpu", n=1)
    return maps[0][0].mean(0)


def pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save(plt, fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def spt_figure(spt, scratch, path):
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for d, name, c in ((spt, "SPT, then finetuning", "tab:red"), (scratch, "from scratch", "tab:blue")):
        cfg, s = finished(d)
        rec = [r for r in read_log(d) if r.get("phase") == "finetune" and "val_acc" in r]
        first = cfg["pretrain_epochs"] if cfg["pretrain_epochs"] and not cfg["init_from"] else 0
        axes[0].plot([first + r["epoch"] for r in rec], [r["val_acc"] for r in rec], "o-", color=c,
                     label=f"{name}: test {s['test_acc']:.3f}")
    axes[0].axhline(0.5, color="gray", lw=0.6, ls=":")
    axes[0].set_xlabel("epoch (the SPT run's SPT epochs first)"), axes[0].set_ylabel("val accuracy"), axes[0].legend(fontsize=8)
    axes[0].set_title("Paper A: SPT against from scratch, same labelled steps", fontsize=10)
    for ax, d, name in ((axes[1], spt, "after SPT and finetuning"), (axes[2], scratch, "finetuned from scratch")):
        a = finetuned_attention(d)
        ax.imshow(a.numpy(), cmap="viridis", vmin=0, vmax=float(a.max()))
        mass = finished(d)[1]["mass_w2_finetune"]
        ax.set_title(f"attention, {name}\nmass within |i-j|<=2: {mass:.2f}", fontsize=9)
        ax.set_xlabel("key position"), ax.set_ylabel("query position")
    save(plt, fig, path)


def flt_figure(lt, flt, path):
    plt = pyplot()
    fig, (ax_loss, ax_res) = plt.subplots(1, 2, figsize=(11, 3.6))
    for d, c in ((lt, "tab:red"), (flt, "tab:blue")):
        cfg, s = finished(d)
        log = read_log(d)
        val = [r for r in log if "val_loss" in r]
        steps = [r for r in log if "residual_norms" in r]
        label = f"{cfg['variant']}, {cfg['n_loops']} loops: {s['outcome']}"
        ax_loss.plot([r["step"] for r in val], [r["val_loss"] for r in val], "o-", color=c, label=label)
        ax_res.plot([r["step"] for r in steps], [r["residual_norms"][-1] for r in steps], color=c, label=label)
    ax_loss.axhline(s["unigram_entropy"], color="gray", lw=0.8, ls="--", label="unigram entropy (ignores context)")
    ax_loss.set_xlabel("step"), ax_loss.set_ylabel("val loss (nats/token)"), ax_loss.legend(fontsize=8)
    ax_loss.set_title("Paper B: the plain loop (LT) against FLT", fontsize=10)
    ax_res.set_yscale("log"), ax_res.set_xlabel("step"), ax_res.set_ylabel("residual norm, last loop")
    ax_res.set_title("the residual stream after the last loop", fontsize=10), ax_res.legend(fontsize=8)
    save(plt, fig, path)


def main(argv):
    cfg = configure(DEFAULTS, argv, __doc__, __file__)
    for key in ("spt", "scratch", "lt", "flt"):
        finished(cfg[key])                                  # every folder checked before drawing anything
    os.makedirs(cfg["out"], exist_ok=True)
    with torch.no_grad():
        spt_figure(cfg["spt"], cfg["scratch"], os.path.join(cfg["out"], "readme_spt.png"))
    flt_figure(cfg["lt"], cfg["flt"], os.path.join(cfg["out"], "readme_flt.png"))
    print(f"{os.path.join(cfg['out'], 'readme_spt.png')}, {os.path.join(cfg['out'], 'readme_flt.png')}")


if __name__ == "__main__":
    run_cli(main)
