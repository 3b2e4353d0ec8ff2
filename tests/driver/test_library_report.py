"""What the library learned: sizes, shares of prompts and example items per evaluation, by hand."""

import json

from driver.library_report import library_at_evals, library_report
from driver.train_eval import HEADLINE

LISTING = """library of runs/x (snapshot v000000007.jsonl)
version 7  learner version 2  experiences 4  clusters 3
strategy zone: 3 items
  method: 3
    [x1] score 0.90 utility +0.00 used 4x  Open the box before taking from it.
      from episodes: e-1, e-2
    [x4] score 0.80 utility +0.00 used 0x  Go east first.
      from episodes: e-3
    [x5] score 0.70 utility +0.00 used 0x  Take the key.
      from episodes: e-4
warning zone: 1 items
  mistake: 1
    [x2] score 0.60 utility +0.00 used 1x  Do not eat the key.
      from episodes: e-5
"""


def run_with(tmp_path, name, lines, listings=None):
    run_dir = tmp_path / name
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    for step, text in (listings or {}).items():
        folder = run_dir / "eval" / f"step-{step:05d}-v{step:05d}"
        folder.mkdir(parents=True)
        (folder / "library.md").write_text(text)
    return run_dir


def library_line(step, seen, strategy, warning, strategies, warnings):
    return {
        "step": step,
        "library/prompts/seen": seen,
        "library/prompts/strategy": strategy,
        "library/prompts/warning": warning,
        "library/size/strategy": strategies,
        "library/size/warning": warnings,
    }


def seed_run(tmp_path, name="s0"):
    """Evaluations at steps 0, 2 and 4; the library writer restarts between them (seen 20 -> 5)."""
    return run_with(
        tmp_path,
        name,
        [
            {"step": 0, HEADLINE: 0.1},
            library_line(1, 10, 2, 0, 1, 0),
            library_line(2, 20, 6, 1, 3, 1),
            {"step": 2, HEADLINE: 0.2},
            library_line(3, 5, 5, 0, 3, 1),
            library_line(4, 8, 6, 2, 4, 2),
            {"step": 4, HEADLINE: 0.3},
        ],
        {2: LISTING},
    )


def test_sizes_and_shares_per_evaluation_with_a_writer_restart(tmp_path):
    first, second = library_at_evals(seed_run(tmp_path))
    # step 2: 6 of the 20 prompts since the start showed a strategy, 1 a warning
    assert (first.step, first.size, first.shown_share) == (
        2,
        {"strategy": 3, "warning": 1},
        {"strategy": 0.3, "warning": 0.05},
    )
    # step 4: the counters fell (20 -> 8 seen): a new writer, counted from its start: 6/8 and 2/8
    assert (second.step, second.size, second.shown_share) == (
        4,
        {"strategy": 4, "warning": 2},
        {"strategy": 0.75, "warning": 0.25},
    )
    assert first.examples == [
        "[x1] score 0.90 utility +0.00 used 4x  Open the box before taking from it. (from episodes: e-1, e-2)",
        "[x4] score 0.80 utility +0.00 used 0x  Go east first. (from episodes: e-3)",
        "[x5] score 0.70 utility +0.00 used 0x  Take the key. (from episodes: e-4)",
    ]
    assert second.examples == []  # no listing kept for step 4


def test_a_run_without_a_library_has_no_entries(tmp_path):
    grpo = run_with(tmp_path, "grpo", [{"step": 0, HEADLINE: 0.1}, {"step": 2, HEADLINE: 0.2, "learner/loss": 0.5}])
    assert library_at_evals(grpo) == []


def test_the_report_averages_the_seeds_and_skips_arms_without_a_library(tmp_path):
    other = run_with(
        tmp_path,
        "s1",
        [
            library_line(2, 10, 1, 3, 5, 3),
            {"step": 2, HEADLINE: 0.0},
            library_line(4, 30, 2, 4, 7, 4),
            {"step": 4, HEADLINE: 0.0},
        ],
    )
    grpo = run_with(tmp_path, "grpo", [{"step": 4, HEADLINE: 0.2}])
    text = library_report({"slea": [seed_run(tmp_path), other], "grpo": [grpo]})
    lines = text.splitlines()
    assert lines[0] == "### library of slea (2 runs: mean over runs)" and "grpo" not in text
    # step 2: sizes (3+5)/2, (1+3)/2; shares (30%+10%)/2, (5%+30%)/2
    assert "| 2 | 4.0 | 2.0 | 20% | 18% |" in lines
    # step 4: sizes (4+7)/2, (2+4)/2; shares (75% + 1/20)/2, (25% + 1/20)/2
    assert "| 4 | 5.5 | 3.0 | 40% | 15% |" in lines
    assert "Items at step 2 (s0):" in lines and "- (no listing kept for this evaluation)" in lines


def test_no_prompt_since_the_last_evaluation_gives_no_share(tmp_path):
    run = run_with(tmp_path, "idle", [library_line(2, 0, 0, 0, 0, 0), {"step": 2, HEADLINE: 0.0}])
    [entry] = library_at_evals(run)
    assert entry.shown_share == {"strategy": None, "warning": None}
