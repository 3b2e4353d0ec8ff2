"""The learning study's intervals on hand-computed cases, then `slea compare --by-preset` on kept runs."""

import json
import subprocess
import sys

import numpy as np
import pytest

from driver.study import BASE, Cells, cells_of, difference, estimate, keep_episodes, resample_counts, study_report


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


def test_seeds_are_resampled_too():
    # One task, two seeds that disagree completely: the same 0 / 0.5 / 1 as two tasks above.
    value = estimate(cells([[1.0], [0.0]]))
    assert (value.mean, value.low, value.high) == (0.5, 0.0, 1.0)


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


def kept_run(root, run_id, preset, episodes, edge=False):
    run_dir = root / run_id
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(f"run:\n  id: {run_id}\n  preset: {preset}\n  edge: {str(edge).lower()}\n")
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
    assert deployed[2] == "| arm | step 0 | step 4 |"
    assert deployed[4].startswith(f"| {BASE} | 0.250 [") and deployed[4].endswith("(n=1) | - |")
    assert deployed[5].startswith("| slea | - | 0.750 [")
    assert deployed[6].startswith("| slea+edge | - | 0.750 [")
    assert deployed[7].startswith("| grpo | - | 0.500 [")  # greedy episodes are not in the sampled views
    assert "| slea - grpo | +0.250 [" in table and "| grpo - base model | +0.250 [" in table
    alone = lines[lines.index("### success, policy alone (sampled, no library)") :]
    assert alone[5].startswith("| slea | - | 0.250 [")  # the policy without its library won only t0
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
