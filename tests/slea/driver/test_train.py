"""`slea train`'s metrics line, from a learner step, the stream lags and the actor workers' summaries."""

from slea.driver.train import run_metrics


def test_a_line_sums_the_workers_busy_and_throttled_seconds_and_their_tokens_by_engine():
    learner = {
        "learner_step": 3,
        "loss": 0.5,
        "staleness_histogram": {0: 4, 1: 2},
        "episodes/pick/episodes": 4,
        "episodes/pick/successes": 1,
        "episode_length_mean": 3.5,
    }
    pool = [
        {"busy_s": 2.5, "throttled_s": 1.0, "engine": "vllm", "timers": {"tokens": 30}},
        {"busy_s": 4.0, "throttled_s": 0.25, "engine": "vllm", "timers": {"tokens": 12}},
    ]
    line = run_metrics(learner, {"learner": 7}, None, pool)
    assert line == {
        "learner/learner_step": 3,
        "learner/loss": 0.5,
        "learner/staleness_histogram/0": 4,
        "learner/staleness_histogram/1": 2,
        "learner/episode_length_mean": 3.5,
        "actors/success_rate/pick": 0.25,
        "actors/success_rate": 0.25,
        "actors/episode_length": 3.5,
        "stream/lag/learner": 7,
        "actors/busy_s": 6.5,
        "actors/throttled_s": 1.25,
        "actors/tokens/vllm": 42,
    }
    assert "actors/busy_s" not in run_metrics(learner, {}, None)  # the shutdown drain has no summaries
