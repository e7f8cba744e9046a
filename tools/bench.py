"""
Benchmarks: is this code as fast as what one would write with torch.nn, and which speed
options pay on a CPU? Prints a markdown table per section and writes every number into
bench.json.

  python tools/bench.py                              # the CPU sections, ~6 min on 2 CPU cores
  python tools/bench.py --quick                      # reduced sizes, under 1 minute
  python tools/bench.py --only=cuda --compile=True   # on a GPU: tokens/s and MFU, bf16

Sections (--only, comma list):
  throughput  training step (forward + backward + AdamW) of model.py's Transformer
              against torch.nn.TransformerEncoder of the same shape: tokens/s
  cuda        on a GPU: tokens/s and model FLOPs utilisation (MFU) with bf16
              autocast (and torch.compile), ours and the reference
  cpu         the CPU preset's PathFinder training step (T=1024, 1 and 4 layers): time
              per image of each speed option (2 threads, bf16 autocast, torch.compile,
              batch 16 / 64) as a ratio to the plain step (fp32, 1 thread, batch 32)

How it measures. Machines are shared and noisy, so no number here is compared
with a number from another run. Every comparison is made inside one run, with the
contenders interleaved: A B B A A B B A ... (the order flips each repetition so a
slow drift hurts both alike), after one untimed warm-up of each. A time is the
median over repetitions; a ratio is the median over repetitions of the ratio of
the two times measured side by side. No test asserts any of these timings.
"""

import json
import os
import statistics
import sys
import time
from contextlib import nullcontext

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import configurator  # noqa: E402
from model import Transformer, TransformerConfig, sinusoidal_table  # noqa: E402

DEFAULTS = dict(only="throughput,cuda,cpu",
                quick=False,       # reduced sizes (labelled as such in the tables), < 2 min on 2 cores
                out="bench.json",
                reps=0,            # timed repetitions per measurement; 0 = the section's default
                device="auto",     # the cuda section runs only when this resolves to cuda
                compile=True,      # cuda section: torch.compile both models
                peak_flops=0.0,    # cuda section: the device's bf16 dense peak; 0 = look it up by name
                threads=1)         # torch threads on CPU; 0 = one per core. One: on a shared machine two
                                   # spin-waiting OpenMP threads made steps 3-10x slower (the 2-core dev box)

# The paper's LRA configurations (model.py names).
PATHFINDER = dict(n_layer=4, n_embd=128, n_head=8, ffn_mult=1)          # T = 1024
TEXT = dict(n_layer=6, n_embd=512, n_head=8, ffn_mult=4)                # T = 4096, vocab 258
MID = dict(n_layer=2, n_embd=256, n_head=8, ffn_mult=4)                 # the sequence-length sweep
CPU_PRESET = dict(n_embd=64, n_head=4, ffn_mult=1)                      # train_spt.py --preset=cpu, T = 1024


# -----------------------------------------------------------------------------
# Timing: interleaved repetitions, medians

def interleaved(fns, reps, warmup=1, dev="cpu"):
    """Time the zero-argument functions in `fns` (name -> fn) round-robin, the order
    reversed every other repetition (A B, B A, A B, ...). -> name -> list of seconds."""
    sync = torch.cuda.synchronize if str(dev).startswith("cuda") else lambda: None
    for fn in list(fns.values()) * warmup:
        fn()
    times = {name: [] for name in fns}
    for r in range(reps):
        for name in (list(fns) if r % 2 == 0 else list(reversed(list(fns)))):
            sync()
            t0 = time.perf_counter()
            fns[name]()
            sync()
            times[name].append(time.perf_counter() - t0)
    return times


def paired_ratio(num, den):
    """Median over repetitions of num[r] / den[r] (two lists of times measured side by side)."""
    return statistics.median(a / b for a, b in zip(num, den))


# -----------------------------------------------------------------------------
# The reference: what a user would write with torch.nn.TransformerEncoder

class ReferenceEncoder(nn.Module):
    """nn.Embedding + sinusoidal positions + nn.TransformerEncoder (pre-norm, GELU,
    dropout 0, batch first) + final LayerNorm + mean pool + linear head: the same
    function class and sizes as model.py's Transformer with pool='mean'."""

    def __init__(self, c):
        super().__init__()
        self.tok_emb = nn.Embedding(c.vocab_size, c.n_embd)
        self.register_buffer("pe", sinusoidal_table(c.max_len, c.n_embd), persistent=False)
        layer = nn.TransformerEncoderLayer(c.n_embd, c.n_head, dim_feedforward=c.ffn_mult * c.n_embd,
                                           dropout=0.0, activation="gelu", batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, c.n_layer, enable_nested_tensor=False)
        self.ln_f = nn.LayerNorm(c.n_embd)
        self.head = nn.Linear(c.n_embd, c.n_classes)

    def classify(self, idx):
        x = self.tok_emb(idx) + self.pe[:idx.size(1)]
        return self.head(self.ln_f(self.encoder(x)).mean(1))

    def configure_optimizers(self, weight_decay, learning_rate, betas=(0.9, 0.999), device_type="cpu"):
        """The same AdamW as Transformer.configure_optimizers: decay on linear matrices only."""
        decay = {n: p.dim() >= 2 and "emb" not in n for n, p in self.named_parameters()}
        groups = [{"params": [p for n, p in self.named_parameters() if decay[n] == d], "weight_decay": w}
                  for d, w in ((True, weight_decay), (False, 0.0))]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=(device_type == "cuda"))


def make_step(model, B, T, dev="cpu", autocast=nullcontext, compile_model=False, seed=0):
    """One training step (forward, cross-entropy, backward, AdamW step) as a zero-argument
    function, on a fixed random batch of token ids (all real: no padding)."""
    c = model.config
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, c.vocab_size, (B, T), generator=g).to(dev)
    labels = torch.randint(0, c.n_classes, (B,), generator=g).to(dev)
    opt = model.configure_optimizers(0.1, 1e-4, device_type=str(dev).split(":")[0])
    classify = torch.compile(model.classify) if compile_model else model.classify

    def step():
        with autocast():
            loss = F.cross_entropy(classify(idx).float(), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def build_pair(dims, T, vocab_size=258, dev="cpu", seed=0):
    """Our Transformer and the reference, same sizes, both in train mode."""
    cfg = TransformerConfig(vocab_size=vocab_size, n_classes=2, max_len=T, dropout=0.0, **dims)
    torch.manual_seed(seed)
    ours, ref = Transformer(cfg).to(dev).train(), ReferenceEncoder(cfg).to(dev).train()
    ref.config = cfg
    return ours, ref


def throughput_row(name, dims, T, B, reps, dev="cpu", autocast=nullcontext, compile_model=False):
    """Interleaved training steps of ours and the reference -> a result row (dict)."""
    ours, ref = build_pair(dims, T, dev=dev)
    steps = {"ours": make_step(ours, B, T, dev, autocast, compile_model),
             "ref": make_step(ref, B, T, dev, autocast, compile_model)}
    times = interleaved(steps, reps, warmup=2 if compile_model else 1, dev=dev)
    return dict(config=name, T=T, B=B, **dims, reps=reps,
                ours_tok_s=B * T / statistics.median(times["ours"]), ref_tok_s=B * T / statistics.median(times["ref"]),
                ratio=paired_ratio(times["ref"], times["ours"]),      # > 1: we are faster
                ours_s=times["ours"], ref_s=times["ref"]), ours


# -----------------------------------------------------------------------------
# Tables

def markdown_table(rows, columns):
    """rows: list of dicts; columns: list of (key, header, format spec). Missing -> '-'."""
    cell = lambda v, fmt: "-" if v is None else format(v, fmt) if fmt else str(v)
    return "\n".join(["| " + " | ".join(h for _, h, _ in columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
                     + ["| " + " | ".join(cell(r.get(k), fmt) for k, _, fmt in columns) + " |" for r in rows])


# -----------------------------------------------------------------------------
# 1. Training throughput against nn.TransformerEncoder

def bench_throughput(cfg, dev):
    if cfg["quick"]:
        rows = [("T=256 (mid)", MID, 256, 4, 7), ("T=512 (mid)", MID, 512, 2, 7), ("T=1024 (mid)", MID, 1024, 1, 7),
                ("PathFinder", PATHFINDER, 1024, 1, 7),
                ("Text REDUCED (2 layers, T=1024)", {**TEXT, "n_layer": 2}, 1024, 1, 5)]
    else:
        rows = [("T=1024 (mid)", MID, 1024, 2, 7), ("T=2048 (mid)", MID, 2048, 1, 7), ("T=4096 (mid)", MID, 4096, 1, 7),
                ("PathFinder", PATHFINDER, 1024, 4, 7), ("Text", TEXT, 4096, 1, 5)]
    print(f"\n## Training throughput, ours vs torch.nn.TransformerEncoder ({dev}, fp32, "
          f"interleaved reps, medians)\nmid = n_layer=2, n_embd=256, n_head=8, ffn_mult=4\n")
    results = []
    for name, dims, T, B, reps in rows:
        row, _ = throughput_row(name, dims, T, B, cfg["reps"] or reps, dev)
        results.append(row)
        print(f"  {name}: ours {row['ours_tok_s']:.0f} tok/s, ref {row['ref_tok_s']:.0f} tok/s, ratio {row['ratio']:.3f}",
              flush=True)
    print()
    print(markdown_table(results, [("config", "config", ""), ("n_layer", "L", "d"), ("n_embd", "d", "d"),
                                   ("ffn_mult", "ffn", "d"), ("T", "T", "d"), ("B", "B", "d"),
                                   ("ours_tok_s", "ours tok/s", ".0f"), ("ref_tok_s", "nn.TransformerEncoder tok/s", ".0f"),
                                   ("reps", "reps", "d"), ("ratio", "ratio (>=1: ours as fast)", ".3f")]))
    worst = min(results, key=lambda r: r["ratio"])
    print(f"\ngoal ratio >= 1.0 everywhere: {'met' if worst['ratio'] >= 1.0 else 'NOT met'} "
          f"(lowest {worst['ratio']:.3f} at {worst['config']}; ratio = median of ref time / our time, paired)")
    return dict(rows=results)


# -----------------------------------------------------------------------------
# 2. CUDA: tokens/s and model FLOPs utilisation with bf16 autocast and torch.compile

PEAK_BF16 = (("H100", 989e12), ("H200", 989e12), ("H800", 989e12), ("GH200", 989e12),
             ("A100", 312e12), ("A800", 312e12), ("L40S", 362e12), ("A10", 125e12), ("4090", 165e12))


def peak_bf16(name):
    """Dense bf16 tensor-core peak (FLOP/s) by device name, or None if unknown."""
    return next((flops for key, flops in PEAK_BF16 if key in name), None)


def flops_per_step(model, B, T):
    """nanoGPT's estimate (PaLM appendix B): 6 N per token for the weight matmuls,
    forward and backward, plus 12 L d T per token for attention (QK^T and AV).
    N counts the encoder's parameters that multiply: not the embeddings (lookups)
    and not the reconstruction head (unused by classify)."""
    c = model.config
    N = sum(p.numel() for n, p in model.named_parameters()
            if not n.startswith(("tok_emb", "pos_emb", "lm_head", "cls_token")))
    return (6 * N + 12 * c.n_layer * c.n_embd * T) * B * T


def bench_cuda(cfg, dev):
    if not str(dev).startswith("cuda"):
        print("\n## CUDA\nskipped: no GPU (run on a CUDA machine for tokens/s and MFU)")
        return dict(skipped="no cuda device")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    name = torch.cuda.get_device_name()
    peak = cfg["peak_flops"] or peak_bf16(name)
    autocast = lambda: torch.autocast("cuda", dtype=torch.bfloat16)
    # Batch sizes: 256 for PathFinder and 32 for Text. On an H200 (compiled, bf16) the
    # Text MFU was 34% at B=8, 36% at B=16 and 37% at B=32: small batches leave it short.
    # PathFinder (d=128) at B=64 is launch-bound and there our three separate W_Q, W_K,
    # W_V GEMMs cost ~12% against nn.MultiheadAttention's one in_proj GEMM (one GEMM on
    # the concatenated weights closed the gap); at B=256 we were ~10% faster.
    rows = [("PathFinder", PATHFINDER, 1024, 256), ("Text", TEXT, 4096, 32)]
    if cfg["quick"]:
        rows = [("PathFinder", PATHFINDER, 1024, 32), ("Text", TEXT, 4096, 4)]
    reps = cfg["reps"] or 20
    print(f"\n## CUDA: {name}, bf16 autocast, compile={cfg['compile']}, peak {peak or float('nan'):.3g} FLOP/s, "
          f"{reps} interleaved reps, medians\n", flush=True)
    results = []
    for label, dims, T, B in rows:
        torch.cuda.reset_peak_memory_stats()
        row, ours = throughput_row(label, dims, T, B, reps, dev, autocast, cfg["compile"])
        flops = flops_per_step(ours, B, T)
        row["flops_per_step"] = flops
        for who in ("ours", "ref"):
            achieved = flops * row[f"{who}_tok_s"] / (B * T)
            row[f"{who}_tflops"] = achieved / 1e12
            row[f"{who}_mfu"] = achieved / peak if peak else None
        row["max_mem_GiB"] = torch.cuda.max_memory_allocated() / 2**30
        results.append(row)
        print(f"  {label}: ours {row['ours_tok_s']:.0f} tok/s MFU {row['ours_mfu'] or float('nan'):.1%}, "
              f"ref {row['ref_tok_s']:.0f} tok/s", flush=True)
        del ours
        torch.cuda.empty_cache()
    print()
    print(markdown_table(results, [("config", "config", ""), ("T", "T", "d"), ("B", "B", "d"),
                                   ("ours_tok_s", "ours tok/s", ".0f"), ("ours_tflops", "ours TFLOP/s", ".1f"),
                                   ("ours_mfu", "ours MFU", ".1%"), ("ref_tok_s", "nn.TransformerEncoder tok/s", ".0f"),
                                   ("ref_mfu", "ref MFU", ".1%"), ("ratio", "ratio", ".3f"),
                                   ("max_mem_GiB", "peak GiB (both)", ".1f")]))
    text = [r for r in results if r["config"] == "Text" and r["ours_mfu"] is not None]
    if text:
        print(f"\ngoal MFU >= 35% on Text at T=4096 (H100/H200 class): {text[0]['ours_mfu']:.1%}")
    return dict(gpu=name, peak_flops=peak, compile=cfg["compile"], reps=reps, rows=results)


# -----------------------------------------------------------------------------
# 3. Speed options for the CPU preset: which make a CPU step faster?

def cpu_option_steps(dims, T, B):
    """name -> (zero-argument training step, images per call) for the plain step
    and each option; one model per option, same init, so each keeps its own state."""
    bf16 = lambda: torch.autocast("cpu", dtype=torch.bfloat16)
    options = {"plain (fp32, 1 thread, B=32)": dict(threads=1),
               "2 threads": dict(threads=2),
               "bf16 autocast": dict(threads=1, autocast=bf16),
               "torch.compile": dict(threads=1, compile_model=True),
               "batch 16": dict(threads=1, B=B // 2),
               "batch 64": dict(threads=1, B=B * 2)}
    steps = {}
    for name, o in options.items():
        b, model = o.get("B", B), build_pair(dims, T)[0]             # each option: the same init
        step = make_step(model, b, T, "cpu", o.get("autocast", nullcontext), o.get("compile_model", False))

        def run(step=step, n=o["threads"]):
            torch.set_num_threads(n)
            step()
        steps[name] = (run, b)
    return steps


def bench_cpu(cfg, dev):
    T, B = 1024, 32
    depths = [1] if cfg["quick"] else [1, 4]
    reps = cfg["reps"] or (2 if cfg["quick"] else 5)
    threads_before = torch.get_num_threads()                 # each option sets its own
    print(f"\n## CPU preset training step, PathFinder T={T} (n_embd=64, 4 heads, ffn x1): seconds per "
          f"image, ratio to the plain step (interleaved reps, medians; < 1: the option is faster)\n")
    results = []
    for depth in depths:
        steps = cpu_option_steps({**CPU_PRESET, "n_layer": depth}, T, B)
        times = interleaved({k: v[0] for k, v in steps.items()}, reps, warmup=2)
        per_image = {k: [t / steps[k][1] for t in times[k]] for k in steps}
        base = per_image["plain (fp32, 1 thread, B=32)"]
        for name in steps:
            results.append(dict(depth=depth, option=name, s_per_image=statistics.median(per_image[name]),
                                ratio=paired_ratio(per_image[name], base), reps=reps))
            print(f"  depth {depth}, {name}: {results[-1]['s_per_image'] * 1e3:.1f} ms/image, "
                  f"ratio {results[-1]['ratio']:.3f}", flush=True)
    torch.set_num_threads(threads_before)
    print()
    print(markdown_table(results, [("depth", "layers", "d"), ("option", "option", ""),
                                   ("s_per_image", "s / image", ".4f"), ("ratio", "ratio to plain", ".3f"),
                                   ("reps", "reps", "d")]))
    adopt = [o for o in dict.fromkeys(r["option"] for r in results)
             if all(r["ratio"] <= 0.9 for r in results if r["option"] == o)]
    print(f"\nadopt (>= 10% faster at every depth measured): {adopt or 'none'}")
    return dict(rows=results)


BENCHES = dict(throughput=bench_throughput, cuda=bench_cuda, cpu=bench_cpu)


# -----------------------------------------------------------------------------

def main(argv):
    argv = ["--quick=True" if a == "--quick" else a for a in argv]     # the bare flag, too
    cfg = configurator.configure(DEFAULTS, argv, __doc__)
    dev = ("cuda" if torch.cuda.is_available() else "cpu") if cfg["device"] == "auto" else cfg["device"]
    if cfg["threads"] and dev == "cpu":
        torch.set_num_threads(cfg["threads"])
    chosen = [s.strip() for s in cfg["only"].split(",") if s.strip()]
    if set(chosen) - set(BENCHES):
        raise ValueError(f"unknown section(s) {sorted(set(chosen) - set(BENCHES))} in --only; choose from {list(BENCHES)}")
    report = dict(config=cfg, torch=torch.__version__, device=dev, cpu_count=os.cpu_count(),
                  loadavg_start=os.getloadavg(), sections={})
    gpu = f" ({torch.cuda.get_device_name()})" if dev.startswith("cuda") else ""
    print(f"# bench.py{' --quick (REDUCED sizes)' if cfg['quick'] else ''}: torch {torch.__version__}, {dev}{gpu}, "
          f"{os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads, load average at start "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    t_start = time.perf_counter()
    for section in (s for s in BENCHES if s in chosen):
        t0 = time.perf_counter()
        report["sections"][section] = BENCHES[section](cfg, dev)
        report["sections"][section]["seconds"] = time.perf_counter() - t0
        report["loadavg_end"] = os.getloadavg()
        with open(cfg["out"], "w") as f:                     # after every section: partial results survive
            json.dump(report, f, indent=1, default=str)
    print(f"\ntotal {time.perf_counter() - t_start:.0f} s; load average at end {os.getloadavg()[0]:.2f}; "
          f"results in {cfg['out']}")


if __name__ == "__main__":
    configurator.run_cli(main)
