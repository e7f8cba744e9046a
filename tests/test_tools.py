"""tools/: the rescue's rules and rate rule, its commands and its report from the committed
records, --compare's and --report's tables from committed records, the README's figures,
and the one-call GPU scripts' CPU smoke tests (slow)."""

import json
import math
import os
import shutil
import subprocess

import pytest

from tools import attention_at_init

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_attention_at_init_table_has_a_row_per_input_model_and_init():
    out = attention_at_init.main(["--seeds=1", "--n=2"])
    rows = [line for line in out.splitlines()[2:] if line.startswith("| ")]
    assert len(rows) == 2 * 3 + 4 * 3                       # synthetic walks and i.i.d.; 4 PathFinder models
    amos_walks = next(r for r in rows if r.startswith("| synthetic walks") and "| amos |" in r)
    assert float(amos_walks.split("|")[4]) > 2.0            # the tied init's self mass, x uniform
    with pytest.raises(ValueError, match="--seeds >= 1"):
        attention_at_init.main(["--seeds=0"])


def experiments(*args, **env):
    result = subprocess.run(["bash", "tools/amos_experiments.sh", *args], capture_output=True, text=True,
                            timeout=600, env={**os.environ, **{k: str(v) for k, v in env.items()}})
    return result.returncode, result.stdout, result.stderr


def test_experiment_script_lists_every_run_of_the_synthetic_table():
    rc, out, _ = experiments("synthetic", DRY=1)
    runs = out.strip().splitlines()
    assert rc == 0 and len(runs) == 18 and all("--task=synthetic --init=amos" in r for r in runs)
    assert sum("--init_params=qk" in r for r in runs) == 3 and sum("--freeze=attn" in r for r in runs) == 3
    rc, _, err = experiments("nothing")
    assert rc == 2 and "usage" in err


def test_plateau_report_finds_the_first_spt_epoch_below_the_threshold(tmp_path):
    from tools import spt_plateau
    losses = [0.80, 0.78, 0.69, 0.71, 0.60]
    with open(tmp_path / "log.jsonl", "w") as f:
        for e, loss in enumerate(losses, 1):
            f.write(json.dumps(dict(phase="spt", step=250 * e, epoch=e, val_loss=loss)) + "\n")
        f.write(json.dumps(dict(phase="finetune", step=250, epoch=1, val_loss=0.3, val_acc=0.9)) + "\n")
    out = spt_plateau.main([f"--runs={tmp_path}"])
    assert "below 0.7 after epoch 3 (step 750, 0.6900)" in out and "| 4 | 1000 | 0.7100 | - |" in out
    assert "never in 1250 steps" in spt_plateau.main([f"--runs={tmp_path}", "--threshold=0.5"])
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


# the take-off rate rule (lra_rescue.py, once tools/rates.py), checked on made-up counts (exact values by hand)
rates = rescue


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
    text = rescue.rate_table(runs, offs, {"spt": 16, "scratch": 27})
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


def commands(capsys, *flags):
    rescue.main(["commands", "--out=/o", "--results=/nowhere", *flags])
    return capsys.readouterr()


def test_rescue_commands_print_one_line_per_unrecorded_run_wave_by_wave(capsys):
    printed = commands(capsys)
    lines = printed.out.strip().splitlines()
    runs = [line.split("--run=")[1].split()[0] for line in lines]
    assert len(runs) == 30 and runs[:3] == ["spt_pretrain_s0", "spt_pretrain_s1", "spt_pretrain_s2"]
    assert runs[6:9] == ["spt_s0", "spt_s1", "spt_s2"] and "{1: 6, 2: 3, 3: 21}" in printed.err
    assert all(line.startswith(f"cd {ROOT} && python tools/lra_rescue.py one ") for line in lines)
    wave3 = commands(capsys, "--wave=3", "--arms=spt,qk", "--seeds=4", "--extra=--device=cuda --n_embd=16")
    assert wave3.out.strip().endswith("--run=qk_s4 --arms=spt,qk --seeds=4 --out=/o --results=/nowhere "
                                      "'--extra=--device=cuda --n_embd=16'")
    flags = {n: rescue.run_flags(n, 2, "/r") for n in ("spt_pretrain", "cross_pretrain", "qk", "short5", "frozen")}
    assert flags["spt_pretrain"] == ["--task=pathfinder", "--preset=cpu_rescue", "--epochs=0", "--seed=2"]
    assert "--pretrain_task=photos" in flags["cross_pretrain"]
    assert flags["qk"][2:4] == ["--init_from=/r/spt_pretrain_s2/spt_best.pt", "--init_params=qk"]
    assert flags["short5"][2] == "--init_from=/r/spt_pretrain_s2/spt_epoch5.pt"
    assert flags["frozen"][2:5] == ["--pretrain_epochs=0", "--epochs=27", "--freeze=attn"]   # compute-matched
    needs = {(n, s): (k, w) for n, s, k, w in rescue.jobs(dict(seeds="0,1", arms=rescue.DEFAULTS["arms"]))}
    assert needs["spt", 1] == ([("spt_pretrain", 1)], 2) and needs["qk", 1] == ([("spt_pretrain", 1), ("spt", 0)], 3)
    with pytest.raises(ValueError, match="unknown arm 'qkv'"):
        commands(capsys, "--arms=spt,qkv")
    with pytest.raises(ValueError, match="give distinct whole numbers"):
        commands(capsys, "--seeds=0,0")


def test_rescue_report_rebuilds_the_committed_take_off_table_from_the_records(tmp_path):
    """REPORT.md's take-off table, row for row, from results/rescue alone; the report writes
    only under --out and generates no data (the attention figure needs the image cache)."""
    text = rescue.main(["report", "--seeds=0,1,2,3,4", f"--out={tmp_path}"])
    report = open(os.path.join(ROOT, "REPORT.md")).read()
    section = report[report.index("### Take-off rates on PathFinder"):]
    committed = [line for line in section.splitlines() if line.startswith("| arm | took off |")][0]
    rows = section[section.index(committed):].split("\n\n")[0].splitlines()
    assert rows == text[text.index(committed):].split("\n\n")[0].splitlines() and len(rows) == 11
    assert {"rescue.md", "rescue_curves.png", "rescue_take_offs.png"} <= {p.name for p in tmp_path.iterdir()}
    assert "- SPT against from scratch, compute-matched: **SPT ahead, scratch learns too**" in text


def test_rescue_one_refuses_a_run_whose_start_is_not_recorded(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match="needs .*spt_pretrain_s0, which is not recorded yet"):
        rescue.main(["one", "--run=qk_s0", f"--results={tmp_path}", f"--out={tmp_path}"])
    with pytest.raises(ValueError, match="is not a run of this sweep"):
        rescue.main(["one", "--run=qk_s7", f"--results={tmp_path}"])
    rescue.main(["one", "--run=spt_s0", "--results=results/rescue", f"--out={tmp_path}"])
    assert "recorded already" in capsys.readouterr().out and not list(tmp_path.iterdir())


# tools/flt_compare.py and tools/spt_report.py: the multi-run tables from committed records
from tools import flt_compare, spt_report  # noqa: E402

WINDOW = os.path.join(ROOT, "results", "flt_window")


def test_compare_rebuilds_the_ladders_rows_and_the_separation_rule_from_records(tmp_path, capsys):
    dirs = [os.path.join(WINDOW, f"w_{v}_K16_s{s}") for v in ("FLT", "LT_ia") for s in (1, 2, 3)]
    dirs += [os.path.join(WINDOW, f"w_ref_K1_s{s}") for s in (1, 2, 3)]
    rows = flt_compare.main([f"--runs={','.join(dirs)}", f"--out={tmp_path}"])
    assert len(rows) == 2 + 9 and any("| w_LT_ia_K16_s2 | muon | LT_ia | 16 | 2 | 1.464 |" in r for r in rows)
    md = (tmp_path / "compare.md").read_text()                   # REPORT's ladder row of LT_ia at K=16
    assert "| LT_ia | 16 | 1.0 | 1, 2, 3 | 1.469 ± 0.006 (1.475, 1.464, 1.467) | -0.014 ± 0.007" in md
    assert "| LT_ia | 16 | 1.0 | 1, 2, 3 | -0.006 ± 0.002 (-0.005, -0.009, -0.004) |" in md
    assert "| 16 | 1.0 | LT_ia | 1, 2, 3 |" in md and "| not separated |" in md
    assert {"flt_map_muon.png", "flt_ladder_muon.png", "flt_loss.png"} <= {p.name for p in tmp_path.iterdir()}
    one = tmp_path / "one"
    flt_compare.main([f"--runs={dirs[0]}", f"--out={one}"])      # a single run: no map, no ladder, no empty table
    assert "skipped, one finished cell" in capsys.readouterr().out
    assert not list(one.glob("flt_map_*")) and not list(one.glob("flt_ladder_*"))
    assert "|---|\n\n" not in (one / "compare.md").read_text() + "\n"


def test_compare_reads_old_records_through_the_renamed_keys():
    r = flt_compare.rejudge(flt_compare.load_run(os.path.join(WINDOW, "w_FLT_K12_s1")))
    assert r.summary["outcome"] == "learned" and 0.9 < r.summary["gain_kept"] < 1.1
    renamed = flt_compare.as_numbers({"test_val_loss": [1.0, None], "collapse_kept": 1.0})
    assert renamed["val_loss_by_loops"][0] == 1.0 and math.isnan(renamed["val_loss_by_loops"][1])
    assert renamed["gain_kept"] == 1.0
    assert flt_compare.MARKS["learned"] != flt_compare.MARKS["lagging"]            # the map's letters


def test_spt_report_tables_runs_and_groups_seeds_from_records(tmp_path):
    where = tmp_path / "runs"
    for run in ("scratch_s0", "scratch_s1", "spt_s0"):
        shutil.copytree(os.path.join(ROOT, "results", "rescue", run), where / run,
                        ignore=shutil.ignore_patterns("*.pt"))
    table = spt_report.main([f"--runs={where}", f"--out={tmp_path / 'out'}"])
    assert table.count("| pathfinder | 2 | amos |") == 3 + 2                 # a row a run, a row a seed group
    assert "| False | 2 | 0.607 +- 0.088 | 0.579 +- 0.066 |" in table and "| True | 1 | 0.727 +- 0.000 |" in table
    assert (tmp_path / "out" / "val_accuracy.png").stat().st_size > 10_000
    with pytest.raises(FileNotFoundError, match="no finished train_spt.py run"):
        spt_report.main([f"--runs={WINDOW}", f"--out={tmp_path / 'none'}"])


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
    assert not (tmp_path / "b").exists() and readme_figures.DEFAULTS["out"] == "out/readme_figures"


# The one-call GPU scripts, on the CPU at a tiny size (slow)

@pytest.mark.slow
def test_rescue_gpu_script_runs_the_waves_stops_at_its_limit_and_resumes(tmp_path):
    """tools/lra_rescue_gpu.sh with tiny runs (about 2 minutes): a first call cut at 12 s stops
    its runs (each saves its resume point); the second finishes them through `commands` and
    xargs, and leaves the table, the figures and the records in $OUT."""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT, repo, ignore=shutil.ignore_patterns("out*", "data", ".git", "__pycache__", "rescue_gpu"))
    extra = f"--n_generate=600 --data_dir={tmp_path / 'data'} --n_embd=16 --n_head=2 --batch_size=8 --log_every=1"
    out = tmp_path / "back"
    out.mkdir()
    env = dict(os.environ, EXTRA=extra, EXTRA_SPT="--pretrain_epochs=1", OUT=str(out), ARMS="spt,qk", SEEDS="0",
               SLOTS="2")
    call = lambda limit: subprocess.run(["bash", "tools/lra_rescue_gpu.sh", str(limit)], cwd=repo, env=env,
                                        capture_output=True, text=True, timeout=600).stdout
    assert "run this script again on this machine to resume" in call(12)
    call(400)
    log = (repo / "out/rescue_gpu/sweep.log").read_text()
    records = {p.name for p in (repo / "results" / "rescue_gpu").iterdir()}
    assert records == {"spt_pretrain_s0", "spt_s0"}, log            # a tiny spt never takes off: the gate holds qk
    assert "the ablation arms do not start" in log
    assert {"rescue.md", "rescue_curves.png", "records.tar.gz", "status.txt"} <= {p.name for p in out.iterdir()}


@pytest.mark.slow
def test_flt_ladder_gpu_script_runs_at_a_tiny_size_on_a_cpu(tmp_path):
    """tools/flt_ladder_gpu.sh's CPU smoke test: the reference and the five variants at one
    K are recorded, the table is drawn from the records, the main command's half minute
    gives a rate, and the device folder gets the logs and the records."""
    text = tmp_path / "tiny.txt"
    text.write_text(" ".join(["loop", "the", "norm", "key", "value"] * 600))
    (tmp_path / "device").mkdir()
    env = dict(os.environ, RUNS=str(tmp_path / "runs"), RESULTS=str(tmp_path / "results"), KS="2", SEEDS="1", PAR="2",
               EXTRA=f"--data={text} --n_layer=1 --n_embd=16 --n_head=2 --block_size=16 --batch_size=4 --max_steps=6 "
                     "--eval_interval=3 --eval_batches=1 --test_loops=2 --osc_steps=4",
               MAIN_FLAGS="--difficulty=baseline --n_generate=200 --n_train=32 --n_eval=16 --n_embd=16 --n_head=2 "
                          "--batch_size=8 --compile=False", MAIN_SECONDS="30", OUT=str(tmp_path / "device"))
    p = subprocess.run(["bash", "tools/flt_ladder_gpu.sh", "120"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0 and "ladder: 6 records" in p.stdout, p.stdout + p.stderr
    assert "steps a second; the full run's" in p.stdout and "h at that rate" in p.stdout
    assert {"ladder.log", "main_command.txt", "compare.md", "records.tar.gz"} <= {f.name for f in (tmp_path / "device").iterdir()}

