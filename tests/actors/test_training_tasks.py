"""Held-out panels stay held out: training never samples a task that any evaluation of the run plays."""

from itertools import islice

from actors.envs.registry import make_env
from actors.envs.tasks import panel_tasks
from actors.worker import training_tasks
from slea.config import load_config


def test_training_holds_out_the_larger_of_the_two_panel_sizes():
    # The in-training evaluator plays eval.panel_size tasks; before, training held out only envs.panel_size.
    config = load_config(None, ["envs.name=frozenlake", "envs.panel_size=4", "eval.panel_size=12"])
    env = make_env("frozenlake", {}, None, {})
    sampler = training_tasks(env, config, seed=0)
    evaluated = {env.fingerprint(task) for task in panel_tasks(env, config.envs.eval_panel, size=12)}
    assert len(evaluated) == 12 and evaluated <= sampler.held_out
    assert not {env.fingerprint(task) for task in islice(sampler, 200)} & evaluated


def test_panels_of_one_name_are_prefixes_of_each_other():
    """What makes holding out the larger size enough (slea/config.py held_out_panel_size)."""
    env = make_env("frozenlake", {}, None, {})
    small, large = panel_tasks(env, "default", size=4), panel_tasks(env, "default", size=12)
    assert [env.fingerprint(task) for task in small] == [env.fingerprint(task) for task in large[:4]]
