"""The learning study's intervals on hand-computed cases, then `slea compare --by-preset` on kept runs."""

import json
import subprocess
import sys

import numpy as np
import pytest

from driver.study import (
    BASE,
    Cells,
    cells_of,
    difference,
    estimate,
    evaluation_variance,
    keep_episodes,
    protocol_of,
    resample_counts,
    study_report,
)


def cells(rows, runs=None, tasks=None, denominator=None):
    numerator = np.array(rows, dtype=float)
    runs = runs or [f"s{index}" for index in range(numerator.shape[0])]
    tasks = tasks or [f"t{index}" for index in range(numerator.shape[1])]
    return Cells(runs, tasks, numerator, np.ones_like(numerator) if denominator is None else np.array(denominator))


def test_resampling_draws_as_many_items_as_there_are():
    counts = resample_counts(np.random.default_rng(0), 5, 1000)
    assert counts.shape == (1000, 5) and (counts.sum(axis=1) == 5).all()
    assert abs(counts.mean() - 1.0) < 0.05  # each item appears once per draw on average


def test_the_same_value_everywhere_has_no_uncertainty():
    value = estimate(cells([[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]]))
    assert (value.mean, value.low, value.high, value.seeds) == (0.5, 0.5, 0.5, 2)


def test_two_tasks_won_and_lost_span_the_whole_interval():
    # One seed, task 0 always won, task 1 never: a draw of 2 tasks gives 0 (p 1/4), 0.5 (1/2) or 1 (1/4),
    # so the 2.5th and 97.5th percentiles are 0 and 1, and the mean is 0.5.
    value = estimate(cells([[1.0, 0.0]]))
    assert (value.mean, value.low, value.high, value.seeds) == (0.5, 0.0, 1.0, 1)


def test_the_task_bootstrap_holds_the_runs_fixed():
    # One task, two seeds that disagree completely: every draw of the one task keeps both runs, so the
    # interval over tasks is 0 wide; the seeds' disagreement is the seed-level interval's to carry.
    value = estimate(cells([[1.0], [0.0]]))
    assert (value.mean, value.low, value.high) == (0.5, 0.5, 0.5)


def test_a_rate_is_a_ratio_of_sums_not_a_mean_of_ratios():
    # Invalid steps over steps: task 0 had 1 of 1 invalid, task 1 had 1 of 9: 2 / 10 = 0.2 (mean of ratios: 0.56).
    value = estimate(cells([[1.0, 1.0]], denominator=[[1.0, 9.0]]))
    assert value.mean == pytest.approx(0.2)
    assert value.low == pytest.approx(1 / 9) and value.high == pytest.approx(1.0)  # draws t1 t1 (2 of 18), t0 t0


def test_pairing_by_task_cancels_what_the_tasks_share():
    # Arm b wins 0.25 more of every task than arm a; the tasks differ a lot from each other.
    a = cells([[0.0, 0.25, 0.5, 0.75]])
    b = cells([[0.25, 0.5, 0.75, 1.0]])
    paired = difference(b, a)
    assert (paired.mean, paired.low, paired.high) == pytest.approx((0.25, 0.25, 0.25))
    # The same numbers on two different panels (task ids differ): the tasks are drawn apart, the interval is wide.
    unpaired = difference(b, cells([[0.0, 0.25, 0.5, 0.75]], tasks=["u0", "u1", "u2", "u3"]))
    assert unpaired.mean == pytest.approx(0.25)
    assert unpaired.low < 0 < 0.5 < unpaired.high


def test_cells_sum_each_runs_episodes_per_task():
    runs = {
        "s0": [
            {"task_id": "b", "success": True, "invalid_steps": 1, "steps": 4, "total_reward": 1.0},
            {"task_id": "a", "success": False, "invalid_steps": 3, "steps": 8, "total_reward": 0.5},
            {"task_id": "a", "success": True, "invalid_steps": 0, "steps": 2, "total_reward": 1.0},
        ],
        "s1": [{"task_id": "a", "success": False, "invalid_steps": 8, "steps": 8, "total_reward": 0.0}],
    }
    won = cells_of(runs, "success")
    assert won.tasks == ["a", "b"] and won.runs == ["s0", "s1"]
    assert won.numerator.tolist() == [[1.0, 1.0], [0.0, 0.0]]
    assert won.denominator.tolist() == [[2.0, 1.0], [1.0, 0.0]]
    invalid = cells_of(runs, "invalid_action_rate")
    assert invalid.numerator.tolist() == [[3.0, 1.0], [8.0, 0.0]]
    assert invalid.denominator.tolist() == [[10.0, 4.0], [8.0, 0.0]]
    assert invalid.statistic() == pytest.approx(12 / 22)
    assert cells_of(runs, "mean_reward").statistic() == pytest.approx(2.5 / 4)


def episode(task, step, success, library=False, decoding="sampled", sample=0):
    return {
        "task_id": task,
        "task_type": "easy",
        "decoding": decoding,
        "library": library,
        "sample": sample,
        "steps": 2 if success else 8,
        "success": success,
        "invalid_steps": 0 if success else 4,
        "injected_steps": 1 if library else 0,
        "total_reward": 1.0 if success else 0.0,
        "learner_step": step,
    }


def kept_run(root, run_id, preset, episodes, edge=False, seed=0, max_steps=8):
    run_dir = root / run_id
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(
        f"run:\n  id: {run_id}\n  preset: {preset}\n  edge: {str(edge).lower()}\n  seed: {seed}\n"
        f"envs:\n  name: textworld\n  max_steps: {max_steps}\n"
    )
    # As a full run holds them: one report.json per evaluation; keep_episodes makes the committed copy.
    for step in sorted({episode["learner_step"] for episode in episodes}):
        report_dir = run_dir / "eval" / f"step-{step:05d}-v{step:05d}"
        report_dir.mkdir(parents=True)
        mine = [{k: v for k, v in e.items() if k != "learner_step"} for e in episodes if e["learner_step"] == step]
        (report_dir / "report.json").write_text(json.dumps({"learner_step": step, "episodes": mine}))
    kept = root / "kept" / run_id
    kept.mkdir(parents=True)
    (kept / "config.yaml").write_text((run_dir / "config.yaml").read_text())
    keep_episodes(run_dir, kept)
    return kept


def test_compare_by_preset_prints_arms_pairs_and_plots(tmp_path):
    tasks = ["t0", "t1", "t2", "t3"]
    base = [episode(task, 0, task == "t0") for task in tasks]
    # slea (with its library as deployed) wins t0-t2 after step 4; without the library only t0.
    slea = [episode(task, 4, task != "t3", library=True) for task in tasks] + [
        episode(task, 4, task == "t0") for task in tasks
    ]
    grpo = [episode(task, 4, task in ("t0", "t1")) for task in tasks] + [episode("t0", 4, True, decoding="greedy")]
    runs = [
        kept_run(tmp_path, "tw-slea-s0", "slea", base + slea),
        kept_run(tmp_path, "tw-grpo-s0", "grpo", grpo),
        kept_run(tmp_path, "tw-slea-edge-s0", "slea", slea, edge=True),
    ]
    table, plots = study_report(runs, tmp_path / "plots", draws=500)
    lines = table.splitlines()
    deployed = lines[lines.index("### success, deployed (sampled, with the run's library where it has one)") :]
    assert deployed[2] == (
        "| arm | step 0, over seeds (t) | step 0, over tasks (evaluation noise for these seeds) "
        "| step 4, over seeds (t) | step 4, over tasks (evaluation noise for these seeds) |"
    )
    assert deployed[4].startswith(f"| {BASE} | 0.250 (no training seed; pooled, runs: 1) | 0.250 [")
    assert deployed[4].endswith("| - | - |")
    one_seed = "(n=1: no interval over one seed)"
    assert deployed[5].startswith(f"| slea | - | - | 0.750 {one_seed} | 0.750 [")
    assert deployed[6].startswith(f"| slea+edge | - | - | 0.750 {one_seed} | 0.750 [")
    assert deployed[7].startswith(f"| grpo | - | - | 0.500 {one_seed} | 0.500 [")  # greedy: not a sampled view
    assert f"| slea - grpo | +0.250 {one_seed} | +0.250 [" in table
    assert f"| grpo - base model | +0.250 {one_seed} | +0.250 [" in table
    alone = lines[lines.index("### success, policy alone (sampled, no library)") :]
    assert alone[5].startswith(f"| slea | - | - | 0.250 {one_seed}")  # the policy without its library won only t0
    assert sorted(path.name for path in plots) == sorted(
        f"{view}_{metric}.png"
        for view in ("deployed", "policy_alone")
        for metric in ("success", "invalid_action_rate", "mean_reward")
    )
    assert all(path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for path in plots)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "driver.cli",
            "compare",
            *map(str, runs),
            "--by-preset",
            "--out-dir",
            str(tmp_path / "cli"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "| slea - grpo |" in result.stdout and (tmp_path / "cli" / "deployed_success.png").is_file()


def test_a_run_counted_twice_or_without_episodes_is_refused(tmp_path):
    run = kept_run(tmp_path, "tw-slea-s0", "slea", [episode("t0", 0, True)])
    with pytest.raises(ValueError, match="appears twice"):
        study_report([run, run], tmp_path / "plots")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.yaml").write_text("run:\n  id: empty\n  preset: grpo\n")
    with pytest.raises(ValueError, match="no held-out episodes"):
        study_report([tmp_path / "empty"], tmp_path / "plots")


def wins(step, won, tasks=("t0", "t1", "t2", "t3")):
    """One sampled episode per task at `step`, the tasks in `won` won."""
    return [episode(task, step, task in won) for task in tasks]


def seed_study(tmp_path, grpo_seeds):
    """slea seeds 0 and 1 win 3 and 2 of 4 tasks at step 4; grpo's two runs 1 and 2; the base model 1."""
    return [
        kept_run(tmp_path, "tw-slea-s0", "slea", wins(0, {"t0"}) + wins(4, {"t0", "t1", "t2"}), seed=0),
        kept_run(tmp_path, "tw-slea-s1", "slea", wins(4, {"t0", "t1"}), seed=1),
        kept_run(tmp_path, f"tw-grpo-s{grpo_seeds[0]}", "grpo", wins(4, {"t0"}), seed=grpo_seeds[0]),
        kept_run(tmp_path, f"tw-grpo-s{grpo_seeds[1]}", "grpo", wins(4, {"t0", "t1"}), seed=grpo_seeds[1]),
    ]


def row(table, label):
    """The first table row of `label` (success as deployed comes first)."""
    return next(line for line in table.splitlines() if line.startswith(f"| {label} |"))


def test_arms_of_the_same_seeds_are_paired_by_seed(tmp_path):
    # Per seed, slea - grpo: 0.75 - 0.25 = 0.5 and 0.5 - 0.5 = 0: mean 0.25, sd 0.353553, standard error
    # 0.25, t(0.975, 1) = 12.7062: half-width 3.176551. Over tasks the runs are fixed, paired by game.
    table, _ = study_report(seed_study(tmp_path, (0, 1)), tmp_path / "plots", draws=200)
    assert row(table, "slea - grpo").startswith("| slea - grpo | +0.250 ±3.177 [-2.927, +3.427] (paired, n=2) | ")
    # slea's runs against the base model's 0.25: 0.5 and 0.25, mean 0.375, sd 0.176777, x 12.7062 / sqrt(2)
    # = 1.588277.
    assert row(table, "slea - base model").startswith("| slea - base model | +0.375 ±1.588 [-1.213, +1.963] (n=2) | ")
    # One arm: 0.75 and 0.5, mean 0.625, the same half-width 1.588.
    assert "| 0.625 ±1.588 [-0.963, 2.213] (n=2) | 0.625 [" in row(table, "slea")


def test_arms_of_different_seeds_take_welch(tmp_path):
    # grpo ran seeds 2 and 3: no seed's task stream is shared. Welch: variances 0.03125 each, squared
    # standard error 0.03125 / 2 x 2 = 0.03125, df 2, half-width 4.302653 x 0.176777 = 0.760611.
    table, _ = study_report(seed_study(tmp_path, (2, 3)), tmp_path / "plots", draws=200)
    assert row(table, "slea - grpo").startswith("| slea - grpo | +0.250 ±0.761 [-0.511, +1.011] (Welch, n=2) | ")


def test_the_base_model_is_pooled_over_every_run_that_played_it(tmp_path):
    # Two runs played the base model (1 and 3 of 4 tasks won): pooled 4 of 8 = 0.5, one figure, no seed.
    runs = [
        kept_run(tmp_path, "tw-slea-s0", "slea", wins(0, {"t0"}) + wins(4, {"t0", "t1", "t2"}), seed=0),
        kept_run(tmp_path, "tw-slea-s1", "slea", wins(0, {"t0", "t1", "t2"}) + wins(4, {"t0"}), seed=1),
    ]
    table, _ = study_report(runs, tmp_path / "plots", draws=200)
    assert row(table, BASE).startswith(f"| {BASE} | 0.500 (no training seed; pooled, runs: 2) | 0.500 [")
    # Runs minus it: 0.25 and -0.25, seed term 0.125 / 2 = 0.0625. The base figure's evaluation noise: t1 and
    # t2 were won in one of their two episodes (residuals -0.5, +0.5: 0.5 x 2/1 = 1 each), t0 and t3 agree:
    # 2 / 8^2 = 0.03125 on 4 df. Squared standard error 0.09375 (0.306186); df = 0.09375^2 / (0.0625^2 / 1
    # + 0.03125^2 / 4) = 2.1176; t(0.975, 2.1176) = 4.082; half-width 1.250.
    assert row(table, "slea - base model").startswith("| slea - base model | +0.000 ±1.250 [-1.250, +1.250] (n=2) |")


def test_runs_of_different_protocols_are_not_compared(tmp_path):
    runs = [
        kept_run(tmp_path, "tw-slea-s0", "slea", wins(0, {"t0"}), seed=0),
        kept_run(tmp_path, "tw-grpo-s0", "grpo", wins(4, {"t0"}), seed=0, max_steps=12),
    ]
    with pytest.raises(ValueError, match="different protocols"):
        study_report(runs, tmp_path / "plots")


def test_a_run_kept_before_the_prompt_layout_key_played_the_experiences_first_layout(tmp_path):
    """Runs kept before `actors.prompt_layout` existed say nothing of it: they played the experiences
    in the system message, so they compare with a run that says so, and not with a prefix-stable one."""
    old = kept_run(tmp_path, "old", "slea", wins(0, {"t0"}))
    for layout, comparable in (("experiences_first", True), ("prefix_stable", False)):
        new = kept_run(tmp_path, f"new-{layout}", "grpo", wins(0, {"t0"}))
        config = new / "config.yaml"
        config.write_text(config.read_text() + f"actors:\n  prompt_layout: {layout}\n")
        assert (protocol_of(old) == protocol_of(new)) is comparable


def test_the_base_models_evaluation_noise_is_stratified_by_task():
    # Task t0 won once in two episodes, t1 never: pooled 1 of 4 = 0.25; residuals x - 0.25 are 0.75 and
    # -0.25 on t0 (sum of squares about their mean 0.5, x 2/1 = 1.0) and -0.25, -0.25 on t1 (0):
    # variance 1.0 / 4^2 = 0.0625 on 2 degrees of freedom: the binomial 2 x (0.5 x 0.5 x 2/1) / 16.
    runs = {"s0": [episode("t0", 0, True), episode("t0", 0, False, sample=1)], "s1": wins(0, set(), ("t1", "t1"))}
    assert evaluation_variance(runs, "success") == pytest.approx((0.0625, 2.0))
    # A rate: t0's steps 2 and 8 with 0 and 4 invalid, t1's 8 and 8 with 4 and 4: R = 12 / 26; residuals
    # x - R d: t0 -0.923077, +0.307692 (sum of squares 0.757396, x 2 = 1.514793); t1 0.307692 twice (0);
    # variance 1.514793 / 26^2 = 0.002241.
    assert evaluation_variance(runs, "invalid_action_rate") == pytest.approx((0.002241, 2.0), abs=1e-6)
