"""`slea train`: bring up a run's services and components from one config.

What runs today: the run directory with its resolved config, the Redis step stream (embedded
when no URL is configured) with both consumer groups, and the environment with its held-out
evaluation panel. The actor pool, learner loop and library consumer join here as their
issues land (actors: #6, end to end: #7); until then the command says so and stops cleanly.
"""

from __future__ import annotations

from rich.console import Console

from slea.config import SleaConfig
from slea.redis_conn import connect
from slea.services import STREAM_GROUPS, prepare_run_dir, redis_for_run, sigterm_as_interrupt
from slea.stream_admin import group_stats
from slea.streams import ensure_group


def train(config: SleaConfig, resume_dir: str | None = None) -> int:
    console = Console(stderr=True)
    run_dir = prepare_run_dir(config, resume_dir)
    console.print(f"[bold]slea train[/] run [cyan]{config.run.id}[/] preset [cyan]{config.run.preset}[/] in {run_dir}")
    with sigterm_as_interrupt(), redis_for_run(config, run_dir) as url:
        client = connect(config.redis, url)
        stream = config.stream_key()
        for group in STREAM_GROUPS:
            ensure_group(client, stream, group)
        stats = group_stats(client, stream)
        console.print(f"stream {stream} at {url}: groups " + ", ".join(f"{name} (lag {s.lag})" for name, s in stats.items()))

        from actors.envs.registry import make_env
        from actors.envs.tasks import TaskSampler, panel_tasks

        env = make_env(config.envs.name, config.envs.params, config.envs.max_steps, config.envs.plugins)
        panel = panel_tasks(env, config.envs.eval_panel, size=config.envs.panel_size)
        first_task = next(TaskSampler(env, config.run.seed, held_out=panel))
        console.print(f"env {env.name}: task types {', '.join(env.task_types())}; panel '{config.envs.eval_panel}' "
                      f"of {len(panel)} tasks; first training task {first_task.task_id}")
        env.close()
        client.close()
    console.print("[yellow]the actor pool, learner loop and library consumer are not wired into `slea train` yet "
                  "(issues 6 and 7): services checked, nothing trained[/]")
    return 0
