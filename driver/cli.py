"""`slea`: the command line. Each subcommand parses its arguments and calls one function.

Heavy imports (torch, ray, the envs) happen inside the command that needs them, so
`slea --help` and config errors answer instantly.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import sys
from pathlib import Path

from actors.envs.registry import PluginError, UnknownEnvError, load_plugins
from driver.local_ray import keep_local_ray_on_loopback
from driver.ray_disk import DiskTooFull, require_disk_room
from slea.config import ConfigError, apply_override, dump_config, load_config, parse_override
from slea.embedded_redis import RedisServerMissing


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("slea-rl")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _config_args(parser: argparse.ArgumentParser, required: bool = False) -> None:
    parser.add_argument("config", nargs=None if required else "?", help="run YAML file (configs/local.yaml)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set learner.lr=1e-5 (repeatable)",
    )


PLUGIN_HELP = (
    "an env of your own: NAME=module:Class (importable here and in every Ray worker) or "
    "NAME=path/to/adapter.py:Class (a file, no packaging needed; a relative path is from the current "
    "directory); the class subclasses actors.envs.base.TextEnv (docs/adding-an-env.md). Repeatable"
)
_PLUGIN_IN_CONFIG = (
    "; merged into the config's envs.plugins (a --plugin wins), so Ray workers and the run's config.yaml get it"
)
_PLUGIN_NAME = re.compile(r"[A-Za-z0-9_-]+")


def _plugin_arg(parser: argparse.ArgumentParser, help_text: str = PLUGIN_HELP) -> None:
    parser.add_argument("--plugin", dest="plugins", action="append", default=[], metavar="NAME=SPEC", help=help_text)


def _plugins(args: argparse.Namespace) -> dict[str, str]:
    """--plugin NAME=SPEC values as envs.plugins entries (a later one of the same name wins)."""
    plugins = {}
    for item in args.plugins:
        name, _, spec = item.partition("=")
        if not _PLUGIN_NAME.fullmatch(name) or not spec:
            raise PluginError(f"--plugin {item!r} must be NAME=module:Class or NAME=path/to/adapter.py:Class")
        plugins[name] = spec
    return plugins


def _plugin_overrides(args: argparse.Namespace) -> list[str]:
    """--plugin as --set envs.plugins.NAME=SPEC overrides, so the plugins travel in the run's config
    to every process that builds envs (actor workers, the evaluator) and into its config.yaml."""
    return [f"envs.plugins.{name}={json.dumps(spec)}" for name, spec in _plugins(args).items()]


def _print_result(result: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, indent=2, sort_keys=False))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")


def cmd_train(args: argparse.Namespace) -> int:
    if args.resume_existing:
        if args.resume:
            raise ConfigError("--resume and --resume-existing exclude each other: --resume names the run directory")
        if args.config is None:
            raise ConfigError("--resume-existing needs the run config that names run.dir and run.id")
        args.resume = existing_run(load_config(args.config, [*args.overrides, *_plugin_overrides(args)]))
        if args.resume is not None:
            args.config = None  # the run's own resolved config, as --resume reads it
            print(f"slea train: {args.resume} exists: continuing that run", file=sys.stderr)
    if args.resume and args.config is None:
        args.config = str(Path(args.resume) / "config.yaml")  # the run's own resolved config
    if args.config is None:  # the built-in defaults are the paper's GPU-scale run: never start them by accident
        raise ConfigError(
            "slea train needs a run config: `slea train configs/local.yaml` is the embedded CPU "
            "default (configs/ has the others), or `slea train --resume runs/<id>` continues a run"
        )
    config = load_config(args.config, [*args.overrides, *_plugin_overrides(args)])
    if config.ray.address is None:
        keep_local_ray_on_loopback()  # before a plugin or the driver imports ray
        require_disk_room()  # a raylet on a full disk fails tasks far from the cause (driver/ray_disk.py)
    load_plugins(config.envs.plugins)  # a bad plugin fails here, before Redis, Ray and the model start
    from driver.supervision import ComponentFailed
    from driver.train import train
    from slea.redis_conn import RedisBackpressure, RedisUnavailable

    try:
        return train(config, resume_dir=args.resume)
    except ComponentFailed as exc:  # a learner or library writer died past run.max_failures
        print(f"slea: {exc}", file=sys.stderr)
        return 1
    except (RedisUnavailable, RedisBackpressure) as exc:  # the driver's own writes gave up (its shutdown has run)
        run_dir = Path(config.run.dir) / config.run.id
        print(
            f"slea: the run stopped: Redis did not answer or take the driver's writes within redis.reconnect_max_s "
            f"({config.redis.reconnect_max_s:g} s); the learner checkpointed and the library snapshotted where they "
            f"could. Bring Redis back (runbook: SleaRedisMemoryNearLimit for a full one), then "
            f"`slea train --resume {run_dir}`. ({exc})",
            file=sys.stderr,
        )
        return 1


def existing_run(config) -> str | None:
    """The directory of `config`'s run when an earlier attempt left it (its resolved config is there), else None."""
    run_dir = Path(config.run.dir) / config.run.id
    return str(run_dir) if (run_dir / "config.yaml").is_file() else None


def cmd_config_show(args: argparse.Namespace) -> int:
    """The config a run would train with: the file, the overrides, the preset's fixed keys, every default."""
    print(dump_config(load_config(args.config, args.overrides)), end="")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from driver.doctor import run_doctor

    return run_doctor(json_output=args.json)


def cmd_pod_stop(args: argparse.Namespace) -> int:
    from driver.pod_stop import stop_pod

    return stop_pod(args.timeout_s)


def cmd_play(args: argparse.Namespace) -> int:
    from actors.envs.runner import EnvUnavailableError, play

    plugins = _plugins(args)
    env = args.env or (next(iter(plugins)) if len(plugins) == 1 else None)
    if env is None:
        print("slea play: say which env to play with --env NAME (or give exactly one --plugin)", file=sys.stderr)
        return 2
    params: dict = {}
    for item in args.param:
        apply_override(params, *parse_override(item))
    try:
        result = play(
            env,
            policy=args.policy,
            episodes=args.episodes,
            seed=args.seed,
            params=params,
            max_steps=args.max_steps,
            plugins=plugins,
        )
    except (EnvUnavailableError, ValueError) as exc:  # a missing dependency, bad params, no expert
        print(f"slea play: {exc}", file=sys.stderr)
        return 2
    _print_result(result, args.json)
    return 0


def _run_bench(args: argparse.Namespace) -> tuple[int, dict | None, str | None]:
    """(exit code, result to print, or the async report's text) of the chosen benchmark."""
    if args.target == "stream":
        from driver.bench_stream import bench_stream

        result = bench_stream(records=args.records, producers=args.producers)
    elif args.target == "envs":
        from actors.envs.runner import bench_envs

        result = bench_envs(args.env or None)
    elif args.target == "learner":
        from learner.bench import bench_learner

        result = bench_learner()
    elif args.target == "retrieval":
        from library.bench import bench_retrieval

        require_disk_room()  # the one benchmark that starts Ray itself (`async` runs `slea train`, which asks)
        result = bench_retrieval()
    elif args.target == "actors":
        from actors.bench import bench_actors

        result = bench_actors()
    elif args.target == "cores":
        from driver.bench_cores import DEFAULT_MODEL as CORES_MODEL
        from driver.bench_cores import bench_cores

        try:
            result = bench_cores(model_name=args.model or CORES_MODEL)
        except RuntimeError as exc:  # one core only, or a measuring process failed
            print(f"slea bench cores: {exc}", file=sys.stderr)
            return 1, None, None
    else:  # "async", the last of the parser's choices
        from driver.bench_async import DEFAULT_MODEL, bench_async, format_report

        try:
            result = bench_async(
                model=args.model or DEFAULT_MODEL,
                measured_steps=args.steps,
                warmup_steps=args.warmup,
                timeout_s=args.timeout,
            )
        except (TimeoutError, RuntimeError, ValueError) as exc:  # a run past the deadline, failed, or too few steps
            print(f"slea bench async: {exc}", file=sys.stderr)
            return 1, None, None
        if not args.json:
            return 0, None, format_report(result)
    return 0, result, None


def cmd_bench(args: argparse.Namespace) -> int:
    keep_local_ray_on_loopback()  # every benchmark's Ray is its own, on this machine
    with stdout_to_stderr():  # stdout carries the result alone: `slea bench ... --json | jq` works
        code, result, text = _run_bench(args)
    if text is not None:
        print(text)
    elif result is not None:
        _print_result(result, args.json)
    return code


@contextlib.contextmanager
def stdout_to_stderr():
    """What a benchmark's or an evaluation's libraries print (DeepSpeed's and vLLM's log lines, a C++ op's build
    message) and what their subprocesses write to file descriptor 1 goes to stderr meanwhile."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def cmd_serve_library(args: argparse.Namespace) -> int:
    config = load_config(args.config, args.overrides)
    from library.service import serve_library

    return serve_library(config, run_dir=args.run_dir)


def cmd_library_show(args: argparse.Namespace) -> int:
    from library.persistence import show_library

    print(show_library(args.run_dir, top=args.top))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from driver.evaluate import evaluate

    try:
        with stdout_to_stderr():  # stdout carries the report alone: `slea eval ... --json | jq` works with vLLM too
            report = evaluate(
                args.model,
                args.env,
                args.panel,
                samples_per_task=args.episodes_per_task,
                ks=args.ks,
                budgets=args.budgets,
                config_file=args.config,
                overrides=[*args.overrides, *_plugin_overrides(args)],
                out_dir=args.out,
                use_library=not args.no_library,
            )
    except ConfigError:
        raise  # main() reports config errors the same way for every command
    except ValueError as exc:  # k or T out of range, an empty panel
        print(f"slea eval: {exc}", file=sys.stderr)
        return 2
    if args.json:
        _print_result(report.report, as_json=True)
    else:
        print(report.files["markdown"].read_text())
        print("report files: " + ", ".join(str(path) for path in report.files.values()))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    try:
        if args.by_preset:
            from driver.study import study_report

            table, plots = study_report(args.runs, args.out_dir)
        else:
            from driver.run_outputs import compare_runs

            table, plot = compare_runs(args.runs, args.out, key=args.key)
            plots = [plot]
    except ValueError as exc:  # a run without the metric or without held-out episodes, a run counted twice
        print(f"slea compare: {exc}", file=sys.stderr)
        return 2
    print(table)
    print("plots: " + ", ".join(str(path) for path in plots))
    return 0


def cmd_scale(args: argparse.Namespace) -> int:
    from driver.scale import ScaleError, scale_run

    try:
        print(scale_run(args.run, args.actors, address=args.address))
    except ScaleError as exc:
        print(f"slea scale: {exc}", file=sys.stderr)
        return 2
    return 0


def _worker_count(text: str) -> int:
    """argparse type of --actors: a whole number of workers, 0 or more."""
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number of workers, got {text!r}") from None
    if count < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {count}")
    return count


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slea", description="SLEA-RL: step-level experience-augmented RL for LLM agents."
    )
    parser.add_argument("--version", action="version", version=f"slea {_version()}")
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", help="what to do (slea COMMAND --help)"
    )

    train = commands.add_parser("train", help="run training from a config (actors, learner, library)")
    _config_args(train)
    train.add_argument("--resume", metavar="RUN_DIR", help="continue a stopped run from its directory")
    train.add_argument(
        "--resume-existing",
        action="store_true",
        help="start the run, or continue it when <run.dir>/<run.id> already holds it (a retried job: "
        "the RayJob's entrypoint)",
    )
    _plugin_arg(train, PLUGIN_HELP + _PLUGIN_IN_CONFIG + "; select it with --set envs.name=NAME")
    train.set_defaults(func=cmd_train)

    scale = commands.add_parser(
        "scale",
        help="resize the actor pool of a running slea train (the learner and library go on)",
        description="Resize the actor pool of a running `slea train`: the driver adds or removes actor "
        "workers within seconds (removed ones finish or abandon their groups); the learner and the "
        "library never restart. On a Ray cluster the autoscaler adds or removes actor nodes to match.",
    )
    scale.add_argument(
        "run",
        metavar="RUN",
        help="the run: its directory (runs/<id>, whose driver.json names the Ray cluster) or its run id",
    )
    scale.add_argument(
        "--actors",
        type=_worker_count,
        required=True,
        metavar="N",
        help="actor workers the pool should have (0 or more)",
    )
    scale.add_argument(
        "--address",
        default="auto",
        help="Ray cluster to look for a run id on (default auto: the cluster of this node, e.g. a KubeRay head); "
        "a run directory names its own",
    )
    scale.set_defaults(func=cmd_scale)

    config = commands.add_parser("config", help="inspect run configs")
    config_commands = config.add_subparsers(
        dest="config_command", required=True, metavar="ACTION", help="what to do with the config"
    )
    config_show = config_commands.add_parser("show", help="print the fully resolved config (presets applied) as YAML")
    _config_args(config_show, required=True)
    config_show.set_defaults(func=cmd_config_show)

    evaluate = commands.add_parser("eval", help="play an evaluation panel and report success and Pass@(k,T)")
    evaluate.add_argument(
        "model",
        metavar="CHECKPOINT_OR_MODEL",
        help="run directory (newest checkpoint), checkpoint directory, model directory or model name",
    )
    evaluate.add_argument("--env", default=None, help="env name (default: the config's envs.name)")
    evaluate.add_argument("--panel", default=None, help="panel name (default: the config's envs.eval_panel)")
    evaluate.add_argument("--episodes-per-task", type=int, default=4, metavar="N", help="sampled episodes per task (n)")
    evaluate.add_argument("--k", dest="ks", type=int, action="append", metavar="K", help="Pass@k values (repeatable)")
    evaluate.add_argument(
        "--t", dest="budgets", type=int, action="append", metavar="T", help="step budgets T (repeatable)"
    )
    evaluate.add_argument("--out", default=None, metavar="DIR", help="report folder (default: <run dir>/eval/...)")
    evaluate.add_argument(
        "--config", default=None, metavar="FILE", help="run YAML (default: the run's own, else defaults)"
    )
    evaluate.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set envs.panel_size=10 (repeatable)",
    )
    evaluate.add_argument("--no-library", action="store_true", help="skip the with-library rows")
    _plugin_arg(evaluate, PLUGIN_HELP + _PLUGIN_IN_CONFIG + "; select it with --env NAME")
    evaluate.add_argument("--json", action="store_true", help="print the report as one JSON object")
    evaluate.set_defaults(func=cmd_eval)

    compare = commands.add_parser("compare", help="held-out learning curves of several runs: one plot, one table")
    compare.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories (labelled by run id and preset)")
    compare.add_argument("--out", default="learning_curves.png", metavar="PNG", help="plot file (per run)")
    compare.add_argument("--key", default="eval/success_rate", help="metrics.jsonl key to compare (per run)")
    compare.add_argument(
        "--by-preset",
        action="store_true",
        help="runs of one preset (and run.edge) are seeds of one arm: success, invalid actions and reward per "
        "arm and step, and each pair's difference, with 95%% t intervals over seeds (paired by seed where both "
        "arms ran the same seeds, else Welch) and their half-widths, beside a bootstrap over tasks (evaluation noise)",
    )
    compare.add_argument("--out-dir", default="study", metavar="DIR", help="--by-preset: where the plots go")
    compare.set_defaults(func=cmd_compare)

    play = commands.add_parser("play", help="play episodes of an env with an expert or random policy")
    play.add_argument(
        "--env",
        default=None,
        help="env name (alfworld, webshop, search_qa, textworld, frozenlake, sokoban, or a --plugin's NAME; "
        "default: the one --plugin)",
    )
    _plugin_arg(play)
    play.add_argument(
        "--policy",
        choices=["expert", "random"],
        default="expert",
        help="expert: the env's scripted solution; random: a random admissible action (default expert)",
    )
    play.add_argument("--episodes", type=int, default=10, metavar="N", help="episodes to play (default 10)")
    play.add_argument("--seed", type=int, default=0, help="seed of task sampling and the random policy (default 0)")
    play.add_argument(
        "--max-steps", type=int, default=None, metavar="N", help="step budget per episode (default: the env's own)"
    )
    play.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="env parameter, e.g. difficulty=easy, or games_dir=DIR (textworld: your own compiled games)",
    )
    play.add_argument("--json", action="store_true", help="print one JSON object")
    play.set_defaults(func=cmd_play)

    serve = commands.add_parser("serve-library", help="serve an experience library over Ray Serve (needs redis.url)")
    _config_args(serve)
    serve.add_argument("--run-dir", help="where the library snapshots live (default <run.dir>/<run.id>)")
    serve.set_defaults(func=cmd_serve_library)

    library = commands.add_parser("library", help="inspect an experience library")
    library_commands = library.add_subparsers(
        dest="library_command", required=True, metavar="ACTION", help="what to do with the library"
    )
    show = library_commands.add_parser("show", help="zones, levels, top items, clusters and version of a run's library")
    show.add_argument("run_dir", metavar="RUN", help="run directory")
    show.add_argument("--top", type=int, default=3, help="items shown per level")
    show.set_defaults(func=cmd_library_show)

    bench = commands.add_parser("bench", help="benchmarks that print ratios against an in-run baseline")
    bench.add_argument(
        "target",
        choices=["stream", "envs", "learner", "retrieval", "actors", "cores", "async"],
        help="what to measure (BENCHMARKS.md: each target's figures and how to read them)",
    )
    bench.add_argument("--json", action="store_true", help="print one JSON object")
    bench.add_argument("--records", type=int, default=20_000, help="stream: records to push through")
    bench.add_argument("--producers", type=int, default=4, help="stream: producer processes")
    bench.add_argument("--env", action="append", default=[], help="envs: restrict to these envs (repeatable)")
    bench.add_argument(
        "--model",
        default=None,
        help="async, cores: policy model (async also 'tiny': the random tiny test model; default SmolLM2)",
    )
    bench.add_argument(
        "--steps",
        type=int,
        default=None,
        help="async: learner steps measured per mode (default 6 tiny, 2 SmolLM2; more for a steadier figure)",
    )
    bench.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="async: learner steps left out at the start of each mode (default 3 tiny, 1 SmolLM2)",
    )
    bench.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="async: seconds both runs together may take; a run past it is stopped and the bench fails",
    )
    bench.set_defaults(func=cmd_bench)

    doctor = commands.add_parser("doctor", help="check this machine: Python, torch, Redis, Ray, GPU/vLLM, models")
    doctor.add_argument("--json", action="store_true", help="print one JSON object")
    doctor.set_defaults(func=cmd_doctor)

    pod_stop = commands.add_parser(
        "pod-stop",
        help="a Ray pod's preStop hook: stop the run's driver here gracefully and wait for slea's actors here to go",
    )
    pod_stop.add_argument(
        "--timeout-s",
        type=float,
        default=1020.0,
        help="give up waiting after this long (default 1020: the driver's whole graceful stop, driver/train.py)",
    )
    pod_stop.set_defaults(func=cmd_pod_stop)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"slea: config error: {exc}", file=sys.stderr)
        return 2
    except (RedisServerMissing, DiskTooFull, UnknownEnvError, FileNotFoundError, FileExistsError) as exc:
        print(f"slea: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("slea: interrupted", file=sys.stderr)
        return 130


def entry() -> None:
    """The `slea` console script: main(), then exit without interpreter teardown. Native
    libraries loaded by a command (torch, tokenizers, hnswlib, Ray's core worker) can segfault
    while the interpreter tears their threads down after the command has finished and written
    everything, which turned a successful `slea eval` into exit 139."""
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()
