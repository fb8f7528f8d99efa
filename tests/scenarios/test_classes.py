"""Request classes: shares, columns, independence from arrivals and lengths, bad input."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from scenarios import RequestClassConfig, WorkloadConfig, WorkloadError, build_requests
from scenarios.classes import assign_classes, check_classes

CONF = Path(__file__).resolve().parents[2] / "conf"
TWO = [RequestClassConfig("interactive", 0.3, 0, 500.0), RequestClassConfig("batch", 0.7, 1)]


def _workload(classes, n=4000) -> WorkloadConfig:
    return WorkloadConfig(name="w", num_requests=n, classes=list(classes))


def test_columns_and_shares():
    df = build_requests(_workload(TWO), np.random.default_rng(0), np.random.default_rng(1))
    assert list(df.columns[-3:]) == ["request_class", "priority", "ttft_slo_ms"]
    assert df["priority"].dtype == np.int64 and df["ttft_slo_ms"].dtype == np.float64
    inter = df["request_class"] == "interactive"
    assert inter.mean() == pytest.approx(0.3, abs=0.03)  # 4000 draws: sd ≈ 0.007
    assert (df.loc[inter, "priority"] == 0).all() and (df.loc[~inter, "priority"] == 1).all()
    assert (df.loc[inter, "ttft_slo_ms"] == 500.0).all()
    assert np.isinf(df.loc[~inter, "ttft_slo_ms"]).all()  # no target: infinitely late


def test_classes_change_neither_arrivals_nor_lengths():
    plain = build_requests(_workload([]), np.random.default_rng(0), np.random.default_rng(1))
    split = build_requests(_workload(TWO), np.random.default_rng(0), np.random.default_rng(1))
    assert "request_class" not in plain
    cols = ["arrival_time_s", "input_tokens", "output_tokens"]
    assert plain[cols].equals(split[cols])


def test_same_seed_same_classes_and_one_class_takes_all():
    a = assign_classes(TWO, 100, np.random.default_rng(7))
    b = assign_classes(TWO, 100, np.random.default_rng(7))
    assert a.equals(b)
    only = assign_classes([RequestClassConfig("all", 1.0, 3, 200.0)], 50, np.random.default_rng(0))
    assert (only["request_class"] == "all").all() and (only["priority"] == 3).all()


@pytest.mark.parametrize("classes, field, value", [
    ([RequestClassConfig("a", 0.5), RequestClassConfig("b", 0.4)], "workload.classes",
     ["a", "b"]),
    ([RequestClassConfig("a", 0.5), RequestClassConfig("a", 0.5)], "workload.classes[1].name",
     "a"),
    ([RequestClassConfig("a", 0.0), RequestClassConfig("b", 1.0)],
     "workload.classes[0].share", 0.0),
    ([RequestClassConfig("a", 1.0, 0, -5.0)], "workload.classes[0].ttft_slo_ms", -5.0),
    ([RequestClassConfig("", 1.0)], "workload.classes[0].name", ""),
    ([RequestClassConfig("a", 1.0, 1.5)], "workload.classes[0].priority", 1.5),
])
def test_bad_classes_name_the_field(classes, field, value):
    with pytest.raises(WorkloadError) as e:
        check_classes(classes)
    assert (e.value.field, e.value.value) == (field, value)
    assert "\n" not in str(e.value)


def test_two_classes_yaml_composes_and_builds():
    ConfigStore.instance().store(group="workload", name="base_workload", node=WorkloadConfig)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(overrides=["+workload=two_classes", "workload.num_requests=500"])
    w = cfg.workload
    assert OmegaConf.get_type(w) is WorkloadConfig
    assert [c.name for c in w.classes] == ["interactive", "batch"]
    assert math.isclose(sum(c.share for c in w.classes), 1.0)
    df = build_requests(w, np.random.default_rng(0), np.random.default_rng(1))
    assert set(df["request_class"]) == {"interactive", "batch"}
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        with pytest.raises(Exception, match="share"):
            compose(overrides=["+workload=two_classes", "workload.classes.0.share=abc"])
