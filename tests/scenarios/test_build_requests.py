"""build_requests: the table's contract, determinism, common random numbers, DictConfig input."""

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from scenarios import LengthConfig, WorkloadConfig, WorkloadError, build_requests

COLUMNS = ["arrival_time_s", "input_tokens", "output_tokens", "client", "think_time_s"]
DTYPES = ["float64", "int64", "int64", "int64", "float64"]
CHAT_IN = LengthConfig(dist="lognormal", mu=11.1145, sigma=3.3236, low=1, high=8192)
CHAT_OUT = LengthConfig(dist="lognormal", mu=9.8008, sigma=2.3874, low=1, high=1024)


def chat(**kw) -> WorkloadConfig:
    return WorkloadConfig(name="chat", input=CHAT_IN, output=CHAT_OUT, **kw)


def build(w, seed_arrivals=1, seed_lengths=2) -> pd.DataFrame:
    return build_requests(
        w, np.random.default_rng(seed_arrivals), np.random.default_rng(seed_lengths)
    )


@pytest.mark.parametrize("arrival", ["poisson", "gamma", "closed_loop"])
def test_columns_dtypes_and_ranges(arrival):
    df = build(chat(arrival=arrival, num_requests=500, cv=2.0))
    assert list(df.columns) == COLUMNS
    assert [str(t) for t in df.dtypes] == DTYPES
    assert len(df) == 500
    assert df["input_tokens"].between(1, 8192).all()
    assert df["output_tokens"].between(1, 1024).all()
    assert df.index.equals(pd.RangeIndex(500))


@pytest.mark.parametrize("arrival", ["poisson", "gamma"])
def test_open_loop_rows_in_arrival_order(arrival):
    df = build(chat(arrival=arrival, num_requests=300))
    t = df["arrival_time_s"].to_numpy()
    assert t[0] > 0 and np.all(np.diff(t) >= 0)
    assert (df["client"] == -1).all() and (df["think_time_s"] == 0.0).all()


def test_closed_loop_rows():
    df = build(chat(arrival="closed_loop", num_requests=50, concurrency=16, think_time_s=0.5))
    assert df["client"].tolist() == [i % 16 for i in range(50)]
    first = df.groupby("client").head(1)
    assert first.index.tolist() == list(range(16))
    assert (first["arrival_time_s"] == 0.0).all() and (first["think_time_s"] == 0.0).all()
    later = df.drop(index=first.index)
    assert later["arrival_time_s"].isna().all() and (later["think_time_s"] == 0.5).all()


def test_same_seeds_identical_other_seeds_differ():
    w = chat(arrival="gamma", cv=3.0, num_requests=400)
    pd.testing.assert_frame_equal(build(w), build(w))
    assert not build(w).equals(build(w, seed_arrivals=9))
    assert not build(w).equals(build(w, seed_lengths=9))


def test_common_random_numbers_across_arrival_processes():
    """Same lengths stream, different arrival process: identical lengths."""
    a = build(chat(arrival="poisson", num_requests=300), seed_arrivals=1)
    b = build(chat(arrival="gamma", cv=2.0, num_requests=300), seed_arrivals=7)
    c = build(chat(arrival="closed_loop", num_requests=300), seed_arrivals=3)
    for other in (b, c):
        assert other["input_tokens"].equals(a["input_tokens"])
        assert other["output_tokens"].equals(a["output_tokens"])
    assert not a["arrival_time_s"].equals(b["arrival_time_s"])


def test_changing_input_dist_keeps_output_lengths():
    a = build(chat(num_requests=200))
    b = build(
        WorkloadConfig(
            name="x",
            num_requests=200,
            output=CHAT_OUT,
            input=LengthConfig(dist="uniform", low=1, high=50),
        )
    )
    assert a["output_tokens"].equals(b["output_tokens"])


def test_fixed_overrides_replace_distributions():
    df = build(chat(num_requests=100, input_tokens=512, output_tokens=7))
    assert (df["input_tokens"] == 512).all() and (df["output_tokens"] == 7).all()


def test_dictconfig_and_dataclass_give_the_same_table():
    w = chat(
        arrival="closed_loop", num_requests=100, think_time_dist="exponential", think_time_s=1.0
    )
    pd.testing.assert_frame_equal(build(w), build(OmegaConf.structured(w)))


def test_bad_config_raises_before_building():
    with pytest.raises(WorkloadError, match=r"^workload\.rate=0\.0: "):
        build(chat(rate=0.0))
