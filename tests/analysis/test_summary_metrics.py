"""Metric definitions (docs/metrics.md) on hand-made records."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.config import SLOConfig
from analysis.metrics import summarize
from sim.records import LogHistogram, Records


def records(itl_values=(0.01, 0.01, 0.02)) -> Records:
    req = pd.DataFrame({
        "request_id": [0, 1, 2], "client": [-1, -1, -1], "replica": [0, 0, 0],
        "arrival_s": [0.0, 1.0, 2.0], "first_scheduled_s": [0.0, 1.0, np.nan],
        "first_token_s": [0.1, 1.3, np.nan], "completion_s": [0.5, 1.3, 2.0],
        "input_tokens": [100, 200, 10**6], "output_tokens": [5, 1, 10],
        "generated_tokens": [5, 1, 0], "num_preemptions": [0, 0, 0],
        "status": ["completed", "completed", "rejected"],
        "reject_reason": ["", "", "exceeds_max_model_len"]})
    itl = LogHistogram(keep_samples=True)
    itl.add(np.array(itl_values))
    return Records(req, pd.DataFrame(), itl, {})


def test_vllm_metric_definitions():
    s = summarize(records())
    assert s["completed"] == 2 and s["rejected"] == 1
    assert s["rejected_reasons"] == {"exceeds_max_model_len": 1}
    assert s["duration_s"] == pytest.approx(1.3)           # first arrival → last completion
    assert s["request_throughput"] == pytest.approx(2 / 1.3)
    assert s["output_throughput"] == pytest.approx(6 / 1.3)
    assert s["total_token_throughput"] == pytest.approx(306 / 1.3)
    assert s["mean_ttft_ms"] == pytest.approx(200.0)        # (100 + 300) / 2
    assert s["mean_tpot_ms"] == pytest.approx(100.0)        # (500 − 100) / 4; 1-token: no TPOT
    assert s["mean_e2el_ms"] == pytest.approx(400.0)
    assert s["mean_itl_ms"] == pytest.approx(40 / 3)
    assert "request_goodput" not in s


def test_goodput_and_attainment():
    s = summarize(records(), SLOConfig(name="x", ttft_ms=150, tpot_ms=200))
    assert s["request_goodput"] == pytest.approx(1 / 1.3)   # only request 0 meets TTFT
    assert s["slo_attainment"] == pytest.approx(1 / 3)      # rejected requests count as misses


def test_itl_histogram_interpolates_like_numpy():
    h = LogHistogram()
    h.add(np.array([0.010, 0.020]))
    assert h.quantile(0.5) == pytest.approx(0.015)
    h = LogHistogram()
    h.add_repeated(np.array([0.012]), 990)
    h.add_repeated(np.array([0.250]), 10)
    x = np.concatenate([np.full(990, 0.012), np.full(10, 0.250)])
    for q in (0.5, 0.9, 0.99, 0.995):
        assert h.quantile(q) == pytest.approx(np.percentile(x, q * 100), rel=1e-9)


def test_itl_histogram_quantiles_are_within_a_tenth_of_a_percent():
    rng = np.random.default_rng(0)
    x = rng.lognormal(np.log(0.02), 0.8, 100_000)
    h = LogHistogram()
    h.add(x)
    h.add_repeated(np.array([0.03, 0.05]), 1000)
    allx = np.concatenate([x, np.full(1000, 0.03), np.full(1000, 0.05)])
    assert h.count == len(allx) and h.total == pytest.approx(allx.sum())
    for q in (0.5, 0.9, 0.99):
        assert h.quantile(q) == pytest.approx(np.percentile(allx, q * 100), rel=2e-3)
