"""What a run will cost on this device, said before any work, and which dtype is fastest
here. A train_spt.py run that would take more than ANNOUNCE_ABOVE_S prints the estimate
of its data generation and its training, with the commands that show the effect sooner,
then goes on. --dtype=fast times the run's own model in float32 and bf16 (choose_dtype).

The estimate is measured here: a few forward/backward passes of the run's own model on a
small batch (scaled to the batch size), and the PathFinder generator timed on one chunk
(scaled to the processes that generate them)."""

import math
import os
import time

import torch


ANNOUNCE_ABOVE_S = 600
SHORTER = ("python train_spt.py --task=synthetic            # SPT against scratch on the synthetic task: "
           "minutes on a CPU",
           "python tools/lra_rescue.py run                 # SPT against scratch on PathFinder at CPU scale: "
           "hours on 2 cores")
PATHFINDER_N = 200_000          # data_lra.load_pathfinder's default: LRA's size
TRAIN_FRACTION = 0.8            # its 80/10/10 split


def duration(seconds):
    """Seconds -> '40 s', '7 min', '3.5 h', '46 days'."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.0f} days"


def image_count(cfg):
    """Images of a PathFinder run's data (None for a task whose size is read from its files)."""
    if cfg["task"] not in ("pathfinder", "pathx"):
        return None
    return cfg["n_generate"] or PATHFINDER_N


def seconds_per_image(cfg, rt, seq_len, reps=2, batch=2):
    """One training step's time per image of the run's model (forward, loss, backward),
    measured on `batch` random images; the random state is left as it was."""
    from model import Transformer, TransformerConfig   # here: Paper B's runs never load Paper A's model
    conf = TransformerConfig(vocab_size=258, n_classes=2, max_len=seq_len, n_layer=cfg["depth"],
                             n_head=cfg["n_head"], n_embd=cfg["n_embd"], ffn_mult=cfg["ffn_mult"],
                             pos_enc=cfg["pos_enc"], pool=cfg["pool"], init=cfg["init"],
                             pixel_encoder=cfg["pixel_encoder"], mask_id=257)
    with torch.random.fork_rng(devices=[]):
        model = Transformer(conf).to(rt.device)
        x = torch.randint(0, 256, (batch, seq_len), device=rt.device)
        return step_seconds(lambda: model.classify(x).float().logsumexp(-1).mean(), rt.device_type, rt.ptdtype,
                            reps) / batch


def step_seconds(loss_fn, device_type, dtype, reps=2):
    """The fastest of `reps` forward + backward passes of loss_fn() under autocast(dtype),
    after one more, untimed, to warm up."""
    times = []
    for _ in range(reps + 1):
        t = time.perf_counter()
        with torch.autocast(device_type, dtype=dtype, enabled=dtype != torch.float32):
            loss = loss_fn()
        loss.float().backward()
        if device_type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return min(times[1:])


def fastest_dtype(seconds_per_step, dtypes=(torch.float32, torch.bfloat16)):
    """The dtype whose step seconds_per_step(dtype) says is fastest. Whether bf16 autocast
    pays on a CPU depends on the CPU and on the shape: emulated (AVX2-only) it took 5x
    the float32 step, and at head dimension 16 it was slower even with AMX; on a Zen 5
    with AVX512-BF16, at depth 2, d=64, batch 32, it took 0.82x."""
    times = {d: seconds_per_step(d) for d in dtypes}
    return min(dtypes, key=lambda d: times[d])


def choose_dtype(run, model, loss_fn):
    """--dtype=fast on a CPU: time a step of this run's own model (loss_fn(): a forward
    pass to a scalar) in float32 and in bf16 autocast, and keep the faster in run.rt. The
    random state and the gradients are left as they were. (On a GPU, setup_runtime has
    chosen: bf16 where the GPU has it.)"""
    if run.cfg["dtype"] != "fast" or run.rt.device_type != "cpu":
        return
    with torch.random.fork_rng(devices=[]):
        run.rt.ptdtype = fastest_dtype(lambda d: step_seconds(loss_fn, "cpu", d))
    model.zero_grad(set_to_none=True)
    run.say(f"--dtype=fast: {str(run.rt.ptdtype).replace('torch.', '')} steps faster here, timed on this model")


def generation_seconds(cfg, n):
    """Time to generate n PathFinder images here, or 0 when they are already cached."""
    import data_lra
    import pathfinder
    resolution = 32 if cfg["task"] == "pathfinder" else 128
    path = data_lra.generated_pathfinder_path(cfg["data_dir"], n, 0, cfg["difficulty"], resolution)
    if cfg["data_source"] == "release" or os.path.exists(path):
        return 0.0
    length = data_lra.DIFFICULTIES[data_lra._difficulty(cfg["difficulty"])][1]
    size = min(data_lra.CHUNK, n)                 # one chunk, as each process draws them (never more than n)
    t = time.perf_counter()
    pathfinder.generate_chunk(99, 0, size, length, resolution)
    return (time.perf_counter() - t) / size * n / (os.cpu_count() or 1)


def estimate(cfg, rt):
    """(generation s, training s, lines describing them), or None where the data's size is
    not known before reading it."""
    n = image_count(cfg)
    if n is None:
        return None
    resolution = 32 if cfg["task"] == "pathfinder" else 128
    n_train = cfg["n_train"] or int(n * TRAIN_FRACTION)
    n_eval = cfg["n_eval"] or n // 10
    steps = math.ceil(n_train / cfg["batch_size"])
    epochs = cfg["pretrain_epochs"] + cfg["epochs"]
    per_image = seconds_per_image(cfg, rt, resolution ** 2)
    train_s = epochs * (n_train + n_eval / 3) * per_image       # validation: a forward pass, ~1/3 of a step
    gen_s = generation_seconds(cfg, n)
    lines = [f"  training: {cfg['pretrain_epochs']} SPT + {cfg['epochs']} finetuning epochs of {steps:,} steps "
             f"(batch {cfg['batch_size']}): about {duration(train_s)} ({per_image * cfg['batch_size']:.2f} s a "
             f"step, measured here)"]
    if gen_s:
        lines.insert(0, f"  data: generating {n:,} PathFinder images first: about {duration(gen_s)}")
    return gen_s, train_s, lines


def announce(cfg, rt):
    """Print the run's cost and the shorter commands when it is long; returns the estimate."""
    est = estimate(cfg, rt)
    if est is None or est[0] + est[1] < ANNOUNCE_ABOVE_S or not rt.master:
        return est
    print(f"This run's cost on this device ({rt.device}, {str(rt.ptdtype).replace('torch.', '')}), "
          f"estimated before starting:")
    print("\n".join(est[2]))
    print("To see the effect sooner:\n" + "\n".join("  " + c for c in SHORTER))
    print("Going on (Ctrl-C stops it; --init_from=resume continues it).", flush=True)
    return est
