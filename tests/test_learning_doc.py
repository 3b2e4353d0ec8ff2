"""docs/learning.md cites only runs that are in the repository: each run it names under
docs/learning/slea-vs-grpo/ (issue 37's study), docs/learning/runs/ (the first study) or
docs/learning/superseded/ (runs of a config since changed) is committed there with what `slea
compare --by-preset` reads, and the intervals it and README.md lead with recompute from those runs."""

import math
import re
from pathlib import Path

import yaml

from driver.run_outputs import read_metrics
from driver.seed_intervals import over_seeds, t_quantile
from driver.study import BASE, cells_of, evaluation_variance, seed_level, study_cells, training_seeds

REPO = Path(__file__).resolve().parents[1]
KEPT = ("config.yaml", "metrics.jsonl", "episodes.jsonl", "comparison-done")


def cited_runs(text: str) -> set[str]:
    """`runs/<id>`, `superseded/<id>` or `slea-vs-grpo/<id>` of docs/learning/ paths (not placeholders
    such as <id> or a glob, nor a study's tables and plots beside its runs: study.md, *.png)."""
    paths = re.findall(r"docs/learning/((?:runs|superseded|slea-vs-grpo)/[A-Za-z0-9_.+-]+)", text)
    return {path for path in paths if not path.endswith((".md", ".png"))}


def test_cited_runs_are_found_in_paths_not_in_placeholders():
    text = (
        "see docs/learning/runs/tw-slea-s0/ and docs/learning/runs/<id>/ and `docs/learning/runs/*/`"
        " and docs/learning/superseded/tw-slea-s0-lr2e-5/ and docs/learning/slea-vs-grpo/study.md"
    )
    assert cited_runs(text) == {"runs/tw-slea-s0", "superseded/tw-slea-s0-lr2e-5"}


def test_every_run_the_learning_doc_cites_is_kept_in_the_repository():
    learning = REPO / "docs" / "learning"
    for doc in (REPO / "docs" / "learning.md", REPO / "README.md"):
        for run in cited_runs(doc.read_text()):
            missing = [name for name in KEPT if not (learning / run / name).is_file()]
            assert not missing, f"{doc.name} cites run {run}, but docs/learning/{run}/ lacks {missing}"


def test_the_kept_runs_are_not_ignored_by_git():
    """.gitignore's runs/ once swallowed docs/learning/runs/: a fresh clone had no kept run."""
    import subprocess

    result = subprocess.run(
        ["git", "check-ignore", "--no-index", "docs/learning/runs/tw-slea-s0/config.yaml"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1, f"git ignores the kept runs: {result.stdout.strip()}"


def test_every_kept_run_keeps_its_learner_lines():
    """The doc's diagnosis of a run (KL, entropy, clip fraction, training success per update) is
    read from the learner's lines: a kept run holds one for each of its updates. A GRPO run's
    lines carry no library keys, so keeping only eval and library lines once dropped them all."""
    for run in sorted((REPO / "docs" / "learning").glob("*/*/comparison-done")):
        run_dir = run.parent
        updates = yaml.safe_load((run_dir / "config.yaml").read_text())["learner"]["max_steps"]
        trained = sorted(
            line["learner/learner_step"] for line in read_metrics(run_dir) if "learner/learner_step" in line
        )
        assert trained == list(range(1, updates + 1)), f"{run_dir.name} keeps learner lines of steps {trained}"


def points(value) -> str:
    return f"{100 * value.mean:+.1f} ±{100 * value.half_width:.1f} [{100 * value.low:+.1f}, {100 * value.high:+.1f}]"


def short(value) -> str:
    """A seed interval as README.md gives it: the mean and its interval, without the half-width."""
    return f"{100 * value.mean:+.1f} [{100 * value.low:+.1f}, {100 * value.high:+.1f}]"


def success_of(found, arm: str, view: str, step: int):
    return cells_of(found[(arm, view, step)], "success")


def test_the_headline_recomputes_from_the_kept_runs_of_slea_against_grpo():
    """docs/learning.md and README.md lead with issue 37's study: SLEA - GRPO after update 16, as
    deployed and for the policy alone, paired by seed over the 8 seeds of each arm (7 degrees of
    freedom, as planned before the runs), and each arm against the base model: what `slea compare
    --by-preset` computes from the runs kept in docs/learning/slea-vs-grpo/."""
    runs = sorted(done.parent for done in (REPO / "docs" / "learning" / "slea-vs-grpo").glob("*/comparison-done"))
    found, seeds = study_cells(runs), training_seeds(runs)
    assert sorted(seeds.values()) == sorted(list(range(8)) * 2), seeds
    doc, readme = (REPO / "docs" / "learning.md").read_text(), (REPO / "README.md").read_text()
    for view in ("deployed", "policy_alone"):
        slea_grpo = seed_level(success_of(found, "slea", view, 16), success_of(found, "grpo", view, 16), seeds)
        assert (slea_grpo.method, slea_grpo.seeds, slea_grpo.df) == ("paired", 8, 7.0)
        assert f"**{points(slea_grpo)}**" in doc, f"SLEA - GRPO {view}: {points(slea_grpo)} is not in docs/learning.md"
        assert short(slea_grpo) in readme, f"SLEA - GRPO {view}: {short(slea_grpo)} is not in README.md"
    base = success_of(found, BASE, "deployed", 0)
    noise = evaluation_variance(found[(BASE, "deployed", 0)], "success")
    for arm, view in (("slea", "deployed"), ("slea", "policy_alone"), ("grpo", "deployed")):
        value = seed_level(success_of(found, arm, view, 16), base, seeds, noise)
        assert points(value) in doc, f"{arm} {view} - base model: {points(value)} is not in docs/learning.md"
        assert short(value) in readme, f"{arm} {view} - base model: {short(value)} is not in README.md"


def test_the_first_studys_seed_intervals_recompute_from_its_kept_runs():
    """docs/learning.md keeps the first study's (issue 21's) table over seeds: what `slea compare
    --by-preset` computes from the kept runs in docs/learning/runs/."""
    runs = sorted((REPO / "docs" / "learning" / "runs").glob("*/"))
    found, seeds = study_cells(runs), training_seeds(runs)
    doc = (REPO / "docs" / "learning.md").read_text()
    slea_grpo = seed_level(success_of(found, "slea", "deployed", 16), success_of(found, "grpo", "deployed", 16), seeds)
    assert slea_grpo.method == "paired" and points(slea_grpo) == "+3.1 ±13.7 [-10.6, +16.8]"
    assert points(slea_grpo) in doc
    alone = seed_level(
        success_of(found, "slea", "policy_alone", 16), success_of(found, "grpo", "policy_alone", 16), seeds
    )
    assert points(alone) in doc
    base = success_of(found, BASE, "deployed", 0)
    noise = evaluation_variance(found[(BASE, "deployed", 0)], "success")
    for arm, view in (("slea", "deployed"), ("slea", "policy_alone"), ("grpo", "deployed"), ("slea+edge", "deployed")):
        value = seed_level(success_of(found, arm, view, 16), base, seeds, noise)
        assert points(value) in doc, f"{arm} {view} - base model: {points(value)} is not in docs/learning.md"


def test_the_planned_half_width_is_the_first_studys_paired_sd_over_8_seeds():
    """The planned study's expected half-width: SLEA - GRPO per seed at step 16 on the games the new
    panel draws (no tw-simple), their SD, over 8 seeds with t(0.975, 7)."""
    runs = sorted((REPO / "docs" / "learning" / "runs").glob("*/"))
    found = study_cells(runs)
    winnable = {
        arm: {
            run: [e for e in episodes if e["task_type"] != "simple"]
            for run, episodes in found[(arm, "deployed", 16)].items()
        }
        for arm in ("slea", "grpo")
    }
    differences = cells_of(winnable["slea"], "success").per_run() - cells_of(winnable["grpo"], "success").per_run()
    assert [round(72 * value) for value in differences] == [7, -3, 5]  # seeds 0, 1, 2 (runs sorted by id)
    sd = over_seeds(differences).half_width / t_quantile(2) * math.sqrt(3)
    assert round(100 * sd, 2) == 7.35
    half_width = t_quantile(7) * sd / math.sqrt(8)
    doc = (REPO / "docs" / "learning.md").read_text()
    assert f"half-width {100 * half_width:.1f}\n  points" in doc or f"half-width {100 * half_width:.1f} points" in doc
    assert round(100 * half_width, 1) == 6.1
