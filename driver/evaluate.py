"""`slea eval`: measure a policy on its environment's held-out panel, with and without the library.

The policy is a learner checkpoint (a run directory means its newest checkpoint) or any model
name `slea.models.load_model` accepts. A run directory also supplies the run's config, so the
panel, step budget and env parameters are those the run held out, and its library snapshot,
so the with-library rows use the library the policy was trained beside.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from actors.engines import GenerationEngine, SamplingSettings, make_engine
from actors.envs.registry import load_plugins, make_env
from actors.envs.tasks import panel_tasks
from actors.evaluation.panel import PanelResult, PanelSettings, default_budgets, default_ks, play_panel
from actors.evaluation.report import report_dict, write_report
from actors.prompts import PromptBuilder
from actors.retrieval_client import RetrievalClient
from slea.config import SleaConfig, load_config

CHECKPOINTS = Path("learner") / "checkpoints"  # under a run directory (learner/checkpoint.py)


@dataclass
class PolicySource:
    """Where the evaluated weights come from."""

    model_name: str  # what make_engine loads: a checkpoint's hf/ folder or a model name
    checkpoint: Path | None  # the learner checkpoint folder (v00000012/), None for a plain model
    policy_version: int  # the checkpoint's policy version, 0 for a plain model
    run_dir: Path | None  # the run the checkpoint belongs to (config, library snapshot), if known


@dataclass
class EvalReport:
    """A finished evaluation."""

    result: PanelResult  # every episode and every summary row
    report: dict  # the JSON report (what report.json holds)
    files: dict[str, Path]  # report files by name: markdown, json, success_plot, pass_plot


def resolve_policy(model_or_checkpoint: str) -> PolicySource:
    """A run directory, a checkpoints folder, one checkpoint, a model directory, or a model name."""
    path = Path(model_or_checkpoint).expanduser()
    if not path.is_dir():
        return PolicySource(model_or_checkpoint, None, 0, None)
    if (path / "state.json").is_file() and (path / "hf").is_dir():
        checkpoint = path
    elif (path / "latest").is_file() or (path / CHECKPOINTS / "latest").is_file() or (path / "config.yaml").is_file():
        root = path if (path / "latest").is_file() else path / CHECKPOINTS
        checkpoint = _latest_checkpoint(root)
        if checkpoint is None:
            raise FileNotFoundError(
                f"{path} has no complete learner checkpoint yet (looked for {root / 'latest'}); "
                "evaluate it after its first checkpoint, or give a model name"
            )
    else:  # a save_pretrained folder; load_model says what is wrong if it is not one
        return PolicySource(str(path), None, 0, None)
    state = json.loads((checkpoint / "state.json").read_text())
    run_dir = checkpoint.parents[2] if checkpoint.parent.parent.name == CHECKPOINTS.parts[0] else None
    return PolicySource(str(checkpoint / "hf"), checkpoint, int(state["version"]), run_dir)


def _latest_checkpoint(root: Path) -> Path | None:
    """The checkpoint `root/latest` names, if complete. Read here rather than imported from
    learner.checkpoint, which loads DeepSpeed (seconds, and a banner on stdout that breaks --json)."""
    pointer = root / "latest"
    if not pointer.is_file():
        return None
    checkpoint = root / pointer.read_text().strip()
    return checkpoint if (checkpoint / "state.json").is_file() else None


def eval_config(source: PolicySource, config_file: str | None, overrides: list[str]) -> SleaConfig:
    """--config if given, else the run's own config (same panel and env params), else defaults."""
    if config_file is None and source.run_dir is not None and (source.run_dir / "config.yaml").is_file():
        config_file = str(source.run_dir / "config.yaml")
    return load_config(config_file, overrides)


def evaluate_engine(
    engine: GenerationEngine,
    config: SleaConfig,
    *,
    env_name: str | None = None,
    panel: str | None = None,
    samples_per_task: int = 4,
    ks: list[int] | None = None,
    budgets: list[int] | None = None,
    retrieval: RetrievalClient | None = None,
    library_note: str = "not requested",
    out_dir: str | Path | None = None,
    facts: dict | None = None,
    env_pool: list | None = None,
    on_episode: Callable[[int, int], None] | None = None,
    greedy: bool = True,
    policy_alone: bool = True,
) -> EvalReport:
    """Play the panel of `env_name` (default config.envs.name) through `engine`; writes the report if
    `out_dir`. With `env_pool` the envs are taken from and left in it, and `on_episode(played, in all)`
    hears of every finished episode (see play_panel)."""
    envs = config.envs
    env_name = env_name or envs.name
    panel = panel or envs.eval_panel
    params = envs.params if env_name == envs.name else {}  # one env's params mean nothing to another
    template = make_env(env_name, params, envs.max_steps, envs.plugins)
    tasks = panel_tasks(template, panel, size=envs.panel_size)
    step_budget = envs.max_steps or template.max_steps
    settings = PanelSettings(
        samples_per_task=samples_per_task,
        step_budget=step_budget,
        temperature=config.model.temperature,
        ks=ks or default_ks(samples_per_task),
        budgets=budgets or default_budgets(step_budget),
        retrieval_mode=config.actors.retrieval_mode if config.actors.retrieval_mode in ("step", "task") else "step",
        greedy=greedy,
        policy_alone=policy_alone,
    )
    builder = PromptBuilder.from_config(engine.tokenizer, config)
    result = asyncio.run(
        play_panel(
            engine,
            lambda: make_env(env_name, params, envs.max_steps, envs.plugins),
            tasks,
            builder,
            retrieval,
            settings,
            library_note,
            env_pool,
            on_episode,
        )
    )
    template.close()
    facts = {
        "model": "(engine given directly)",
        "env": env_name,
        "panel": panel,
        "env_params": params,
        "created_at": time.strftime("%Y-%m-%d %H:%M:%S"),
        **(facts or {}),
    }
    files = write_report(result, facts, out_dir) if out_dir is not None else {}
    return EvalReport(result, report_dict(result, facts), files)


def evaluate(
    model_or_checkpoint: str,
    env_name: str | None = None,
    panel: str | None = None,
    *,
    samples_per_task: int = 4,
    ks: list[int] | None = None,
    budgets: list[int] | None = None,
    config_file: str | None = None,
    overrides: list[str] = (),
    out_dir: str | Path | None = None,
    use_library: bool = True,
    max_batch: int = 16,
) -> EvalReport:
    """`slea eval`: resolve the policy, load it once into one engine, serve the library if there is one, play."""
    from driver.eval_library import eval_library

    source = resolve_policy(model_or_checkpoint)
    config = eval_config(source, config_file, list(overrides))
    load_plugins(config.envs.plugins)  # a bad plugin fails here, before the model loads
    model = config.model
    engine = make_engine(
        config.eval.engine or config.actors.engine,
        source.model_name,
        SamplingSettings(temperature=model.temperature, top_p=model.top_p, max_new_tokens=model.max_new_tokens),
        dtype=config.actors.dtype,
        max_batch=max_batch,
        engine_args=config.actors.engine_args,
    )
    if out_dir is None:
        base = source.run_dir / "eval" if source.run_dir is not None else Path(config.run.dir) / "eval"
        out_dir = (
            base / f"{env_name or config.envs.name}-{panel or config.envs.eval_panel}-{time.strftime('%Y%m%d-%H%M%S')}"
        )
    # A freshly loaded engine counts versions from 0; a checkpoint knows the version it holds.
    facts = {
        "model": model_or_checkpoint,
        "loaded": source.model_name,
        "policy_version": source.policy_version,
        "checkpoint": str(source.checkpoint) if source.checkpoint else None,
    }
    try:
        if not use_library:
            return evaluate_engine(
                engine,
                config,
                env_name=env_name,
                panel=panel,
                samples_per_task=samples_per_task,
                ks=ks,
                budgets=budgets,
                library_note="not requested (--no-library)",
                out_dir=out_dir,
                facts=facts,
            )
        with eval_library(config, source.run_dir) as (retrieval, note):
            return evaluate_engine(
                engine,
                config,
                env_name=env_name,
                panel=panel,
                samples_per_task=samples_per_task,
                ks=ks,
                budgets=budgets,
                retrieval=retrieval,
                library_note=note,
                out_dir=out_dir,
                facts=facts,
            )
    finally:
        engine.close()
