"""
How local is attention before any training? Layer-0 attention of freshly built
model.py Transformers under the three initialisations (torch: PyTorch's layer
defaults; gpt2: N(0, 0.02); amos: PyTorch's with W_Q = W_K = W_V = W_O, Amos et
al.'s code), on the synthetic task's random walks (and i.i.d. tokens, the control
with no local structure) and on PathFinder images (baseline difficulty, 32 x 32).

Each cell is mean ± std over seeds (one model per seed, same inputs) of
  self   attention mass on the query itself       / uniform's (1.0 = not local)
  near   mass within |i - j| <= 2 on the sequence  / uniform's
  3x3    mass within the 3 x 3 grid neighbourhood  / uniform's (images)
  std    the spread of the scores within a row (0 = uniform attention)
Deeper layers leave layer 0 unchanged, so one layer of each width is built.

    OMP_NUM_THREADS=1 python tools/attention_at_init.py [--seeds=3] [--n=8]   # about 2 min
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import analysis  # noqa: E402  (the repository root, added just above)
import pathfinder  # noqa: E402
import synthetic  # noqa: E402
from model import INITS, TransformerConfig  # noqa: E402
from configurator import configure, run_cli  # noqa: E402

STATS = ("self", "near", "grid", "score_std")


def inputs(n):
    """(name, tokens, vocab_size, image side) of each input the table reads."""
    walks = synthetic.load_split("val", n=n, seed=0)
    iid = torch.randint(0, walks.n_values, walks.tokens.shape, generator=torch.Generator().manual_seed(0))
    images, _, _ = pathfinder.generate(n, seed=0, contour_length=6)
    pixels = torch.as_tensor(images.reshape(n, -1), dtype=torch.long)
    return [("synthetic walks", walks.tokens, walks.vocab_size, None),
            ("synthetic i.i.d. tokens", iid, walks.vocab_size, None),
            ("PathFinder baseline", pixels, 258, 32)]


def models(name):
    """(label, TransformerConfig keyword arguments) of the models read on this input."""
    if name.startswith("synthetic"):
        return [("d=64, 4 heads (synthetic recipe)", dict(n_embd=64, n_head=4))]
    return [(f"d={d}, {h} heads ({who}), {enc} pixels", dict(n_embd=d, n_head=h, ffn_mult=1, pixel_encoder=enc))
            for d, h, who in ((64, 4, "--preset=cpu"), (128, 8, "Amos et al.")) for enc in ("token", "linear")]


def table(seeds, n):
    def cell(values):
        t = torch.tensor(values, dtype=torch.float64)
        return f"{t.mean():.2f} ± {t.std():.2f}" if len(values) > 1 else f"{t.mean():.2f}"
    rows = []
    for name, tokens, vocab, side in inputs(n):
        for label, kwargs in models(name):
            for init in INITS:
                config = TransformerConfig(vocab_size=vocab, max_len=tokens.size(1), n_layer=1, init=init, **kwargs)
                stats = analysis.attention_at_init(config, tokens, seeds=seeds, image_side=side)
                rows.append(f"| {name} | {label} | {init} | "
                            + " | ".join(cell(stats[k]) if k in stats else "-" for k in STATS) + " |")
    head = "| input | model (layer 0) | init | self / uniform | abs(i-j)<=2 / uniform | 3x3 / uniform | score std |"
    return "\n".join([head, "|---" * 7 + "|"] + rows)


def main(argv=None):
    cfg = configure({"seeds": 3, "n": 8}, argv, __doc__)
    if cfg["seeds"] < 1 or cfg["n"] < 2:
        raise ValueError("need --seeds >= 1 and --n >= 2 (sequences / images per input)")
    print(f"layer-0 attention at init, mean ± std over {cfg['seeds']} seeds, {cfg['n']} sequences / images each")
    out = table(range(cfg["seeds"]), cfg["n"])
    print(out)
    return out


if __name__ == "__main__":
    run_cli(main)
