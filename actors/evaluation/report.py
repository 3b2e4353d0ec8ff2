"""The evaluation report on disk: a markdown table for people, JSON for programs, PNG plots.

Figures are drawn with matplotlib's object API (`Figure`, Agg canvas), never pyplot, so
plotting needs no display and leaves no global state behind in a long-running process.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from actors.evaluation.panel import PanelResult

REPORT_MD = "report.md"
REPORT_JSON = "report.json"
SUCCESS_PNG = "success_by_task_type.png"
PASS_PNG = "pass_at_k_t.png"


def report_dict(result: PanelResult, facts: dict) -> dict:
    """The whole report as JSON-ready data: `facts` (model, env, panel...) plus what was measured.
    A fact overrides the engine's policy version (a reloaded checkpoint knows its own)."""
    tokens_per_s = {
        phase: result.generated_tokens[phase] / seconds for phase, seconds in result.wall_s.items() if seconds > 0
    }
    return {
        "policy_version": result.policy_version,
        **facts,
        "settings": asdict(result.settings),
        "task_types": result.task_types,
        "tasks": sum(result.task_types.values()),
        "library": result.library_note,
        "retrievals": result.retrievals,
        "retrieval_misses": result.retrieval_misses,
        "wall_s": result.wall_s,
        "generated_tokens": result.generated_tokens,
        "tokens_per_s": tokens_per_s,
        "rows": [asdict(row) for row in result.rows],
        "episodes": [asdict(outcome) for outcome in result.outcomes],
    }


def _fmt(value: float | None, percent: bool = False) -> str:
    if value is None:
        return "-"
    return f"{100 * value:.1f}%" if percent else f"{value:.2f}"


def markdown(report: dict) -> str:
    settings = report["settings"]
    types = sorted(report["task_types"])
    lines = [
        f"# Evaluation: {report['env']}, panel '{report['panel']}'",
        "",
        f"- model: `{report['model']}` (policy version {report['policy_version']})",
        f"- tasks: {report['tasks']} (" + ", ".join(f"{t} {report['task_types'][t]}" for t in types) + ")",
        f"- episodes per task: {settings['samples_per_task']} sampled at temperature {settings['temperature']}, 1 greedy;"
        f" step budget {settings['step_budget']}",
        f"- library: {report['library']}"
        + (
            f" ({report['retrievals']} retrievals, {report['retrieval_misses']} missed)" if report["retrievals"] else ""
        ),
        "",
        "## Success",
        "",
        "| decoding | library | episodes | success | mean steps | mean steps (won) | invalid actions | steps with experiences | "
        + " | ".join(types)
        + " |",
        "|" + "---|" * (8 + len(types)),
    ]
    for row in report["rows"]:
        library = "with" if row["library"] else "without"
        if not row["available"]:
            lines.append(f"| {row['decoding']} | {library} | {row['note']} |" + " |" * (5 + len(types)))
            continue
        by_type = [_fmt(row["success_by_task_type"].get(t), percent=True) for t in types]
        lines.append(
            " | ".join(
                [
                    f"| {row['decoding']}",
                    library,
                    str(row["episodes"]),
                    _fmt(row["success_rate"], True),
                    _fmt(row["mean_steps"]),
                    _fmt(row["mean_steps_success"]),
                    _fmt(row["invalid_action_rate"], True),
                    _fmt(row["injected_step_fraction"], True),
                    *by_type,
                ]
            )
            + " |"
        )
    notes = [
        f"- {row['decoding']}, with library: {row['note']}"
        for row in report["rows"]
        if row["available"] and row["note"]
    ]
    lines += [
        "",
        *notes,
        *([""] if notes else []),
        f"## Pass@(k,T) (sampled, n = {settings['samples_per_task']} per task)",
    ]
    for row in report["rows"]:
        if row["decoding"] != "sampled":
            continue
        lines += ["", f"### {'with' if row['library'] else 'without'} library", ""]
        if not row["available"]:
            lines.append(row["note"])
            continue
        lines.append("| k \\ T | " + " | ".join(str(t) for t in settings["budgets"]) + " |")
        lines.append("|---|" + "---|" * len(settings["budgets"]))
        for k, values in zip(settings["ks"], row["pass_grid"]):
            lines.append(f"| {k} | " + " | ".join(_fmt(v, percent=True) for v in values) + " |")
    return "\n".join(lines) + "\n"


def plot_success(report: dict, path: Path) -> None:
    """Grouped bars: success per task type (and overall) for every row that was played."""
    rows = [row for row in report["rows"] if row["available"]]
    types = sorted(report["task_types"]) + ["all"]
    figure = Figure(figsize=(max(6.0, 1.4 * len(types) + 2), 4))
    axes = figure.subplots()
    width = 0.8 / len(rows)
    for index, row in enumerate(rows):
        values = [row["success_by_task_type"].get(t, 0.0) for t in types[:-1]] + [row["success_rate"]]
        axes.bar(
            np.arange(len(types)) + (index - (len(rows) - 1) / 2) * width,
            values,
            width,
            label=f"{row['decoding']}, {'with' if row['library'] else 'without'} library",
        )
    axes.set_xticks(np.arange(len(types)), types, rotation=20, ha="right")
    axes.set_ylim(0, 1)
    axes.set_ylabel("success rate")
    axes.set_title(f"{report['env']} panel '{report['panel']}': success by task type")
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def plot_pass_grid(report: dict, path: Path) -> None:
    """Pass@(k,T) against T, one line per k, one panel per library mode (sampled rows)."""
    rows = [row for row in report["rows"] if row["decoding"] == "sampled" and row["available"]]
    settings = report["settings"]
    figure = Figure(figsize=(5 * len(rows), 4))
    for axes, row in zip(figure.subplots(1, len(rows), squeeze=False)[0], rows):
        for k, values in zip(settings["ks"], row["pass_grid"]):
            axes.plot(settings["budgets"], values, marker="o", label=f"k = {k}")
        axes.set_ylim(0, 1)
        axes.set_xlabel("step budget T")
        axes.set_ylabel("Pass@(k,T)")
        axes.set_title(f"{'with' if row['library'] else 'without'} library")
        axes.legend(fontsize=8)
    figure.suptitle(f"{report['env']} panel '{report['panel']}'")
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def write_report(result: PanelResult, facts: dict, out_dir: str | Path) -> dict[str, Path]:
    """Write report.md, report.json and the two PNGs into `out_dir`; returns their paths by name."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report = report_dict(result, facts)
    files = {
        "markdown": out / REPORT_MD,
        "json": out / REPORT_JSON,
        "success_plot": out / SUCCESS_PNG,
        "pass_plot": out / PASS_PNG,
    }
    files["markdown"].write_text(markdown(report))
    files["json"].write_text(json.dumps(report, indent=2))
    plot_success(report, files["success_plot"])
    plot_pass_grid(report, files["pass_plot"])
    return files
