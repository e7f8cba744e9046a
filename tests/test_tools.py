"""tools/: the attention-at-init table and the one-call GPU script for Amos et al.'s
PathFinder setting (its CPU smoke test runs a few steps per arm, in parallel processes)."""

import math
import os
import pathlib
import re
import shutil

import pytest
import torch

from tools import amos_pathfinder_gpu as gpu
from tools import attention_at_init


def test_attention_at_init_table_has_a_row_per_input_model_and_init():
    out = attention_at_init.main(["--seeds=1", "--n=2"])
    rows = [line for line in out.splitlines()[2:] if line.startswith("| ")]
    assert len(rows) == 2 * 3 + 4 * 3                       # synthetic walks and i.i.d.; 4 PathFinder models
    amos_walks = next(r for r in rows if r.startswith("| synthetic walks") and "| amos |" in r)
    assert float(amos_walks.split("|")[4]) > 2.0            # the tied init's self mass, x uniform
    with pytest.raises(ValueError, match="--seeds >= 1"):
        attention_at_init.main(["--seeds=0"])


def flags_of(cfg, arm, init="amos", seed=0):
    return dict(f[2:].split("=", 1) for f in gpu.run_flags(cfg, init, arm, seed, cap_hours=0.05))


def test_gpu_script_runs_amos_et_al_pathfinder_config_with_matched_finetuning():
    cfg = dict(gpu.DEFAULTS, out_dir="/o", data_dir="/d")
    scratch, spt = flags_of(cfg, "scratch"), flags_of(cfg, "spt", seed=1)
    assert scratch["task"] == "pathfinder" and scratch["difficulty"] == "contour_length_14"
    assert "depth" not in scratch and "lr" not in scratch   # the task's own: 4 layers, d=128, lr 5e-4
    assert scratch["pretrain_epochs"] == "0" and spt["pretrain_epochs"] == str(cfg["spt_epochs"])
    assert scratch["epochs"] == spt["epochs"] == str(cfg["epochs"])      # equal finetuning epochs
    assert spt["seed"] == "1" and spt["out_dir"] == "/o/amos_spt_s1" and float(spt["max_hours"]) == 0.05
    smoke = flags_of(dict(cfg, smoke=True), "spt")
    assert smoke["device"] == "cpu" and smoke["depth"] == "1"


def test_gpu_script_time_caps_fit_the_budget_or_refuse():
    cfg = dict(gpu.DEFAULTS, minutes=9.0)
    cap_s = gpu.phase_cap_hours(cfg, elapsed_s=60) * 3600
    assert 2 * cap_s + 60 + gpu.MARGIN_S < 9 * 60                         # both SPT-arm phases, data, margin
    with pytest.raises(ValueError, match="leaves .* s for training"):
        gpu.phase_cap_hours(dict(cfg, minutes=2.0), elapsed_s=30)


def test_gpu_script_table_is_mean_and_spread_over_seeds():
    run = dict(spt_steps=0, steps=100, spt_loss=None, mass_init=0.01, mass_spt=None, mass_final=0.02,
               uniform=0.0084, val=0.5, test=0.6)
    out = gpu.table({("amos", "scratch"): [run, dict(run, test=0.8)]})
    assert "| amos | scratch | 2 | 0 ± 0 | 100 ± 0 | - |" in out and "| 0.700 ± 0.141 |" in out
    assert "uniform attention: 0.0084" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_gpu_script_refuses_a_machine_without_a_gpu_unless_smoke(tmp_path):
    with pytest.raises(ValueError, match="no CUDA GPU here"):
        gpu.main([f"--out_dir={tmp_path}"])
    assert not any(tmp_path.iterdir())                                     # nothing written


@pytest.mark.slow
def test_gpu_script_smoke_runs_every_arm_on_the_cpu(tmp_path):
    out = gpu.main(["--smoke=True", f"--out_dir={tmp_path / 'out'}", f"--data_dir={tmp_path / 'data'}"])
    for init in ("amos", "torch"):
        for arm in gpu.ARMS:
            assert (tmp_path / "out" / f"{init}_{arm}_s0" / "summary.json").exists()
            assert f"| {init} | {arm} | 1 |" in out
    assert "FAILED" not in out and (tmp_path / "out" / "table.md").read_text().strip() == out
    assert len((tmp_path / "out" / "commands.txt").read_text().splitlines()) == 4
    again = gpu.main(["--smoke=True", f"--out_dir={tmp_path / 'out'}", f"--data_dir={tmp_path / 'data'}"])
    assert again.split("wall time")[0] == out.split("wall time")[0]   # finished runs are not run again


def experiments(*args, **env):
    import os
    import subprocess
    result = subprocess.run(["bash", "tools/amos_experiments.sh", *args], capture_output=True, text=True,
                            timeout=600, env={**os.environ, **{k: str(v) for k, v in env.items()}})
    return result.returncode, result.stdout, result.stderr


def test_experiment_script_lists_every_run_of_each_experiment():
    rc, out, _ = experiments("synthetic", DRY=1)
    runs = out.strip().splitlines()
    assert rc == 0 and len(runs) == 18 and all("--task=synthetic --init=amos" in r for r in runs)
    assert sum("--init_params=qk" in r for r in runs) == 3 and sum("--freeze=attn" in r for r in runs) == 3
    rc, out, _ = experiments("plateau", DRY=1)
    assert rc == 0 and len(out.splitlines()) == 4 and all("--pretrain_schedule=constant" in r for r in out.splitlines())
    rc, out, _ = experiments("depth2", "torch", DRY=1)
    runs = out.strip().splitlines()
    assert rc == 0 and len(runs) == 8 and all("--depth=2 --init=torch" in r for r in runs)
    assert sum("--epochs=12+K" in r for r in runs) == 2                  # compute-matched: 12 + SPT epochs
    rc, _, err = experiments("nothing")
    assert rc == 2 and "usage" in err


@pytest.mark.slow
def test_experiment_script_runs_the_plateau_experiment_small_and_skips_it_the_second_time(tmp_path):
    tiny = (f"--n_generate=100 --data_dir={tmp_path / 'data'} --n_train=32 --n_eval=16 --batch_size=8 "
            "--n_embd=32 --n_head=2 --pretrain_epochs=2 --save_epochs=1,2 --log_every=1")
    rc, out, err = experiments("plateau", OUT=tmp_path / "out", EXTRA=tiny)
    assert rc == 0, err
    assert out.count("done: ") == 4 and "FAILED" not in out
    table = (tmp_path / "out" / "plateau" / "plateau.md").read_text()
    assert table.count("| 2 | 8 |") == 4                                  # epoch 2 = step 8, in each run
    assert (tmp_path / "out" / "plateau" / "amos_s0" / "command.txt").read_text().count("--init=amos") == 1
    rc, out, _ = experiments("plateau", OUT=tmp_path / "out", EXTRA=tiny)
    assert rc == 0 and out.count("finished already") == 4


def test_plateau_report_finds_the_first_spt_epoch_below_the_threshold(tmp_path, capsys):
    import json
    from tools import spt_plateau
    losses = [0.80, 0.78, 0.69, 0.71, 0.60]
    with open(tmp_path / "log.jsonl", "w") as f:
        for e, loss in enumerate(losses, 1):
            f.write(json.dumps(dict(phase="spt", step=250 * e, epoch=e, val_loss=loss)) + "\n")
        f.write(json.dumps(dict(phase="finetune", step=250, epoch=1, val_loss=0.3, val_acc=0.9)) + "\n")
    assert spt_plateau.main([f"--runs={tmp_path}", "--epoch_only=True"]) == 3
    assert spt_plateau.main([f"--runs={tmp_path}", "--epoch_only=True", "--threshold=0.5"]) == 5   # never: the last
    out = spt_plateau.main([f"--runs={tmp_path}"])
    assert "below 0.7 after epoch 3 (step 750, 0.6900)" in out and "| 4 | 1000 | 0.7100 | - |" in out
    with pytest.raises(FileNotFoundError, match="log.jsonl does not exist"):
        spt_plateau.main([f"--runs={tmp_path / 'nowhere'}"])


# tools/lra_rescue.py: the PathFinder rescue and its ablations: seed runs, records, verdicts, figures
from tools import lra_rescue as rescue  # noqa: E402


UP, STUCK = [True] * 3, [False] * 3


@pytest.mark.parametrize("spt,spt_off,base,base_off,expected", [
    ([0.66, 0.63, 0.70], UP, [0.52, 0.48, 0.52], STUCK, "rescued"),
    ([0.66, 0.63, 0.70], UP, [0.52, 0.48, 0.55], [False, False, True], "SPT ahead, scratch learns too"),
    ([0.66, 0.63, 0.70], [True, False, True], [0.52, 0.48, 0.52], STUCK, "separated, not every SPT seed took off"),
    ([0.56, 0.55, 0.57], UP, [0.52, 0.48, 0.52], STUCK, "separated, small gap"),
    ([0.66, 0.51, 0.70], [True, False, True], [0.52, 0.48, 0.52], STUCK, "not separated"),   # one seed inside
    ([0.52, 0.48, 0.52], STUCK, [0.48, 0.52, 0.52], STUCK, "neither learns"),
    ([0.45, 0.44, 0.40], [False, True, True], [0.52, 0.48, 0.52], STUCK, "worse"),
    ([0.66, 0.63], UP[:2], [0.52, 0.48, 0.52], STUCK, "too few seeds (3 per arm needed)"),
])
def test_rescue_verdict_follows_the_rule_written_before_the_runs(spt, spt_off, base, base_off, expected):
    assert rescue.verdict(spt, spt_off, base, base_off) == expected


SPT, BASE = [0.649, 0.697, 0.747], [0.524, 0.627, 0.507]      # take two's seeds: gain 0.145


@pytest.mark.parametrize("arm,arm_off,spt,base,expected", [
    ([0.70, 0.69, 0.72], UP, SPT, BASE, "recovers the gain"),             # 0.87 of the gain, all took off
    ([0.76, 0.75, 0.80], UP, SPT, BASE, "recovers the gain"),             # above spt: still "recovers"
    ([0.70, 0.69, 0.72], [True, True, False], SPT, BASE, "part of the gain"),   # a seed stuck where spt's took off
    ([0.64, 0.65, 0.66], UP, SPT, BASE, "part of the gain"),              # above every base seed, 0.52 of the gain
    ([0.60, 0.65, 0.66], UP, SPT, BASE, "no gain"),                        # 0.60 is inside base's range
    ([0.52, 0.51, 0.53], STUCK, SPT, BASE, "no gain"),
    ([0.49, 0.48, 0.50], STUCK, SPT, BASE, "worse"),
    ([0.70, 0.69, 0.72], UP, [0.60, 0.70, 0.75], BASE, "no gain to recover"),   # spt itself overlaps base
    ([0.70, 0.69], UP[:2], SPT, BASE, "too few seeds (3 per arm needed)"),
])
def test_rescue_gain_verdict_names_how_much_of_spts_gain_an_arm_keeps(arm, arm_off, spt, base, expected):
    assert rescue.gain_verdict(arm, arm_off, spt, UP, base) == expected


@pytest.mark.parametrize("frozen,expected", [
    ([0.52, 0.51, 0.60], "changes little"),       # overlaps, means 0.010 apart
    ([0.51, 0.62, 0.75], "not separated"),        # overlaps, means 0.074 apart
    ([0.49, 0.50, 0.50], "frozen worse"),
    ([0.70, 0.66, 0.64], "frozen better"),
    ([0.5, 0.5], "too few seeds (3 per arm needed)"),
])
def test_rescue_frozen_verdict_asks_whether_freezing_the_attention_changes_training(frozen, expected):
    assert rescue.frozen_verdict(frozen, BASE) == expected


# tools/rates.py: the take-off rate rule, checked on made-up counts (exact values by hand)
from tools import rates  # noqa: E402


@pytest.mark.parametrize("k,n,lo,hi", [
    (0, 3, 0.0, 1 - 0.025 ** (1 / 3)),          # k = 0: hi solves (1 - hi)^3 = 0.025
    (3, 3, 0.025 ** (1 / 3), 1.0),              # k = n: lo solves lo^3 = 0.025
    (1, 3, 0.00840, 0.90570),                   # the published table's values
    (5, 10, 0.18709, 0.81291),                  # symmetric at k = n / 2
])
def test_rate_interval_is_the_exact_clopper_pearson_one(k, n, lo, hi):
    got = rates.clopper_pearson(k, n)
    assert got == pytest.approx((lo, hi), abs=1e-4)
    assert rates.binomial_cdf(k, n, got[1]) == pytest.approx(0.025, abs=1e-6) if k < n else got[1] == 1.0


@pytest.mark.parametrize("counts,p", [
    ((3, 3, 1, 3), 4 / 20),                     # the case: qk 3/3 against scratch 1/3
    ((3, 3, 0, 3), 1 / 20),                     # the best three seeds can do: not under 0.05
    ((6, 6, 2, 6), 28 / 924),                   # C(8,6) C(4,0) / C(12,6)
    ((1, 3, 3, 3), 1.0),                        # fewer: every table at least as extreme
])
def test_rate_fisher_test_is_the_hypergeometric_tail(counts, p):
    assert rates.fisher_greater(*counts) == pytest.approx(p)


@pytest.mark.parametrize("counts,expected", [
    ((6, 6, 2, 6), "takes off more often"),     # p = 0.030
    ((3, 3, 1, 3), "not separated"),            # p = 0.2: three seeds cannot tell
    ((3, 3, 0, 3), "not separated"),            # p = 0.05 is not under 0.05
    ((0, 6, 5, 6), "takes off less often"),
    ((4, 6, 4, 6), "not separated"),
    ((2, 2, 0, 6), "too few seeds (3 per arm needed)"),
])
def test_rate_verdict_names_the_outcome_of_the_fisher_test(counts, expected):
    assert rates.rate_verdict(*counts) == expected


def test_rate_median_take_off_counts_a_stuck_seed_as_censored_at_the_last_epoch():
    assert rates.km_median([5, 1, 3], 16) == 3
    assert rates.km_median([1, 3, None], 16) == 3             # 2 of 3 off by epoch 3: S = 1/3
    assert rates.km_median([None, 7, None], 27) is None       # S never reaches 1/2: past the last epoch
    assert rates.km_median([2, None, None, 9], 16) == 9        # S(2) = 3/4, S(9) = 3/4 * 1/2
    assert rates.km_median([None] * 3, 16) is None


def test_rate_logrank_says_which_arm_takes_off_earlier():
    z, p = rates.logrank([1, 1, 2], 16, [None, 7, None], 27)
    assert z > 2 and p < 0.05                                  # early and all against late and rare
    z2, p2 = rates.logrank([None, 7, None], 27, [1, 1, 2], 16)
    assert z2 == pytest.approx(-z) and p2 == pytest.approx(1 - p)
    assert rates.logrank([None] * 3, 16, [None] * 3, 27) == (0.0, 0.5)


def test_rate_table_applies_the_rule_against_recorded_scratch_only():
    runs = {arm: [(s, "-", dict(test_acc=a)) for s, a in enumerate(accs)]
            for arm, accs in (("spt", [0.72, 0.70, 0.74, 0.71, 0.73, 0.69]), ("scratch", [0.5, 0.6, 0.5, 0.5, 0.62, 0.5]))}
    offs = {"spt": [1, 2, 1, 3, 1, 1], "scratch": [None, 7, None, None, 12, None]}
    text = rescue.rate_table(runs, offs)
    spt = next(line for line in text.splitlines() if line.startswith("| spt |"))
    assert "6 of 6" in spt and "0.54-1.00" in spt and "| 1 |" in spt and "**takes off more often**" in spt
    scratch = next(line for line in text.splitlines() if line.startswith("| scratch |"))
    assert "2 of 6" in scratch and "> 27 (not reached)" in scratch and "0.610 ± 0.014" in scratch


def evals(pairs, se=0.003):
    return [dict(epoch=e + 1, val_loss=loss, val_loss_se=se, val_acc=acc) for e, (loss, acc) in enumerate(pairs)]


def test_rescue_take_off_is_the_first_of_two_evaluations_off_chance():
    share, n = 0.517, 1000                                  # the best constant answer: H(0.517) = 0.6926
    assert rescue.constant_loss(0.5) == pytest.approx(math.log(2)) and rescue.constant_loss(share) < math.log(2)
    at_chance = [(0.6934, 0.517), (0.6929, 0.483)] * 4      # one class each epoch: stuck
    assert rescue.take_off_epoch(evals(at_chance), share, n) is None
    assert rescue.take_off_epoch(evals(at_chance + [(0.6825, 0.554), (0.67, 0.58)]), share, n) == 9
    assert rescue.take_off_epoch(evals(at_chance + [(0.6825, 0.554)]), share, n) is None      # not confirmed
    blip = at_chance + [(0.6925, 0.57), (0.6931, 0.517), (0.6925, 0.57), (0.6926, 0.56)]      # acc: band 0.549
    assert rescue.take_off_epoch(evals(blip), share, n) == 11
    loss_only = at_chance + [(0.684, 0.53), (0.683, 0.54)]  # 2 s.e. below 0.6926, accuracy inside the band
    assert rescue.take_off_epoch(evals(loss_only), share, n) == 9
    assert rescue.take_off_epoch(evals(loss_only, se=0.01), share, n) is None                 # within the noise
    assert rescue.standard_error(0.5, 1000) == pytest.approx(0.0158, abs=1e-4)


def dry_run(capsys, *flags):
    rescue.main(["--action=run", "--dry=True", "--out=/o", "--results=/r", *flags])
    return capsys.readouterr().out.strip().splitlines()


def test_rescue_lists_each_arm_on_every_seed_after_the_spt_runs_it_starts_from(capsys):
    runs = dry_run(capsys)
    names = [r.split("--out_dir=/o/")[1] for r in runs]
    assert names[:6] == ["spt_pretrain_s0", "spt_pretrain_s1", "spt_pretrain_s2", "spt_s0", "spt_s1", "spt_s2"]
    assert [n[:-3] for n in names[6::3]] == ["qk", "mlp", "short1", "short5", "cross_pretrain", "cross", "frozen",
                                            "attn"]
    assert all("--task=pathfinder --preset=cpu_rescue" in r for r in runs) and len(runs) == 10 * 3
    spt_epochs, epochs = rescue.preset_epochs()
    assert (spt_epochs, epochs) == (11, 16)                 # 2,750 SPT steps + 4,000 labelled ones at batch 32
    by = dict(zip(names, runs))
    assert "--epochs=0 --seed=1 " in by["spt_pretrain_s1"] and "--pretrain_task=photos --epochs=0" in by["cross_pretrain_s0"]
    assert "--init_from=/r/spt_pretrain_s2/spt_best.pt --init_params=qk --seed=2 " in by["qk_s2"]
    assert "--init_from=/r/spt_pretrain_s0/spt_best.pt --init_params=mlp " in by["mlp_s0"]
    assert "--init_from=/r/spt_pretrain_s1/spt_epoch5.pt --init_params=all " in by["short5_s1"]
    assert "--init_from=/r/cross_pretrain_s0/spt_best.pt --init_params=all " in by["cross_s0"]
    assert "--pretrain_epochs=0 --epochs=27 --freeze=attn " in by["frozen_s2"]            # compute-matched
    needs = {(n, s): k for n, s, k in rescue.jobs(dict(seeds="0,1,2", arms=rescue.DEFAULTS["arms"]))}
    assert needs["spt_pretrain", 0] == [] and needs["spt", 1] == [("spt_pretrain", 1)]    # spt is not gated
    assert needs["qk", 2] == [("spt_pretrain", 2), ("spt", 0)] and needs["frozen", 0] == [("spt", 0)]
    old = dry_run(capsys, "--arms=scratch,learned,spt_torch,scratch_torch", "--seeds=0")
    assert "--pretrain_epochs=0 --epochs=27 --pos_enc=learned " in old[1]
    assert "--init=torch --epochs=0 --seed=0 --out_dir=/o/torch_pretrain_s0" in old[2]
    with pytest.raises(ValueError, match="unknown arm 'qkv'"):
        dry_run(capsys, "--arms=spt,qkv")


@pytest.mark.parametrize("seeds", ["a,b", "0,,1", "0,0", "-1", "1.5"])
def test_rescue_refuses_bad_seeds_in_one_line_before_any_work(tmp_path, seeds):
    with pytest.raises(ValueError, match=f"--seeds={re.escape(seeds)}: give distinct whole numbers"):
        rescue.main(["--action=run", f"--seeds={seeds}", f"--out={tmp_path / 'o'}", f"--results={tmp_path / 'r'}"])
    assert not (tmp_path / "o").exists() and not (tmp_path / "r").exists()
    assert rescue.seeds_of({"seeds": " 3, 0"}) == [3, 0]


def test_rescue_preset_is_the_probed_depth_2_setting():
    cfg = rescue.train_spt_config()
    assert {k: cfg[k] for k in ("depth", "n_embd", "n_head", "batch_size", "difficulty", "n_generate", "init",
                                "pixel_encoder", "pos_enc", "pool", "mask_ratio", "pretrain_lr", "lr", "dtype",
                                "schedule", "pretrain_schedule", "warmup_frac")} == dict(
        depth=2, n_embd=64, n_head=4, batch_size=32, difficulty="baseline", n_generate=10_000, init="amos",
        pixel_encoder="linear", pos_enc="sinusoidal", pool="mean", mask_ratio=0.5, pretrain_lr=3e-3, lr=1e-3,
        dtype="float32", schedule="constant", pretrain_schedule="constant", warmup_frac=0.05)


def fake_record(d, test_acc=None, accs=(0.517, 0.483), init_from="", spt=False):
    """A record as keep_record leaves it, its config the sweep's for the run its folder names
    (<run>_s<seed>), val.json beside the log. spt: an SPT-alone record (3 SPT epochs, best 3,
    the checkpoints the arms start from, empty); else a finetuning one (init_from: its start)."""
    import json
    d.mkdir(parents=True)
    name, seed = d.name.rsplit("_s", 1)
    cfg = rescue.expected_config(rescue.run_flags(name, int(seed), str(d.parent)))
    (d / "config.json").write_text(json.dumps(dict(cfg, init_from=init_from)))
    for ckpt in ("spt_best.pt", "spt_epoch1.pt", "spt_epoch5.pt") if spt else ():
        torch.save(dict(model={}), d / ckpt)
    (d / "val.json").write_text(json.dumps(dict(n=100, share=0.5)))
    if spt:
        records = [dict(phase="spt", step=10 * k, epoch=0, loss=1.4 - k / 100) for k in range(1, 30)]
        records += [dict(phase="spt", step=100 * e, epoch=e, val_loss=1.3 - e / 10, val_acc=0.1) for e in (1, 2, 3)]
        summary = dict(spt_best_val_loss=1.0, spt_best_epoch=3, steps=0, wall_time_s=1800.0)
    else:
        records = [dict(phase="finetune", step=10 * k, epoch=0, loss=0.7) for k in range(1, 30)]
        records += [dict(phase="finetune", step=300 * (e + 1), epoch=e + 1, val_loss=0.69, val_loss_se=0.002,
                         val_acc=a) for e, a in enumerate(accs)]
        summary = dict(test_acc=test_acc, best_val_acc=max(accs), steps=300 * len(accs), wall_time_s=3600.0)
    (d / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (d / "summary.json").write_text(json.dumps(summary))


def fake_sweep(results, arms=(("spt", (0.66, 0.63, 0.70)), ("qk", (0.66, 0.64, 0.70)), ("mlp", (0.51, 0.50, 0.52)))):
    """SPT-alone records of seeds 0-2, arms finetuned from them, take two's scratch seeds."""
    import json
    import shutil
    for s in range(3):
        fake_record(results / f"spt_pretrain_s{s}", spt=True)
        for arm, accs in arms:
            up = (0.5, 0.7, 0.75) if accs[s] > 0.6 else (0.517, 0.483)
            fake_record(results / f"{arm}_s{s}", accs[s], accs=up,
                        init_from=str(results / f"spt_pretrain_s{s}" / "spt_best.pt"))
    shutil.copy(os.path.join(rescue.ROOT, "results", "rescue", "take_two.json"), results)
    return json.loads((results / "take_two.json").read_text())


def test_rescue_report_builds_the_tables_and_verdicts_from_the_records_alone(tmp_path):
    take_two = fake_sweep(tmp_path / "results")
    assert take_two["arms"]["scratch"]["test_acc"] == BASE          # the transcribed seeds
    out = tmp_path / "no_runs_here"                                   # no run folder at all
    text = rescue.main(["--action=report", f"--out={out}", f"--results={tmp_path / 'results'}"])
    assert "| spt | 3 | 1.000 ± 0.000 | - / - |" in text and "| 0.663 ± 0.035 |" in text   # SPT at epoch 3
    assert "0.660 ± 0.047 (2)" in text and "| 300 + 900 |" in text                        # 100 val images
    assert "| mlp | 3 |" in text and "0.510 ± 0.050 (stuck)" in text
    assert "| spt_pretrain_s1 | 1.200, 1.100, 1.000 | 1.000 (epoch 3) | - | 0.50 |" in text
    assert "scratch: take two's three seeds, transcribed" in text
    assert "SPT against from scratch, compute-matched: **SPT ahead, scratch learns too**" in text
    assert "qk against spt and scratch: **recovers the gain**" in text           # all of it
    assert "mlp against spt and scratch: **no gain**" in text and "spt: 3 of 3 seeds took off" in text
    assert (out / "rescue.md").read_text() == text and (out / "rescue_curves.png").exists()
    rescue.main(["--action=report", f"--out={out}", f"--results={tmp_path / 'results'}",
                 f"--figures={tmp_path / 'new' / 'assets'}"])
    assert (tmp_path / "new" / "assets" / "rescue_curves.png").exists()     # the figures' folder is made
    with pytest.raises(FileNotFoundError, match="no recorded arm run under"):
        rescue.main(["--action=report", f"--out={out}", f"--results={tmp_path / 'none'}"])


def test_rescue_report_rebuilds_the_rate_table_and_figure_from_recorded_scratch_alone(tmp_path):
    """With scratch recorded (here 1 of 3 seeds off chance, 2 stuck), `report` tables the
    rate rule against those records, never take two's transcription, and draws the
    take-off figure; the old verdicts read the same recorded seeds."""
    results = tmp_path / "results"
    fake_sweep(results, arms=(("spt", (0.66, 0.63, 0.70)), ("qk", (0.66, 0.64, 0.70))))
    for s, acc in enumerate((0.52, 0.66, 0.50)):
        fake_record(results / f"scratch_s{s}", acc, accs=(0.5, 0.7, 0.75) if acc > 0.6 else (0.517, 0.483))
    out = tmp_path / "out"
    text = rescue.main(["--action=report", f"--out={out}", f"--results={results}"])
    rows = {line.split(" | ")[0][2:]: line for line in text.splitlines() if line.startswith("| ") and " of 3 |" in line}
    assert "| 3 of 3 | 0.29-1.00 | 2 |" in rows["spt"] and "0.200, **not separated**" in rows["spt"]
    assert "| 1 of 3 | 0.01-0.91 | > 27 (not reached) | 0.660 (one seed) |" in rows["scratch"]   # no ± 0.000
    assert "| attn | not recorded here | - |" in text and "| frozen | not recorded here | - |" in text
    assert "| qk | not recorded here |" not in text
    assert "take two's three seeds, transcribed" not in text and "scratch: 1 of 3 seeds took off" in text
    assert (out / "rescue_take_offs.png").stat().st_size > 10_000
    assert "not read here" not in text
    fake_record(results / "scratch_s3", 0.52, accs=(0.517, 0.483))             # a seed run later
    text = rescue.main(["--action=report", f"--out={out}", f"--results={results}"])
    assert "recorded, not read here (outside --seeds=0,1,2): scratch_s3" in text and "1 of 3 |" in text
    text = rescue.main(["--action=report", "--seeds=0,1,2,3", f"--out={out}", f"--results={results}"])
    assert "not read here" not in text and "| 1 of 4 | 0.01-0.81 |" in text

def test_rescue_report_of_a_replica_without_scratch_reads_take_two_from_the_repository(tmp_path):
    """The GPU replica's results folder holds no scratch arm and no take_two.json: its
    verdicts use the repository's transcription of take two's scratch seeds."""
    fake_sweep(tmp_path / "results_gpu")
    (tmp_path / "results_gpu" / "take_two.json").unlink()
    text = rescue.main(["--action=report", f"--out={tmp_path / 'out'}", f"--results={tmp_path / 'results_gpu'}"])
    assert "scratch: take two's three seeds, transcribed" in text
    assert "qk against spt and scratch: **recovers the gain**" in text
    assert "mlp against spt and scratch: **no gain**" in text


def test_rescue_report_finds_the_source_records_in_a_checkout_at_another_path(tmp_path):
    """A record names its start by the absolute path of the machine it ran on; in a clone
    elsewhere the report finds the source beside the record, or in a sibling results folder."""
    import shutil
    results = tmp_path / "results" / "rescue"
    for s in range(3):
        fake_record(results / f"spt_pretrain_s{s}", spt=True)
        fake_record(tmp_path / "results" / "rescue_gpu" / f"cross_pretrain_s{s}", spt=True)
        fake_record(results / f"short1_s{s}", 0.7, accs=(0.5, 0.7, 0.75),
                    init_from=f"/gone/main/results/rescue/spt_pretrain_s{s}/spt_epoch1.pt")
        fake_record(results / f"cross_s{s}", 0.6, accs=(0.5, 0.7, 0.75),
                    init_from=f"/gone/main/results/rescue_gpu/cross_pretrain_s{s}/spt_best.pt")
    shutil.copy(os.path.join(rescue.ROOT, "results", "rescue", "take_two.json"), results)
    text = rescue.main(["--action=report", f"--out={tmp_path / 'out'}", f"--results={results}"])
    assert "| short1 | 3 | 1.200 ± 0.000 |" in text and "| 100 + 900 |" in text  # SPT's epoch 1, beside it
    assert "| cross | 3 | 1.000 ± 0.000 |" in text and "| 300 + 900 |" in text   # the best, in rescue_gpu


def test_rescue_report_reads_its_own_copy_of_a_source_another_checkout_still_has(tmp_path):
    """On a machine with two checkouts, a record's absolute init_from may name the other
    one's results, which can differ (here its SPT's best epoch is 1): the report reads its own."""
    import json
    import shutil
    own, other = tmp_path / "clone" / "results" / "rescue", tmp_path / "main" / "results" / "rescue"
    for s in range(3):
        fake_record(own / f"spt_pretrain_s{s}", spt=True)                        # best: epoch 3, 1.000
        fake_record(other / f"spt_pretrain_s{s}", spt=True)
        summary = other / f"spt_pretrain_s{s}" / "summary.json"
        summary.write_text(json.dumps(dict(json.loads(summary.read_text()), spt_best_epoch=1)))   # 1.200
        fake_record(own / f"spt_s{s}", 0.7, accs=(0.5, 0.7, 0.75),
                    init_from=str(other / f"spt_pretrain_s{s}" / "spt_best.pt"))
    shutil.copy(os.path.join(rescue.ROOT, "results", "rescue", "take_two.json"), own)
    text = rescue.main(["--action=report", f"--out={tmp_path / 'out'}", f"--results={own}"])
    assert "| spt | 3 | 1.000 ± 0.000 |" in text and "| 300 + 900 |" in text


def test_rescue_keeps_a_finished_runs_record_whole_and_never_overwrites_one(tmp_path):
    import json
    run = tmp_path / "out" / "spt_pretrain_s0"
    fake_record(run, spt=True)
    for name in ("spt_best.pt", "spt_epoch1.pt", "spt_epoch5.pt", "ckpt.pt", "curves.png"):
        (run / name).write_bytes(b"weights")
    (tmp_path / "out" / "qk_s0").mkdir()                              # running: no summary, not recorded
    cfg = dict(rescue.DEFAULTS, out=str(tmp_path / "out"), results=str(tmp_path / "results"), seeds="0")
    assert rescue.record_finished(cfg) == [str(tmp_path / "results" / "spt_pretrain_s0")]
    kept = {p.name for p in (tmp_path / "results" / "spt_pretrain_s0").iterdir()}
    assert kept == {"summary.json", "log.jsonl", "config.json", "val.json", "spt_best.pt", "spt_epoch1.pt",
                    "spt_epoch5.pt"}                                  # no resume point, no figure
    assert json.loads((tmp_path / "results" / "spt_pretrain_s0" / "val.json").read_text()) == dict(n=100, share=0.5)
    assert rescue.record_finished(cfg) == [] and rescue.recorded(cfg, "spt_pretrain", 0)
    assert not (tmp_path / "results" / "qk_s0").exists()
    with pytest.raises(FileExistsError, match="never overwritten"):
        rescue.keep_record(str(run), str(tmp_path / "results" / "spt_pretrain_s0"))


def test_rescue_status_tells_recorded_running_stopped_and_waiting_runs(tmp_path):
    import json
    import subprocess
    import sys
    results, out = tmp_path / "results", tmp_path / "out"
    fake_record(results / "spt_pretrain_s0", spt=True)
    fake_record(results / "spt_s0", 0.66, accs=(0.5, 0.7, 0.75), init_from=str(results / "spt_pretrain_s0/spt_best.pt"))
    for name in ("spt_pretrain_s1", "spt_pretrain_s2"):              # two runs part way: 3 SPT epochs done
        (out / name).mkdir(parents=True)
        (out / name / "config.json").write_text((results / "spt_s0" / "config.json").read_text())
        (out / name / "log.jsonl").write_text(json.dumps(dict(phase="spt", step=760, epoch=3, loss=1.0)) + "\n")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (out / "spt_pretrain_s2" / "run.lock").write_text(dead.stdout)          # a pid that has ended
    alive = subprocess.Popen([sys.executable, "-c", "import time; print(1, flush=True); time.sleep(60)", "train_spt.py",
                              f"--out_dir={out / 'spt_pretrain_s1'}"], stdout=subprocess.PIPE)
    try:
        alive.stdout.readline()                                 # started: its argv is in /proc
        (out / "spt_pretrain_s1" / "run.lock").write_text(str(alive.pid))
        text = rescue.main(["--action=status", f"--out={out}", f"--results={results}"])
    finally:
        alive.kill()
    lines = {line.split()[0]: line for line in text.splitlines()}
    assert "recorded: SPT val loss 1.000, 0.50 h" in lines["spt_pretrain_s0"]
    assert "recorded: test acc 0.660, 1.00 h" in lines["spt_s0"]
    assert "running: spt step 760, 3 of 11 epochs done" in lines["spt_pretrain_s1"]
    assert "stopped (resumes from ckpt.pt): spt step 760" in lines["spt_pretrain_s2"]
    assert lines["spt_s1"].split()[1] == "waiting" and "gate: open, spt_s0 took off" in text
    assert "core-hours used (recorded runs, and the others to their last checkpoint): 1.5 of" in text
    # left: 2 x 11 - 2 x 3 SPT epochs, 20 finetuning runs x 16, frozen 3 x 27, cross_pretrain 3 x 11
    assert "left: 450 epochs" in text


def test_rescue_budget_counts_the_hours_a_stopped_run_spent_before_its_stop(tmp_path, capsys):
    import torch
    results, out = tmp_path / "results", tmp_path / "out"
    fake_record(results / "spt_pretrain_s0", spt=True)                       # 0.5 h
    (out / "spt_pretrain_s1").mkdir(parents=True)
    torch.save(dict(model={}, wall_time=7200.0), out / "spt_pretrain_s1" / "ckpt.pt")   # stopped after 2 h
    (out / "spt_pretrain_s2").mkdir()
    (out / "spt_pretrain_s2" / "ckpt.pt").write_bytes(b"PK\x03\x04 cut short")          # damaged: counts 0
    cfg = dict(rescue.DEFAULTS, out=str(out), results=str(results))
    assert rescue.core_hours(cfg, "spt_pretrain", 1) == 2.0 and rescue.core_hours(cfg, "spt_pretrain", 2) == 0.0
    rescue.main(["--action=run", f"--out={out}", f"--results={results}", "--max_core_hours=2.5"])   # 2.5 h used
    printed = capsys.readouterr().out
    assert "start:" not in printed and "the budget of 2.5 core-hours is spent" in printed
    first = printed.splitlines()[0]                 # the cost, said first: 483 epochs in all, 11 recorded
    assert first.startswith("This sweep has 472 epochs left: about 0 core-hours") and "Shorter: --seeds=0" in first


def test_rescue_holds_the_ablation_arms_when_the_first_spt_seed_stays_stuck(tmp_path, capsys):
    results = tmp_path / "results"
    for s in range(3):
        fake_record(results / f"spt_pretrain_s{s}", spt=True)
        fake_record(results / f"spt_s{s}", 0.517, init_from=str(results / f"spt_pretrain_s{s}/spt_best.pt"))
    rescue.main(["--action=run", f"--out={tmp_path / 'out'}", f"--results={results}", "--arms=spt,qk"])
    printed = capsys.readouterr().out
    assert "start:" not in printed and "never took off" in printed and "3 runs not recorded" in printed


@pytest.mark.slow
def test_rescue_gpu_script_stops_at_its_limit_then_resumes_and_hands_back_its_files(tmp_path):
    """tools/lra_rescue_gpu.sh on the CPU with tiny runs: a first call cut at 12 s stops
    its runs with SIGTERM (each saves its resume point); the second finishes them and
    leaves the table, the figures and the records in $OUT."""
    import os
    import shutil
    import subprocess
    repo = tmp_path / "repo"
    shutil.copytree(rescue.ROOT, repo, ignore=shutil.ignore_patterns("out*", "data", ".git", "__pycache__",
                                                                   "rescue_gpu"))    # its records: none yet
    extra = (f"--n_generate=600 --data_dir={tmp_path / 'data'} --n_embd=16 --n_head=2 --batch_size=8 "
             "--log_every=1")
    out = tmp_path / "back"
    out.mkdir()
    env = dict(os.environ, EXTRA=extra, EXTRA_SPT="--pretrain_epochs=1", OUT=str(out), ARMS="spt,qk", SEEDS="0")
    call = lambda limit: subprocess.run(["bash", "tools/lra_rescue_gpu.sh", str(limit)], cwd=repo, env=env,
                                        capture_output=True, text=True, timeout=600).stdout
    assert "run this script again on this machine to resume" in call(12)
    assert "terminated; the last good checkpoint" in (repo / "out/rescue_gpu/spt_pretrain_s0.log").read_text()
    second = call(400)
    assert "done: out/rescue_gpu/spt_pretrain_s0" in second and "spt_pretrain_s0" in second
    assert {"rescue.md", "rescue_curves.png", "records.tar.gz", "status.txt"} <= {p.name for p in out.iterdir()}


@pytest.mark.slow
def test_rescue_gpu_probe_counts_the_steps_of_runs_at_once_and_names_the_best_count(tmp_path):
    """tools/lra_rescue_gpu.sh probe on the CPU with tiny runs, 1 then 2 at once: a row a
    count with the steps all runs made in the timed window, and the count to adopt."""
    import os
    import re
    import shutil
    import subprocess
    repo = tmp_path / "repo"
    shutil.copytree(rescue.ROOT, repo, ignore=shutil.ignore_patterns("out*", "data", ".git", "__pycache__"))
    out = tmp_path / "back"
    out.mkdir()
    extra = f"--n_generate=600 --data_dir={tmp_path / 'data'} --n_embd=16 --n_head=2 --batch_size=8 --log_every=1"
    env = dict(os.environ, EXTRA=extra, OUT=str(out), COUNTS="1 2", WARM="4")
    done = subprocess.run(["bash", "tools/lra_rescue_gpu.sh", "probe", "10"], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=300)
    rows = re.findall(r"^\| (\d+) \| ([\d.]+) \| ([\d.]+) \|$", (out / "probe.md").read_text(), re.M)
    assert [r[0] for r in rows] == ["1", "2"] and all(float(r[1]) > 0 for r in rows), done.stdout + done.stderr
    best = max(rows, key=lambda r: float(r[1]))[0]
    assert f"the most runs an hour: {best} at once (SLOTS={best})" in done.stdout
    assert not list((repo / "out" / "rescue_gpu" / "probe").glob("r*/summary.json"))   # stopped, not finished


@pytest.mark.slow
def test_rescue_runs_small_records_each_run_then_reports_from_the_records(tmp_path, capsys):
    tiny = (f"--n_generate=200 --data_dir={tmp_path / 'data'} --n_train=16 --n_eval=16 --n_embd=16 --n_head=2 "
            "--batch_size=8 --log_every=1 --dtype=float32")          # finetuning: 16 epochs of 2 steps
    args = ["--action=run", f"--out={tmp_path / 'out'}", f"--results={tmp_path / 'results'}", "--seeds=0",
            "--arms=spt,short1", f"--extra={tiny}", "--extra_spt=--pretrain_epochs=2"]
    rescue.main(args)
    printed = capsys.readouterr().out
    assert printed.count("recorded: ") == 2 and "FAILED" not in printed and "never took off" in printed
    kept = {p.name for p in (tmp_path / "results" / "spt_pretrain_s0").iterdir()}
    assert {"spt_best.pt", "spt_epoch1.pt", "command.txt", "log.jsonl", "summary.json"} <= kept
    import shutil
    shutil.rmtree(tmp_path / "out")                                           # the runs' folders are gone
    text = rescue.main(["--action=report", f"--out={tmp_path / 'report'}", f"--results={tmp_path / 'results'}",
                        "--seeds=0", f"--extra={tiny}", "--extra_spt=--pretrain_epochs=2"])   # the sweep's own flags
    assert "| spt | 1 |" in text and "spt: 0 of 1 seeds took off" in text
    assert (tmp_path / "report" / "rescue_attention_2d.png").exists()
    rescue.main(args)
    assert "start:" not in capsys.readouterr().out                        # nothing run again


@pytest.mark.slow
def test_flt_ladder_gpu_script_runs_at_a_tiny_size_on_a_cpu(tmp_path):
    """tools/flt_ladder_gpu.sh's CPU smoke test (about a minute): the reference and the
    five variants at one K are recorded, the table is drawn from the records, the main
    command's minute gives a rate and the full run's time, and the device folder gets
    the logs and the records."""
    import subprocess
    text = tmp_path / "tiny.txt"
    text.write_text(" ".join(["loop", "the", "norm", "key", "value"] * 600))
    (tmp_path / "device").mkdir()
    env = dict(os.environ, RUNS=str(tmp_path / "runs"), RESULTS=str(tmp_path / "results"), KS="2", SEEDS="1", PAR="2",
               EXTRA=f"--data={text} --n_layer=1 --n_embd=16 --n_head=2 --block_size=16 --batch_size=4 --max_steps=6 "
                     "--eval_interval=3 --eval_batches=1 --test_loops=2 --osc_steps=4",
               MAIN_FLAGS="--difficulty=baseline --n_generate=200 --n_train=32 --n_eval=16 --n_embd=16 --n_head=2 "
                          "--batch_size=8 --compile=False", MAIN_SECONDS="30", OUT=str(tmp_path / "device"))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.run(["bash", "tools/flt_ladder_gpu.sh", "120"], cwd=root, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0 and "ladder: 6 records" in p.stdout, p.stdout + p.stderr
    assert sorted(d.name for d in (tmp_path / "results").iterdir()) == sorted(
        ["w_ref_K1_s1"] + [f"w_{v}_K2_s1" for v in ("LT_ia", "FLT", "LT_i", "FLT_res", "LT")])
    assert "steps a second; the full run's" in p.stdout and "h at that rate" in p.stdout
    assert {"ladder.log", "main_command.txt", "compare.md", "records.tar.gz"} <= {f.name for f in (tmp_path / "device").iterdir()}


def test_flt_speed_times_the_variants_side_by_side_and_checks_their_losses(tmp_path, capsys):
    """tools/flt_speed.py at a tiny size: every variant gets a time, a ratio to today's
    step and a loss check, and the profiler's split of today's step adds up."""
    import json
    from tools import flt_speed
    text = tmp_path / "tiny.txt"
    text.write_text(" ".join(["loop", "the", "norm", "key", "value"] * 600))
    flt_speed.main([f"--data={text}", "--steps=7", "--rounds=1", "--compile=False", "--loops=2", f"--out={tmp_path}",
                    "--extra=--n_layer=1 --n_embd=16 --n_head=2 --block_size=16 --batch_size=4"])
    shown = capsys.readouterr().out
    result = json.loads((tmp_path / "flt_speed.json").read_text())
    assert set(result["rows"]) == {"today", "hooks/10", "no hooks"} and result["rows"]["today"]["ratio"] == 1.0
    assert all(r["max_loss_diff"] < 5e-4 for r in result["rows"].values()) and "agree to 3 decimals" in shown
    assert all(v > 0 for v in list(result["profile"].values())[:2]) and "the hooks (today - no hooks)" in shown


@pytest.mark.slow
def test_rescue_never_starts_a_run_going_elsewhere_and_gives_it_a_slot(tmp_path, capsys, monkeypatch):
    """A driver stopped earlier can leave its runs going: a new driver counts each as a
    slot taken, starts nothing in its place, and starts (resumes) it only once it has
    stopped without a summary."""
    tiny = (f"--n_generate=200 --data_dir={tmp_path / 'data'} --n_train=16 --n_eval=16 --n_embd=16 --n_head=2 "
            "--batch_size=8 --log_every=1 --dtype=float32 --epochs=1")
    checks = []

    def live(d):                                   # spt_pretrain_s0 "runs elsewhere" for its first 3 checks
        checks.append(d)
        return d.endswith("spt_pretrain_s0") and len([c for c in checks if c.endswith("spt_pretrain_s0")]) <= 3
    monkeypatch.setattr(rescue, "live", live)
    monkeypatch.setattr(rescue.time, "sleep", lambda s: None)
    rescue.main(["--action=run", f"--out={tmp_path / 'out'}", f"--results={tmp_path / 'results'}", "--seeds=0",
                 "--arms=spt,scratch", "--slots=1", f"--extra={tiny}", "--extra_spt=--pretrain_epochs=1"])
    printed = capsys.readouterr().out.splitlines()
    elsewhere = [i for i, line in enumerate(printed) if line.startswith("running elsewhere, not started again")]
    starts = [i for i, line in enumerate(printed) if line.startswith("start: ")]
    assert len(elsewhere) == 1 and starts and elsewhere[0] < starts[0], printed    # nothing started in its slot
    assert printed[starts[0]].endswith("spt_pretrain_s0") or "scratch_s0" in printed[starts[0]], printed


def test_a_stop_signal_to_the_driver_stops_its_runs_with_their_resume_points():
    class Child:
        def __init__(self):
            self.sent, self.waited = [], False

        def send_signal(self, signum):
            self.sent.append(signum)

        def wait(self):
            self.waited = True
    going = {("spt", 0): Child(), ("qk", 0): Child()}
    with pytest.raises(SystemExit) as stopped:
        rescue.stop_runs(going, rescue.signal.SIGTERM)
    assert stopped.value.code == 128 + rescue.signal.SIGTERM
    assert all(c.sent == [rescue.signal.SIGTERM] and c.waited for c in going.values())


# The driver's guarantees (lra_rescue's docstring): records whole and its own, no run twice or
# orphaned, one line before any work; `commands` and `one` for a cluster.

class FakeRun:
    """A train_spt.py child that 'trains' at once: it writes the run's files as a finished run
    leaves them (config.json of its flags, log, summary, val.json, SPT checkpoints). Each
    instance notes its command line in FakeRun.started."""
    started = []

    def __init__(self, argv, **kwargs):
        import json
        FakeRun.started.append(argv)
        flags = [a for a in argv[2:] if not a.startswith(("--out_dir=", "--overwrite="))]
        out = pathlib.Path(next(a for a in argv if a.startswith("--out_dir="))[len("--out_dir="):])
        out.mkdir(parents=True, exist_ok=True)
        source = "--epochs=0" in flags
        config = rescue.train_spt_config(flags)
        (out / "config.json").write_text(json.dumps(config))
        (out / "val.json").write_text(json.dumps(dict(n=100, share=0.5)))
        phase = "spt" if source else "finetune"
        evals = [dict(phase=phase, step=10 * e, epoch=e, val_loss=0.5, val_loss_se=0.01, val_acc=0.9) for e in (1, 2)]
        (out / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
        for ckpt in ("spt_best.pt", "spt_epoch1.pt", "spt_epoch5.pt") if source else ():
            torch.save(dict(model={}, config=config), out / ckpt)
        summary = dict(spt_best_val_loss=0.5, spt_best_epoch=2, steps=20, wall_time_s=60.0) if source else \
            dict(test_acc=0.9, best_val_acc=0.9, steps=20, wall_time_s=60.0)
        (out / "summary.json").write_text(json.dumps(summary))
        self.returncode = 0

    def poll(self):
        return 0

    def wait(self):
        return 0


@pytest.fixture
def fake_runs(monkeypatch):
    FakeRun.started = []
    monkeypatch.setattr(rescue.subprocess, "Popen", FakeRun)
    monkeypatch.setattr(rescue.time, "sleep", lambda s: None)
    return FakeRun.started


def sweep_args(where, *more):
    return [f"--out={where / 'out'}", f"--results={where / 'results'}", "--seeds=0,1", *more]


def test_commands_prints_exactly_the_runs_run_starts_wave_by_wave(tmp_path, fake_runs, capsys):
    """The same runs, with the same train_spt.py flags, whether the local driver starts them
    or a cluster runs the `one` lines of `commands`, wave by wave; a line whose needs are not
    recorded yet is refused, and a recorded one is passed over."""
    import shlex
    rescue.main(["--action=run", *sweep_args(tmp_path / "local")])
    by_driver = sorted(" ".join(a) for a in fake_runs)
    fake_runs.clear()
    capsys.readouterr()
    lines = rescue.main(["--action=commands", *sweep_args(tmp_path / "cluster")])
    waves = rescue.waves(dict(rescue.DEFAULTS, seeds="0,1"))
    assert all(line.startswith(f"cd {shlex.quote(rescue.ROOT)} && python tools/lra_rescue.py one ") for line in lines)
    lines = [line.split(" && ", 1)[1] for line in lines]           # a job starts in any folder: each line cds first
    run_of = lambda line: shlex.split(line)[3][len("--run="):].rsplit("_s", 1)
    wave_of = {line: waves[run_of(line)[0], int(run_of(line)[1])] for line in lines}
    assert [wave_of[line] for line in lines] == sorted(wave_of.values()) and set(wave_of.values()) == {1, 2, 3}
    one = lambda line: rescue.main(["--action=one"] + shlex.split(line)[3:])
    with pytest.raises(FileNotFoundError, match="which is not recorded yet: run the lines of wave 1 first"):
        one(next(line for line in lines if wave_of[line] == 2))
    for line in lines:
        one(line)
    by_lines = sorted(" ".join(a).replace("cluster", "local") for a in fake_runs)
    assert by_lines == by_driver and len(by_driver) == len(lines) == 2 * 10
    one(lines[0])
    assert "recorded already" in capsys.readouterr().out and len(fake_runs) == 20
    assert rescue.main(["--action=commands", *sweep_args(tmp_path / "cluster")]) == []


@pytest.mark.parametrize("damage, record, words", [
    (lambda r: os.remove(r / "qk_s1" / "summary.json"), "qk_s1", "has no summary.json (a copy cut short, or edited)"),
    (lambda r: (r / "qk_s1" / "summary.json").write_text('{"test_acc": 0.6'), "qk_s1", "summary.json is not JSON"),
    (lambda r: (r / "spt_pretrain_s1" / "spt_best.pt").write_bytes(b"PK\x03\x04" + b"\0" * 60), "spt_pretrain_s1",
     "spt_best.pt is truncated or damaged"),
    (lambda r: (r / "qk_s1" / "summary.json").write_text('{"test_acc": NaN, "best_val_acc": 0.9, "steps": 20, '
                                                         '"wall_time_s": 60}'), "qk_s1", "holds no finite test_acc"),
    (lambda r: (r / "qk_s1" / "config.json").write_text((r / "qk_s1" / "config.json").read_text().replace(
        '"cpu_rescue"', '"cpu"')), "qk_s1",
     "was made with --preset=cpu, where this sweep's qk run has --preset=cpu_rescue"),
    (lambda r: (r / "qk_s1" / "config.json").write_text((r / "qk_s1" / "config.json").read_text().replace(
        '"qk"', '"all"')), "qk_s1", "was made with --init_params=all, where this sweep's qk run has --init_params=qk"),
    (lambda r: shutil.rmtree(r / "spt_pretrain_s1"), "qk_s1", "spt_pretrain_s1, which is not recorded here"),
])
def test_a_record_that_is_not_whole_or_not_the_sweeps_is_named_before_any_work(tmp_path, fake_runs, damage, record,
                                                                               words):
    """A half-copied, damaged, NaN or foreign record (another preset, another arm's flags), or
    a record whose start is gone: report, run, one and commands refuse in one line naming it,
    before anything is tabled or started."""
    rescue.main(["--action=run", *sweep_args(tmp_path, "--arms=spt,qk")])
    fake_runs.clear()
    damage(tmp_path / "results")
    (tmp_path / "results" / "spt_s1").rename(tmp_path / "results" / "spt_s1.partial")   # never read, nor refused
    for action in ("report", "run", "one --run=spt_s1", "commands"):
        with pytest.raises(ValueError, match=record) as e:
            rescue.main([f"--action={action.split()[0]}", *action.split()[1:], *sweep_args(tmp_path, "--arms=spt,qk")])
        assert words in str(e.value) and "Nothing was done" in str(e.value)
    assert fake_runs == [] and not (tmp_path / "out" / "rescue.md").exists()


def test_a_second_driver_and_a_results_folder_that_cannot_be_written_are_refused_first(tmp_path, fake_runs):
    held = rescue.lock_file(str(tmp_path / "results" / ".driver.lock"))          # a driver at work
    with pytest.raises(FileExistsError, match=rf"another lra_rescue.py run \(pid {os.getpid()}\) drives"):
        rescue.main(["--action=run", *sweep_args(tmp_path)])
    held.close()
    claim = rescue.claim(dict(rescue.DEFAULTS, results=str(tmp_path / "results")), "spt_pretrain", 0)
    with pytest.raises(FileExistsError, match="spt_pretrain_s0 is being run by another process"):
        rescue.main(["--action=one", "--run=spt_pretrain_s0", *sweep_args(tmp_path)])
    claim.close()
    with pytest.raises(PermissionError, match="cannot be written"):
        rescue.main(["--action=run", f"--out={tmp_path / 'out'}", "--results=/proc/no_records_here"])
    assert fake_runs == []


def test_a_run_gets_sigterm_when_its_driver_dies(tmp_path):
    """PR_SET_PDEATHSIG: the kernel signals a run when the thread that started it ends, however
    it ends (a SIGKILL of the driver included); here that thread ends by returning."""
    import subprocess
    import sys
    import threading
    child, driver = [], os.getpid()
    starter = threading.Thread(target=lambda: child.append(subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"], preexec_fn=lambda: rescue.die_with_parent(driver))))
    starter.start()
    starter.join()
    assert child[0].wait(timeout=10) == -rescue.signal.SIGTERM


def test_the_drivers_stop_handler_signals_its_runs_and_never_waits_for_them():
    """A handler that waited for the runs hung the driver for ever when the signal came while
    its loop polled a run, which holds the lock that waiting needs (seen: `timeout` sent SIGTERM
    to the driver, the run stopped, the driver did not). The handler only signals; the loop waits."""
    import subprocess
    import sys
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    going, stopped = {("spt", 0): child}, []
    with child._waitpid_lock:                                   # as while the driver's loop polls it
        rescue.forward_stop(going, stopped)(rescue.signal.SIGTERM, None)
    assert stopped == [rescue.signal.SIGTERM] and child.wait(timeout=10) == -rescue.signal.SIGTERM


def test_readme_figures_are_drawn_from_finished_runs_and_refuse_an_unfinished_one(tmp_path):
    """tools/readme_figures.py on tiny runs of both scripts: both PNGs, and a folder
    without summary.json refused in one line before anything is drawn."""
    import train_flt
    import train_spt
    from tools import readme_figures
    spt = tmp_path / "spt"
    train_spt.main(["--task=synthetic", "--n_train=64", "--n_eval=32", "--batch_size=32", "--n_embd=16", "--n_head=2",
                    "--pretrain_epochs=1", "--epochs=1", "--patience=0", f"--out_dir={spt}"])
    text = tmp_path / "tiny.txt"
    text.write_text(" ".join(["loop", "the", "norm", "key", "value"] * 600))
    flt = {}
    for v in ("LT", "FLT"):
        flt[v] = tmp_path / v
        train_flt.main([f"--data={text}", f"--variant={v}", "--n_layer=1", "--n_head=2", "--n_embd=16",
                        "--block_size=16", "--batch_size=4", "--n_loops=3", "--max_steps=6", "--eval_interval=3",
                        "--eval_batches=1", "--osc_steps=4", f"--out_dir={flt[v]}"])
    args = [f"--spt={spt}", f"--scratch={spt}", f"--lt={flt['LT']}", f"--flt={flt['FLT']}", f"--out={tmp_path / 'a'}"]
    readme_figures.main(args)
    assert all((tmp_path / "a" / n).stat().st_size > 10_000 for n in ("readme_spt.png", "readme_flt.png"))
    with pytest.raises(FileNotFoundError, match="no finished run .* quick start first"):
        readme_figures.main(args[:3] + [f"--flt={tmp_path}", f"--out={tmp_path / 'b'}"])
    assert not (tmp_path / "b").exists()
