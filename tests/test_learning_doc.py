"""docs/learning.md cites only runs that are in the repository: each run it names under
docs/learning/runs/ (the study) or docs/learning/superseded/ (runs of a config since changed) is
committed there with what `slea compare --by-preset` reads."""

import re
from pathlib import Path

import yaml

from driver.run_outputs import read_metrics

REPO = Path(__file__).resolve().parents[1]
KEPT = ("config.yaml", "metrics.jsonl", "episodes.jsonl", "comparison-done")


def cited_runs(text: str) -> set[str]:
    """`runs/<id>` or `superseded/<id>` of docs/learning/ paths (not placeholders such as <id> or a glob)."""
    return set(re.findall(r"docs/learning/((?:runs|superseded)/[A-Za-z0-9_.+-]+)", text))


def test_cited_runs_are_found_in_paths_not_in_placeholders():
    text = (
        "see docs/learning/runs/tw-slea-s0/ and docs/learning/runs/<id>/ and `docs/learning/runs/*/`"
        " and docs/learning/superseded/tw-slea-s0-lr2e-5/"
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
