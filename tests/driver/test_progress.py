"""What `slea train` prints: start-up phases as plain lines off a terminal, and the closing summary."""

import io
from pathlib import Path

from rich.console import Console

from driver.progress import Progress, RunConsole, eval_progress_text, shown_counts, summary_lines, time_line
from slea.config import load_config

REPO = Path(__file__).resolve().parents[2]


def plain_console() -> tuple[RunConsole, io.StringIO]:
    out = io.StringIO()
    return RunConsole(Console(file=out, force_terminal=False)), out


def test_off_a_terminal_each_phase_is_a_line_when_it_starts_and_one_with_its_duration():
    console, out = plain_console()
    with console.phase("starting Ray"):
        pass
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].endswith("starting Ray ...") and "starting Ray: done in" in lines[1]
    assert lines[0].split()[0].endswith("s")  # seconds since the command started
    console.note("a long line " * 20)
    assert len(out.getvalue().splitlines()) == 3  # one line in a log, however long


def pool_summary(steps: int, strategy_steps: int, warning_steps: int) -> dict:
    return {
        "episodes_finished": 4,
        "timers": {"steps": steps, "strategy_steps": strategy_steps, "warning_steps": warning_steps},
    }


def test_shown_counts_sum_the_workers():
    assert shown_counts([pool_summary(10, 2, 3), pool_summary(6, 1, 0)]) == (16, 3, 3)


def test_the_summary_says_what_changed_what_the_library_holds_and_where_things_are(tmp_path):
    config = load_config(REPO / "configs" / "local.yaml")
    progress = Progress(config)
    progress.add_step(
        {"learner_step": 2, "policy_version": 2, "episodes/simple/successes": 1, "episodes/simple/episodes": 4}
    )
    progress.add_step({"learner_step": 3, "policy_version": 3, "episodes/coin_collector/successes": 2,
                       "episodes/coin_collector/episodes": 8})  # fmt: skip
    evaluations = [
        {"step": 0, "eval/success_rate": 0.125, "eval/sampled/no_library/success_rate": 0.125,
         "eval/sampled/no_library/invalid_action_rate": 0.6},
        {"step": 3, "eval/success_rate": 0.25, "eval/sampled/no_library/success_rate": 0.125,
         "eval/sampled/no_library/invalid_action_rate": 0.3},
    ]  # fmt: skip
    library = {"version": 5, "experiences": {"strategy/method": 2, "strategy/example": 1, "warning/mistake": 4},
               "clusters": 9}  # fmt: skip
    run_dir = tmp_path / "local"
    lines = summary_lines(evaluations, progress, [pool_summary(40, 6, 11)], library, run_dir, run_dir / "ck", 300.0)
    assert lines[0] == "run local (slea, textworld): 3 learner steps, policy v3, 5.0 min"
    assert lines[1] == "training episodes: 3 of 12 won"
    assert lines[2] == (
        "held-out panel, step 0 -> 3: success as deployed (with the library when the run has one) 12% -> 25%; "
        "the policy alone 12% -> 12%; invalid actions 60% -> 30%"
    )
    assert lines[3] == (
        "library v5: 3 strategies, 4 warnings, 9 clusters; of 40 training prompts 6 showed strategies and 11 warnings"
    )
    assert str(run_dir / "plots") in lines[4] and str(run_dir / "ck" / "hf") in lines[5]
    assert (
        lines[6].startswith("next: slea library show")
        and f"--set learner.max_steps={2 * config.learner.max_steps}" in lines[6]
    )


def test_evaluation_progress_names_the_policy_and_logs_at_most_every_few_seconds():
    assert eval_progress_text(0, 3, 16) == "held-out evaluation of the base policy: 3 of 16 episodes played"
    assert eval_progress_text(5, 16, 16) == "held-out evaluation of the policy of step 5: 16 of 16 episodes played"
    progress = Progress(load_config(REPO / "configs" / "local.yaml"))
    assert progress.eval_progress((0, 1, 16)) is not None
    assert progress.eval_progress((0, 2, 16)) is None  # too soon after the last line
    assert progress.eval_running == (0, 2, 16)  # the live table still shows the newest count
    progress._eval_logged_at -= 60  # as if a minute had passed
    assert progress.eval_progress((0, 1, 16)) is None  # no news: no line
    assert progress.eval_progress((0, 3, 16)) is not None
    assert progress.eval_progress(None) is None and progress.eval_running is None


def test_the_time_line_says_where_each_process_spent_the_run():
    entries = [
        {"step": 0, "eval/success_rate": 0.2, "eval/seconds": 120.4},
        {"step": 1, "learner/step_seconds": 50.0, "learner/wait_seconds": 30.0},
        {"step": 2, "learner/step_seconds": 40.2, "learner/wait_seconds": 5.0},
        {"step": 2, "eval/success_rate": 0.3, "eval/seconds": 60.0},
    ]
    timers = {
        "generation_s": 150.0, "env_s": 2.0, "retrieval_wait_s": 3.0, "overhead_s": 1.0,
        "prefill_s": 90.0, "decode_s": 40.0, "prompt_tokens": 1000, "cached_prompt_tokens": 0,
    }  # fmt: skip
    pool = [
        {"engine": "transformers", "busy_s": 80.0, "throttled_s": 20.0, "timers": timers},
        {
            "engine": "transformers", "busy_s": 70.0, "throttled_s": 0.0,
            "timers": {**timers, "generation_s": 100.0, "prefill_s": 60.0, "decode_s": 30.0},
        },
    ]  # fmt: skip
    assert time_line(entries, pool, startup_s=61.3, wall_s=400.0) == (
        "time, of 400 s: start-up 61 s | learner 90 s training (2 updates), 35 s waiting for groups | "
        "held-out evaluation 180 s (120 + 60) | actors busy 150 s (engine 250, environments 4, library 6, ours 2; "
        "engine: prefill 150, decode 70, queued 30), held back 20 s"
    )
    assert "held-out evaluation 0 s (none)" in time_line([], [], 1.0, 2.0)


def test_the_time_line_gives_vllms_prefix_cache_share_of_the_prompt_tokens():
    timers = {
        "generation_s": 10.0, "env_s": 0.0, "retrieval_wait_s": 0.0, "overhead_s": 0.0,
        "prefill_s": 4.0, "decode_s": 5.0, "prompt_tokens": 800, "cached_prompt_tokens": 200,
    }  # fmt: skip
    pool = [{"engine": "vllm", "busy_s": 10.0, "throttled_s": 0.0, "timers": timers}] * 2
    assert time_line([], pool, 1.0, 30.0).endswith(
        "engine: prefill 8, decode 10, queued 2; prefix cache 25% of 1600 prompt tokens), held back 0 s"
    )
