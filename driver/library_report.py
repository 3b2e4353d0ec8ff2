"""What the library learned in a study's runs (`slea compare --by-preset`, issue 21).

Per library arm and evaluation step: how many strategies and warnings the library held, what share
of the training prompts since the previous evaluation showed at least one of each, and three items
it held then with the episodes they were distilled from, so a reader can judge whether what a small
model distils is a lesson or noise.

The counts come from the run's metrics lines (`library/size/<zone>`, `library/prompts/...`, written
by `slea train` at every learner step); the items from the `library.md` listing the evaluator wrote
beside each report it played with the library (`driver/train_eval.py`). The prompt counters are
cumulative since the library writer started: where one shrinks between two evaluations the writer
restarted, and the share is taken from its new start.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from driver.run_outputs import read_metrics
from driver.train_eval import HEADLINE, LIBRARY_LISTING

ZONES = ("strategy", "warning")
EXAMPLES = 3


@dataclass
class LibraryAtEval:
    """The library of one run at one evaluation after an update."""

    step: int  # learner step of the evaluation
    size: dict[str, int]  # zone -> items held
    shown_share: dict[
        str, float | None
    ]  # zone -> share of the training prompts since the last evaluation showing one (None: no prompt)
    examples: list[str]  # up to EXAMPLES items of the listing, each "[id] ... text" and its episodes


def library_at_evals(run_dir: Path) -> list[LibraryAtEval]:
    """One entry per evaluation after an update that the run's library lines cover; [] for a run
    without a library (GRPO) or one recorded before the prompt counters existed."""
    lines = read_metrics(run_dir)
    evals = [line["step"] for line in lines if HEADLINE in line and line["step"] > 0]
    library_lines = [line for line in lines if "library/prompts/seen" in line]
    found, before = [], dict.fromkeys(("seen", *ZONES), 0)
    for step in evals:
        covered = [line for line in library_lines if line["step"] <= step]
        if not covered:
            continue
        now = {what: covered[-1].get(f"library/prompts/{what}", 0) for what in ("seen", *ZONES)}
        if now["seen"] < before["seen"]:  # the writer restarted: its counters began again at 0
            before = dict.fromkeys(before, 0)
        seen = now["seen"] - before["seen"]
        found.append(
            LibraryAtEval(
                step=step,
                size={zone: int(covered[-1].get(f"library/size/{zone}", 0)) for zone in ZONES},
                shown_share={zone: (now[zone] - before[zone]) / seen if seen > 0 else None for zone in ZONES},
                examples=listed_items(run_dir, step),
            )
        )
        before = now
    return found


def listed_items(run_dir: Path, step: int, count: int = EXAMPLES) -> list[str]:
    """The first `count` items of the evaluation's library listing, each with its episodes line."""
    listings = sorted(run_dir.glob(f"eval/step-{step:05d}-*/{LIBRARY_LISTING}"))
    if not listings:
        return []
    items, lines = [], listings[-1].read_text().splitlines()
    for index, line in enumerate(lines):
        if line.lstrip().startswith("[") and len(items) < count:
            following = lines[index + 1].strip() if index + 1 < len(lines) else ""
            items.append(line.strip() + (f" ({following})" if following.startswith("from episodes:") else ""))
    return items


def library_report(runs_by_arm: dict[str, list[Path]]) -> str:
    """Markdown: per library arm, a table of its seeds' mean sizes and shares per evaluation step,
    then the example items of its first run at each step."""
    sections = []
    for arm, run_dirs in runs_by_arm.items():
        per_run = {run_dir.name: library_at_evals(run_dir) for run_dir in run_dirs}
        per_run = {name: entries for name, entries in per_run.items() if entries}
        if not per_run:
            continue
        steps = sorted({entry.step for entries in per_run.values() for entry in entries})
        lines = [
            f"### library of {arm} ({len(per_run)} run{'s' if len(per_run) > 1 else ''}: mean over runs)",
            "",
            "| step | strategies | warnings | prompts showing a strategy | prompts showing a warning |",
            "|---|---|---|---|---|",
        ]
        for step in steps:
            at_step = [entry for entries in per_run.values() for entry in entries if entry.step == step]
            sizes = [_mean([entry.size[zone] for entry in at_step]) for zone in ZONES]
            shares = [_mean([entry.shown_share[zone] for entry in at_step]) for zone in ZONES]
            lines.append(f"| {step} | {sizes[0]:.1f} | {sizes[1]:.1f} | {_share(shares[0])} | {_share(shares[1])} |")
        first_run, entries = next(iter(per_run.items()))
        for entry in entries:
            lines += ["", f"Items at step {entry.step} ({first_run}):", ""]
            lines += [f"- {item}" for item in entry.examples] or ["- (no listing kept for this evaluation)"]
        sections.append("\n".join(lines))
    return "\n\n".join(sections)


def _mean(values: list[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return sum(present) / len(present) if present else None


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"
