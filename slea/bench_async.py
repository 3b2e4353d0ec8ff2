"""`slea bench async`: what the actor-learner overlap buys, against the synchronous baseline.

The same config runs twice through `slea train`, the whole system with nothing simulated:
once as normal (actors keep playing while the learner trains, bounded by `max_staleness`) and
once with `actors.synchronous` (the actors play exactly one batch per policy version and wait
while the learner trains on it; the learner waits for that full batch). Both runs take the same
number of learner steps; seconds per step come from the learner's own trace
(learner/trained_groups.jsonl, stamped when each version is published).

The first `warmup_steps` steps are left out of both: they include model loading and, in the
overlapped run, the groups the actors played while the learner was still starting up (a backlog
the learner drains or drops as stale within `learner.max_staleness` steps). What is measured is
the steady state.
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path

from slea.config import load_config

TINY = "tiny"  # model name meaning the randomly initialised tiny test model (slea.models.tiny_model)


def _settings(model: str, run_dir: str, max_new_tokens: int, envs_per_worker: int) -> list[str]:
    """The benchmark's run: configs/local.yaml with no library (its load is the same in both modes
    and not what is compared), short alfworld episodes, no checkpoint before the end, no
    held-out evaluation. One worker
    plays `envs_per_worker` episodes at once: 8 is the whole batch (2 groups of 4) in one go."""
    return [
        f"run.dir={run_dir}", "run.preset=grpo", f"model.name={model}", f"model.max_new_tokens={max_new_tokens}",
        "envs.max_steps=4", "envs.panel_size=4", "actors.num_workers=1", f"actors.envs_per_worker={envs_per_worker}",
        "actors.group_size=4", "learner.tasks_per_step=2", "learner.checkpoint_every=1000",
        "monitoring.tensorboard=false", "monitoring.plots=false", "eval.every=0",
    ]


def seconds_per_step(trace_path: Path, warmup_steps: int) -> tuple[float, int]:
    """Mean seconds between consecutive published versions after the warm-up; and how many steps that covers."""
    stamps = [json.loads(line)["at"] for line in trace_path.read_text().splitlines()][warmup_steps:]
    if len(stamps) < 2:
        raise RuntimeError(f"{trace_path} has too few learner steps after {warmup_steps} warm-up steps")
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1), len(stamps) - 1


def _run(mode: str, settings: list[str], steps: int, run_dir: Path) -> dict:
    from slea.train import train

    config = load_config("configs/local.yaml", [*settings, f"run.id=bench-{mode}", f"learner.max_steps={steps}",
                                                f"actors.synchronous={mode == 'sync'}"])
    started = time.monotonic()
    code = train(config)
    if code != 0:
        raise RuntimeError(f"the {mode} run stopped with exit code {code}")
    return {"wall_s": time.monotonic() - started, "trace": run_dir / f"bench-{mode}" / "learner" / "trained_groups.jsonl"}


def bench_async(model: str = "smollm2-135m-instruct", measured_steps: int = 6, warmup_steps: int = 3,
                max_new_tokens: int = 32, envs_per_worker: int = 8) -> dict:
    # The runs' own output (DeepSpeed logs to stdout) goes to stderr: stdout is for the result (--json).
    with tempfile.TemporaryDirectory(prefix="slea-bench-async-") as tmp, contextlib.redirect_stdout(sys.stderr):
        model_name = model
        if model == TINY:
            from slea.models import tiny_model

            policy, tokenizer = tiny_model(seed=1)
            model_name = str(Path(tmp) / "tiny-policy")
            policy.save_pretrained(model_name)
            tokenizer.save_pretrained(model_name)
        settings = _settings(model_name, tmp, max_new_tokens, envs_per_worker)
        steps = warmup_steps + measured_steps + 1  # +1: the measured window spans measured_steps intervals
        runs = {mode: _run(mode, settings, steps, Path(tmp)) for mode in ("sync", "async")}
        (sync_s, measured), (async_s, _) = (seconds_per_step(runs[mode]["trace"], warmup_steps) for mode in ("sync", "async"))
    return {
        "sync_s_per_step": round(sync_s, 2),
        "async_s_per_step": round(async_s, 2),
        "speedup": round(sync_s / async_s, 2),
        "learner_steps": steps,
        "measured_steps": measured,
        "warmup_steps": warmup_steps,
        "sync_wall_s": round(runs["sync"]["wall_s"], 1),
        "async_wall_s": round(runs["async"]["wall_s"], 1),
        "model": model,
        "max_new_tokens": max_new_tokens,
        "config": "configs/local.yaml, " + ", ".join(s for s in settings if not s.startswith(("run.dir", "model.name"))),
    }
