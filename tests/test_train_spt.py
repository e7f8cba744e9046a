"""train_spt.py on the synthetic task with a 1-layer model: SPT beats training
from scratch, SPT puts attention on the neighbours, the ablations do exactly what
they say, runs resume exactly, and bad flags are refused."""

import glob
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

import train_spt
from model import select_params
from training import load_checkpoint, read_log, setup_runtime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--task=synthetic", "--log_every=1", "--patience=0"]


def spt_config(argv):
    """train_spt.py's config of a command line (its DEFAULTS, then config/<task>.py, ...)."""
    return train_spt.get_config(argv)


def run(out_dir, *flags):
    return train_spt.main(TINY + [f"--out_dir={out_dir}", *flags])


def run_side_by_side(*runs):
    """Several runs (out_dir, flags), each in its own process with one thread, all at once:
    on 2 cores two small runs side by side take about the time of one with 2 threads."""
    procs = [subprocess.Popen([sys.executable, os.path.join(ROOT, "train_spt.py"), *TINY, f"--out_dir={d}", *flags],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, OMP_NUM_THREADS="1")) for d, flags in runs]
    errors = [p.communicate()[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), errors
    return [json.load(open(os.path.join(d, "summary.json"))) for d, _ in runs]


@pytest.fixture(scope="module")
def spt_vs_scratch(tmp_path_factory):
    """Equal supervised steps (4 epochs x 150, batch 32), with and without 4 epochs of SPT
    first, from the paper's premise of uniform attention at init (init=gpt2: scores std ~0.02).
    On our 2-core CPU, one thread each: best val 0.738 against 0.526, test 0.759 against 0.549."""
    base = tmp_path_factory.mktemp("runs")
    flags = ["--n_train=4800", "--batch_size=32", "--n_eval=1000", "--epochs=4", "--lr=3e-3", "--log_every=10",
             "--init=gpt2"]
    spt, scratch = run_side_by_side((base / "spt", [*flags, "--pretrain_epochs=4"]),
                                    (base / "scratch", [*flags, "--pretrain_epochs=0"]))
    return base, spt, scratch


@pytest.mark.xdist_group("spt_vs_scratch")   # one worker trains the pair once
def test_spt_then_finetune_beats_training_from_scratch(spt_vs_scratch):
    _, spt, scratch = spt_vs_scratch
    assert scratch["best_val_acc"] < 0.60                  # label supervision alone: near chance
    assert spt["best_val_acc"] > scratch["best_val_acc"] + 0.15
    assert spt["test_acc"] > scratch["test_acc"] + 0.10
    assert spt["steps"] == scratch["steps"] == 600


@pytest.mark.xdist_group("spt_vs_scratch")   # one worker trains the pair once
def test_spt_recovers_proximity_attention(spt_vs_scratch):
    base, spt, scratch = spt_vs_scratch
    uniform = spt["mass_w2_uniform"]
    assert abs(spt["mass_w2_init"] - uniform) < 0.01       # random init: about uniform
    assert spt["mass_w2_start"] > 2.5 * uniform             # after SPT, finetuning's start: near the diagonal
    assert scratch["mass_w2_finetune"] < 1.5 * uniform      # supervised alone: not
    assert spt["toeplitz_start"] > spt["toeplitz_init"]
    for name in ("curves.png", "proximity.png", "attention_init.png", "attention_start.png",
                 "attention_finetune.png", "config.json", "log.jsonl", "summary.json"):
        assert os.path.getsize(base / "spt" / name) > 0, name


def test_freeze_attn_leaves_those_weights_bit_identical(tmp_path):
    run(tmp_path, "--n_train=256", "--n_eval=64", "--epochs=2", "--pretrain_epochs=0", "--freeze=attn")
    fresh = train_spt.build_model(spt_config(TINY + ["--freeze=attn"]),
                                  [train_spt.load_data("synthetic", "train", spt_config(TINY))])
    trained = load_checkpoint(tmp_path / "finetune_best.pt")["model"]
    start = fresh.state_dict()
    attn = select_params(fresh, "attn")
    assert all(torch.equal(trained[n], start[n]) for n in attn)
    assert not all(torch.equal(trained[n], start[n]) for n in select_params(fresh, "mlp"))
    assert json.loads((tmp_path / "summary.json").read_text())["frozen"] == len(attn) == 8


@pytest.mark.xdist_group("spt_vs_scratch")   # one worker trains the pair once
def test_init_params_qk_copies_exactly_wq_and_wk(spt_vs_scratch):
    base, _, _ = spt_vs_scratch
    cfg = spt_config(TINY)
    data = [train_spt.load_data("synthetic", "train", cfg)]
    fresh = train_spt.build_model(cfg, data).state_dict()
    model = train_spt.build_model(cfg, data)
    copied = train_spt.hybrid_init(model, base / "spt" / "spt_best.pt", "qk")
    ckpt = load_checkpoint(base / "spt" / "spt_best.pt")["model"]
    assert sorted(copied) == sorted(["blocks.0.attn.W_Q.weight", "blocks.0.attn.W_Q.bias",
                                     "blocks.0.attn.W_K.weight", "blocks.0.attn.W_K.bias"])
    for name, value in model.state_dict().items():
        expected = ckpt[name] if name in copied else fresh[name]
        assert torch.equal(value, expected), name
        if name not in copied:
            assert not torch.equal(value, ckpt[name]) or name.startswith("head"), name


def test_pretrain_task_swap_runs_end_to_end(tmp_path):
    """The paper's swap: pretrain on generated PathFinder, finetune on (tiny) CIFAR-10."""
    from test_data_lra import write_cifar
    write_cifar(tmp_path, per_batch=8)
    out = run(tmp_path / "run", "--task=image", "--pretrain_task=pathfinder", f"--data_dir={tmp_path}",
              "--n_generate=200", "--n_train=32", "--n_eval=16", "--depth=1", "--n_embd=32", "--n_head=2",
              "--batch_size=16", "--pretrain_epochs=1", "--epochs=1")
    assert out["pretrain_task"] == "pathfinder" and out["task"] == "image"
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())
    assert cfg["pretrain_task"] == "pathfinder"
    phases = {r["phase"] for r in read_log(tmp_path / "run")}
    assert phases == {"spt", "finetune"}


def test_swap_across_vocabularies_is_refused(tmp_path):
    """ListOps' token ids are not pixels: pretraining PathFinder on them would alias ids."""
    with pytest.raises(ValueError, match="--pretrain_task=listops has another vocabulary"):
        run(tmp_path / "run", "--task=pathfinder", "--pretrain_task=listops", f"--data_dir={tmp_path}",
            "--n_generate=200", "--n_train=32", "--n_eval=16", "--depth=1", "--n_embd=32", "--n_head=2",
            "--batch_size=16")
    assert not (tmp_path / "run").exists()


def losses(out_dir):
    return [(r["phase"], r["step"], r.get("loss"), r.get("val_loss")) for r in read_log(out_dir)
            if "event" not in r]                      # the resume record is the only difference


@pytest.mark.slow   # test_reliability's halts and SIGTERM stop inside SPT and finetuning, bit-exactly with dropout
@pytest.mark.parametrize("halt_at", [7, 17])   # inside SPT; finetuning
def test_resume_continues_a_killed_run_exactly(tmp_path, halt_at):
    flags = ["--n_train=320", "--n_eval=64", "--pretrain_epochs=2", "--epochs=2", "--ckpt_every=3"]   # 5 steps an epoch
    straight = run(tmp_path / "a", *flags)
    with pytest.raises(SystemExit, match="halted"):
        run(tmp_path / "b", *flags, f"--halt_after_steps={halt_at}")
    ckpt = load_checkpoint(tmp_path / "b" / "ckpt.pt")
    assert ckpt["step"] == (halt_at if halt_at < 10 else halt_at - 10)  # saved where it halted (SPT: 10 steps)
    resumed = run(tmp_path / "b", "--init_from=resume")
    assert losses(tmp_path / "a") == losses(tmp_path / "b")
    assert resumed["test_acc"] == straight["test_acc"]


def test_nan_loss_stops_with_a_clear_message_and_keeps_the_checkpoint(tmp_path, monkeypatch):
    calls = [0]
    forward = train_spt.Classification.forward

    def poisoned(self, *args):
        calls[0] += 1
        loss, logits = forward(self, *args)
        return (loss * float("nan") if calls[0] > 12 else loss), logits

    monkeypatch.setattr(train_spt.Classification, "forward", poisoned)
    with pytest.raises(FloatingPointError,
                       match=r"became NaN or inf at step 12; stopped before its update.*last good checkpoint is .*ckpt\.pt \(step 10\)"):
        run(tmp_path, "--n_train=640", "--n_eval=64", "--pretrain_epochs=0", "--epochs=2",
            "--ckpt_every=5")
    ckpt = load_checkpoint(tmp_path / "ckpt.pt")
    assert ckpt["step"] == 10
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values())


def test_spt_alone_then_finetuning_from_its_checkpoint_logs_what_one_spt_run_logs(tmp_path):
    """--epochs=0 stops after SPT; a run finetuning from its spt_best.pt (every weight)
    logs the same finetuning steps as phase 2 of a run that does both: the split that lets
    the PathFinder arms start from recorded checkpoints (tools/lra_rescue.py)."""
    size = ["--n_train=320", "--n_eval=64", "--batch_size=32", "--seed=3"]
    spt = [*size, "--pretrain_epochs=2", "--save_epochs=1"]
    run(tmp_path / "both", *spt, "--epochs=2")
    alone = run(tmp_path / "alone", *spt, "--epochs=0")
    assert "test_acc" not in alone and alone["spt_best_epoch"] in (1, 2) and alone["steps"] == 0
    assert (tmp_path / "alone" / "spt_epoch1.pt").exists() and "mass_w2_spt" in alone
    run(tmp_path / "then", *size, "--epochs=2", f"--init_from={tmp_path / 'alone' / 'spt_best.pt'}")
    phase = lambda d, name: [r for r in read_log(d) if r["phase"] == name]
    assert phase(tmp_path / "both", "spt") == phase(tmp_path / "alone", "spt")
    assert len(phase(tmp_path / "then", "finetune")) > 20
    assert phase(tmp_path / "both", "finetune") == phase(tmp_path / "then", "finetune")


@pytest.mark.parametrize("argv,message", [
    (["--task=synthetic", "--lrr=1"], "unknown flag --lrr; did you mean --lr"),
    (["--task=synthetic", "--depth=one"], "--depth=one: expected a int"),
    (["--task=mnist"], "--task=mnist is not one of"),
    (["--task=synthetic", "--init_params=attn,mpl"], "--init_params=attn,mpl: choose from"),
    (["--task=synthetic", "--spt_objective=denoise"], "--spt_objective='denoise' is not one of"),
    (["--task=synthetic", "--mask_ratio=1.5"], "--mask_ratio=1.5 must be in"),
    (["--task=synthetic", "--epochs=0", "--pretrain_epochs=0"], "--epochs=0 runs the SPT phase alone"),
    (["--task=photos"], "--task=photos has no labels"),
])
def test_config_override_parsing_rejects_bad_keys(argv, message):
    with pytest.raises(ValueError, match=message):
        spt_config(argv)


def test_command_line_error_is_one_clear_line():
    result = subprocess.run([sys.executable, "train_spt.py", "--task=synthetic", "--freeze=attention"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "--freeze=attention: choose from" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().startswith("error: ") and len(result.stderr.strip().splitlines()) == 1


def launch(out_dir, *flags, procs=1):
    cmd = [sys.executable, "train_spt.py"] if procs == 1 else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}", "train_spt.py"]
    subprocess.run(cmd + ["--task=synthetic", "--n_train=512", "--n_eval=64", "--epochs=1",
                          f"--out_dir={out_dir}", *flags],
                   cwd=ROOT, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600,
                   capture_output=True)
    return json.loads((out_dir / "summary.json").read_text())


@pytest.mark.slow
def test_ddp_two_processes_match_one_process_with_the_same_global_batch(tmp_path):
    ddp = launch(tmp_path / "ddp", "--pretrain_epochs=0", "--batch_size=32", procs=2)
    launch(tmp_path / "one", "--pretrain_epochs=0", "--batch_size=64")
    assert ddp["world_size"] == 2 and ddp["replica_max_diff"] == 0.0
    a = load_checkpoint(tmp_path / "ddp" / "finetune_best.pt")["model"]
    b = load_checkpoint(tmp_path / "one" / "finetune_best.pt")["model"]
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5


@pytest.mark.slow
def test_ddp_replicas_stay_identical_through_spt_and_finetuning(tmp_path):
    ddp = launch(tmp_path / "ddp", "--pretrain_epochs=1", "--batch_size=32", procs=2)
    assert ddp["world_size"] == 2 and ddp["replica_max_diff"] == 0.0
    assert ddp["spt_best_val_loss"] is not None


# --preset=cpu: the CPU-scale LRA setting, shrunk to 4 steps
PRESET_4_STEPS = ["--preset=cpu", "--n_train=16", "--n_eval=16", "--batch_size=8", "--pretrain_epochs=1",
                  "--epochs=1", "--log_every=1", "--patience=0"]


@pytest.mark.parametrize("task,n_generate", [("pathfinder", 200), ("listops", 100)])
def test_cpu_preset_parses_and_runs_end_to_end(tmp_path, task, n_generate):
    cfg = spt_config([f"--task={task}", "--preset=cpu"])
    assert (cfg["depth"], cfg["n_embd"], cfg["schedule"], cfg["pretrain_lr"]) == (1, 64, "cosine", 3e-3)
    assert cfg["difficulty"] == ("baseline" if task == "pathfinder" else "contour_length_14")
    assert spt_config([f"--task={task}", "--preset=cpu", "--depth=4"])["depth"] == 4  # flags win
    out = tmp_path / "run"
    summary = train_spt.main([f"--task={task}", *PRESET_4_STEPS, f"--n_generate={n_generate}",
                              f"--data_dir={tmp_path / 'data'}", f"--out_dir={out}"])
    records = read_log(out)
    spt_steps = {r["step"] for r in records if r.get("phase") == "spt" and "loss" in r}
    assert len(spt_steps) == 2 and summary["steps"] == 2          # 2 SPT + 2 finetuning steps
    assert summary["spt_best_val_loss"] is not None and 0 <= summary["test_acc"] <= 1
    assert (out / "attention_2d.png").exists() == (task == "pathfinder")   # one image's 2-D maps
    if task == "pathfinder":                                      # Amos et al.'s linear pixel encoder
        state = load_checkpoint(out / "spt_best.pt")["model"]
        assert summary["init"] == "amos" and "pix_emb.weight" in state and state["lm_head.weight"].shape[0] == 256


def test_pretrain_schedule_sets_the_spt_phase_alone(tmp_path):
    run(tmp_path, "--n_train=320", "--n_eval=64", "--pretrain_epochs=2", "--epochs=2", "--lr=1e-3",
        "--pretrain_lr=3e-3", "--warmup_frac=0.2", "--schedule=cosine", "--pretrain_schedule=constant")
    lr = {phase: [r["lr"] for r in read_log(tmp_path) if r.get("phase") == phase and "lr" in r]
          for phase in ("spt", "finetune")}
    assert len(lr["spt"]) == len(lr["finetune"]) == 10
    assert lr["spt"][2:] == [pytest.approx(3e-3)] * 8              # flat after its 2 warmup steps
    assert lr["finetune"][-1] < 0.2 * max(lr["finetune"])          # cosine decays to 10%


def mask_stream(cfg):
    return torch.Generator().manual_seed(cfg["seed"] + train_spt.MASK_SEED_OFFSET)


def test_seeds_change_the_model_and_the_masks_not_the_data(tmp_path):
    flags = ["--task=pathfinder", "--preset=cpu", "--n_generate=200", f"--data_dir={tmp_path}"]
    a, b = (spt_config(flags + [f"--seed={s}"]) for s in (0, 1))
    data_a, data_b = (train_spt.load_data("pathfinder", "train", c) for c in (a, b))
    assert len(data_a) == len(data_b) == 160
    assert all(torch.equal(data_a[i][0], data_b[i][0]) and data_a[i][1] == data_b[i][1] for i in range(160))
    w_a, w_b = (train_spt.build_model(c, [data_a]).state_dict() for c in (a, b))
    assert all(not torch.equal(w_a[k], w_b[k]) for k in w_a if k.endswith("attn.W_Q.weight"))
    masks = [train_spt.draw_hidden((8, 1024), 0.5, mask_stream(c)) for c in (a, b, a)]
    assert not torch.equal(masks[0], masks[1]) and torch.equal(masks[0], masks[2])


# Amos et al.'s attention init and pixel encoder as the LRA tasks' defaults
LRA_TASKS = ("listops", "text", "retrieval", "image", "pathfinder", "pathx")


def test_lra_tasks_start_from_tied_attention_and_pixel_tasks_read_grey_values():
    for task in ("synthetic", *LRA_TASKS):
        cfg = spt_config([f"--task={task}"])
        assert cfg["init"] == ("torch" if task == "synthetic" else "amos"), task
        assert cfg["pixel_encoder"] == ("linear" if task in train_spt.IMAGE_TASKS else "token"), task
    cfg = spt_config(["--task=pathfinder", "--init=torch", "--pixel_encoder=token"])
    assert (cfg["init"], cfg["pixel_encoder"]) == ("torch", "token")        # both can be turned off


@pytest.mark.parametrize("argv,message", [
    (["--task=synthetic", "--pixel_encoder=linear"], "--pixel_encoder=linear reads grey levels"),
    (["--task=listops", "--pixel_encoder=linear"], "of image, pathfinder, pathx"),
    (["--task=pathfinder", "--pixel_encoder=conv"], "pixel_encoder='conv' is unknown"),
    (["--task=pathfinder", "--init=tied"], "init='tied' is unknown"),
])
def test_bad_init_and_pixel_encoder_flags_are_refused(argv, message):
    with pytest.raises(ValueError, match=message):
        spt_config(argv)


def test_spt_objective_gives_a_masked_pixel_to_the_model_as_zero_with_its_mask_flag():
    """Through MaskedReconstruction: the linear encoder's input at a hidden pixel is [0, 1]
    whatever its grey level, and the loss is 256-way cross-entropy on the hidden ones."""
    torch.manual_seed(0)
    from model import Transformer, TransformerConfig
    model = Transformer(TransformerConfig(vocab_size=258, max_len=64, n_embd=32, n_head=2, init="amos",
                                          pixel_encoder="linear"))
    seen = []
    model.pix_emb.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0]))
    tokens = torch.randint(0, 256, (4, 64), generator=torch.Generator().manual_seed(1))
    hide = train_spt.draw_hidden(tokens.shape, 0.5, torch.Generator().manual_seed(2))
    loss, hits, read = train_spt.MaskedReconstruction(model, mask_id=257)(tokens, None, hide)
    features = seen[0]
    assert torch.equal(features[hide], torch.tensor([[0.0, 1.0]]).expand(int(hide.sum()), 2))
    assert torch.allclose(features[~hide][:, 0], tokens[~hide].float() / 127.5 - 1) and (features[~hide][:, 1] == 0).all()
    logits = model.reconstruct(tokens.masked_fill(hide, 257))
    assert logits.shape[-1] == 256
    assert loss.item() == pytest.approx(torch.nn.functional.cross_entropy(logits[hide], tokens[hide]).item(), rel=1e-5)
    assert read == hide.sum() and hits == (logits[hide].argmax(-1) == tokens[hide]).sum()   # masked-token accuracy


@pytest.mark.slow
def test_token_pixel_encoder_runs_spt_then_finetuning_on_pathfinder(tmp_path):
    """The other pixel encoder than the task's linear one (which the --preset=cpu test runs);
    marked slow: its embedding table is the one every synthetic-task test trains."""
    flags = ["--task=pathfinder", "--n_generate=100", f"--data_dir={tmp_path / 'data'}", "--n_train=32",
             "--n_eval=16", "--depth=1", "--n_embd=32", "--n_head=2", "--batch_size=8", "--pretrain_epochs=1",
             "--epochs=1", "--warmup_steps=0", "--pretrain_warmup_steps=0", "--log_every=1"]
    out = tmp_path / "token"
    summary = train_spt.main(flags + ["--pixel_encoder=token", f"--out_dir={out}"])
    state = load_checkpoint(out / "spt_best.pt")["model"]
    assert "tok_emb.weight" in state and "pix_emb.weight" not in state and state["lm_head.weight"].shape[0] == 258
    assert summary["init"] == "amos" and summary["steps"] == 4 and summary["spt_best_val_loss"] < 6.0


# The main command's cost, said before the training
def test_a_long_run_says_its_cost_and_the_shorter_commands_first(tmp_path, monkeypatch, capsys):
    """The main command says what it costs before any image is made, then goes on."""
    import data_lra

    def no_data(*args, **kwargs):
        raise KeyboardInterrupt("stopped where the data would be made")
    monkeypatch.setattr(data_lra, "load_task", no_data)
    with pytest.raises(KeyboardInterrupt):
        train_spt.main(["--task=pathfinder", "--depth=1", f"--data_dir={tmp_path / 'data'}", f"--out_dir={tmp_path / 'run'}"])
    out = capsys.readouterr().out
    assert re.search(r"This run takes about [\d,.]+ h .* 250 epochs of 160,000 images", out), out
    assert "--task=synthetic" in out and "--preset=cpu_rescue" in out and not (tmp_path / "data").exists()
    train_spt.announce_cost(spt_config(["--task=pathfinder", *PRESET_4_STEPS, "--n_generate=200"]),
                            setup_runtime("cpu", "float32"))                       # minutes: no line
    assert capsys.readouterr().out == ""


def test_the_main_command_runs_the_experiment_its_defaults_show():
    """What a reader sees at the top of train_spt.py is what the README's main command runs:
    config/pathfinder.py sets nothing, and another task's file sets its own keys."""
    for argv in (["--task=pathfinder", "--depth=1"], []):
        cfg = spt_config(argv)
        assert {k: cfg[k] for k in train_spt.DEFAULTS} == train_spt.DEFAULTS, argv
        assert train_spt.auto_out_dir(cfg) == "out/pathfinder_d1_50ep"
    other = spt_config(["--task=synthetic"])
    assert other["init"] == "torch" and other["pixel_encoder"] == "token" and other["warmup_steps"] == 0
    assert other["config_files"] == "config/synthetic.py"


def test_help_lists_every_flag_with_its_comment():
    out = subprocess.run([sys.executable, "train_spt.py", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "--depth=1  # the paper's one-layer model" in out.stdout and "--out_dir=''" in out.stdout
    assert "--preset=''  # \"\", cpu or cpu_rescue" in out.stdout


class PixelShapes:
    """What build_model reads of a PathFinder-32 dataset, without the images."""
    vocab_size, n_classes, max_len, mask_id = 258, 2, 1024, 257

    def __getitem__(self, i):
        return torch.zeros(1024, dtype=torch.long), 0


def test_the_committed_checkpoints_still_load_with_init_from():
    """Every checkpoint under results/ passes --init_from's checks and copies into a model of its
    config, old runs' included: a record is something to finetune from, not only to read."""
    paths = sorted(glob.glob(os.path.join(ROOT, "results", "**", "*.pt"), recursive=True))
    assert len(paths) >= 10
    for path in paths:
        theirs = load_checkpoint(path)["config"]
        model_flags = [f"--{k}={theirs[k]}" for k in ("depth", "n_embd", "n_head", "ffn_mult", "pos_enc", "pool", "init",
                                                     "pixel_encoder")]
        cfg = spt_config([f"--task={theirs['task']}", *model_flags, f"--init_from={path}"])
        model = train_spt.build_model(cfg, [PixelShapes()])
        assert len(train_spt.hybrid_init(model, path, "all")) == len(model.state_dict()), path


def test_a_run_records_which_data_it_read(tmp_path):
    summary = run(tmp_path / "run", "--n_train=64", "--n_eval=32", "--pretrain_epochs=0", "--epochs=1")
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["data"] == {"train": "made in memory", "pretrain": "made in memory"} and "test_acc" in summary
    assert config["config_files"] == "config/synthetic.py"


def test_a_resumed_run_keeps_its_attention_snapshots_once(tmp_path):
    """A run killed after a snapshot but before its next checkpoint resumes from the checkpoint:
    the snapshots it logged past that point are dropped, not written twice."""
    flags = ["--n_train=640", "--n_eval=32", "--pretrain_epochs=1", "--epochs=1", "--snapshot_attn_every=3"]
    run(tmp_path / "a", *flags)
    with pytest.raises(SystemExit, match="halted"):
        run(tmp_path / "b", *flags, "--halt_after_steps=5")                    # ckpt.pt at step 5
    shutil.copy(tmp_path / "b" / "ckpt.pt", tmp_path / "step5.pt")
    with pytest.raises(SystemExit, match="halted"):
        run(tmp_path / "b", "--init_from=resume", "--halt_after_steps=3")      # snapshot at 6, ckpt.pt at 8
    shutil.copy(tmp_path / "step5.pt", tmp_path / "b" / "ckpt.pt")            # as if killed before step 8's save
    run(tmp_path / "b", "--init_from=resume")
    steps = lambda d: [(r["phase"], r["step"]) for r in read_log(d, "snapshots.jsonl")]
    assert steps(tmp_path / "b") == steps(tmp_path / "a") and len(steps(tmp_path / "a")) == 6
