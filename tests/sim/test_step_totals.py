"""``timeline: false``: running step totals instead of one row per step, same summary."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis.metrics import step_metrics, summarize
from analysis.report import write_tables
from sim import simulate
from sim.engine.replica import TIMELINE_COLUMNS
from sim.records import ColumnBuffer, StepTotals

SMALL = ["workload.num_requests=300", "workload.rate=8"]
CASES = {
    "one replica, fast-forward": [],
    "one replica, stepping": ["fast_forward=false"],
    "sarathi, preemption": ["scheduler=sarathi", "kv_cache.num_gpu_blocks=200"],
    "four replicas, failures and stragglers": [
        "cluster.replicas=4", "workload.rate=30", "cluster.failure.mtbf_s=4",
        "cluster.failure.mttr_s=1", "cluster.straggler.fraction=0.5",
        "cluster.straggler.factor=2"],
    "disaggregated": ["cluster=disagg"],
}


@pytest.mark.parametrize("overrides", CASES.values(), ids=CASES.keys())
def test_step_totals_give_the_timeline_summary(compose_cfg, requests_for, overrides):
    cfg = compose_cfg(*SMALL, *overrides)
    req = requests_for(cfg)
    full = simulate(cfg, req)
    cfg.timeline = False
    totals = simulate(cfg, req)
    pd.testing.assert_frame_equal(full.requests, totals.requests)
    assert len(totals.timeline) == 0 and list(totals.timeline.columns) == list(
        full.timeline.columns)
    a, b = summarize(full), summarize(totals)
    assert a.keys() == b.keys()
    for key, value in a.items():
        if isinstance(value, float) and not math.isnan(value):
            assert b[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
        elif not isinstance(value, float):
            assert b[key] == value, key
    assert b["num_steps"] > 0 and b["mean_kv_usage"] > 0


def test_step_totals_sum_what_a_timeline_buffer_holds():
    rng = np.random.default_rng(0)
    rows, totals = ColumnBuffer(TIMELINE_COLUMNS, capacity=2), StepTotals()
    for _ in range(20):
        if rng.random() < 0.5:
            row = (0.0, rng.random(), rng.integers(1, 9), 5, 3, 2, 1, rng.integers(0, 99),
                   rng.random(), rng.random(), 0.0, rng.random(), 1, 0.0)
            rows.append(*row)
            totals.append(*row)
        else:
            k = int(rng.integers(1, 6))
            cols = (np.zeros(k), rng.random(k), 4, 4, 0, 4, 0, rng.integers(0, 99, k),
                    rng.random(k), rng.random(k), rng.random(k), rng.random(k), 1, 0.0)
            rows.extend(k, *cols)
            totals.extend(k, *cols)
    tl = rows.to_frame()
    meta = {"num_gpu_blocks": 100}
    assert step_metrics(tl, meta) == pytest.approx(
        step_metrics(tl, {**meta, "step_totals": [totals.to_dict()]}), rel=1e-12)
    assert totals.num_steps == len(tl) and totals.max_kv_blocks == tl["kv_blocks_used"].max()


def test_a_run_without_timeline_writes_no_timeline_file(compose_cfg, requests_for, tmp_path):
    (tmp_path / "timeline.parquet").write_bytes(b"stale, from an earlier run")
    cfg = compose_cfg(*SMALL, "timeline=false")
    paths = write_tables(simulate(cfg, requests_for(cfg)), tmp_path)
    assert [p.name for p in paths] == ["requests.parquet"]
    assert not (tmp_path / "timeline.parquet").exists()

