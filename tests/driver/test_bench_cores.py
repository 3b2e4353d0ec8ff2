"""`slea bench cores`: the overlap gain by hand; then the real measurement on the tiny model."""

import pytest

from driver.bench_cores import bench_cores, overlap_gain
from slea.models import tiny_model


def test_overlap_gain_adds_each_roles_share_of_its_rate_alone():
    alone = {"learner": 100.0, "actor": 10.0}
    assert overlap_gain({"learner": 50.0, "actor": 5.0}, alone) == pytest.approx(1.0)  # as fast as taking turns
    assert overlap_gain({"learner": 60.0, "actor": 8.0}, alone) == pytest.approx(1.4)
    assert overlap_gain({"learner": 40.0, "actor": 5.0}, alone) == pytest.approx(0.9)  # slower than taking turns


@pytest.mark.slow  # eight measuring processes, each importing torch and transformers
def test_bench_cores_measures_every_setting_against_each_role_alone(tmp_path):
    policy, tokenizer = tiny_model(seed=1)
    policy.save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    result = bench_cores(model_name=str(tmp_path / "tiny"), seconds=1.0)
    cores = result["cores"]
    alone = result["alone_tokens_per_s"]
    assert set(alone) == {"learner", "actor"} and min(alone.values()) > 0
    assert result["default"]["wait_policy"] == "libgomp default"
    assert result["passive"]["wait_policy"] == result["split"]["wait_policy"] == "PASSIVE"
    assert result["passive"]["threads"] == {"learner": cores, "actor": 1}
    assert result["split"]["threads"] == {"learner": cores - 1, "actor": 1}
    for name in ("default", "passive", "split"):
        setting = result[name]
        rates = setting["tokens_per_s"]
        assert min(rates.values()) > 0
        for role in rates:
            assert setting["share_of_alone"][role] == pytest.approx(rates[role] / alone[role], abs=1e-3)
        assert setting["overlap_gain"] == pytest.approx(sum(setting["share_of_alone"].values()), abs=2e-3)
