"""Summary metrics, timeline and plots of cluster runs, on hand-made records."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from analysis.config import SLOConfig
from analysis.metrics import summarize
from analysis.plots import queue_by_class, write_plots
from analysis.report import format_summary, write_run
from sim.records import LogHistogram, Records


def requests() -> pd.DataFrame:
    return pd.DataFrame({
        "request_id": [0, 1, 2, 3], "client": [-1] * 4, "request_class": ["chat", "chat",
                                                                          "batch", "batch"],
        "replica": [0, 1, 1, -1], "prefill_replica": [-1] * 4,
        "arrival_s": [0.0, 1.0, 1.0, 2.0], "first_scheduled_s": [0.5, 1.0, 2.0, np.nan],
        "first_token_s": [1.0, 1.2, 3.0, np.nan], "completion_s": [2.0, 1.2, 4.0, 2.0],
        "kv_transfer_start_s": [np.nan] * 4, "kv_transfer_end_s": [np.nan] * 4,
        "input_tokens": [100, 300, 600, 10**6], "output_tokens": [11, 1, 3, 5],
        "generated_tokens": [11, 1, 3, 0], "cached_tokens": [50, 0, 300, 0],
        "num_preemptions": [1, 0, 2, 0], "num_swaps": [0, 0, 1, 0], "num_retries": [0, 2, 0, 0],
        "priority": [0, 0, 1, 1], "ttft_slo_ms": [500.0, 500.0, 1000.0, 1000.0],
        "status": ["completed", "completed", "completed", "rejected"],
        "reject_reason": ["", "", "", "exceeds_max_model_len"]})


def timeline() -> pd.DataFrame:
    """Two replicas (capacities 101 and 201 blocks) and one KV-transfer row."""
    return pd.DataFrame({
        "replica": np.array([0, 1, 0, 1, 1], np.int32),
        "time_s": [0.0, 0.0, 1.0, 1.0, 1.5], "step_time_s": [1.0, 1.0, 1.0, 3.0, 0.5],
        "batch_size": [1, 2, 3, 4, 1], "scheduled_tokens": [5, 6, 7, 8, 600],
        "prefill_tokens": [0] * 5, "decode_tokens": [1] * 5, "queue_length": [0, 1, 2, 3, 0],
        "kv_blocks_used": [10, 20, 30, 40, 38], "compute_s": [1.0, 0.0, 1.0, 0.0, 0.0],
        "memory_s": [0.0, 1.0, 0.0, 3.0, 0.0], "comm_s": [0.0, 0.0, 0.0, 0.0, 0.5],
        "host_s": [0.0] * 5, "bound": np.array([0, 1, 0, 1, 2], np.int8),
        "kind": np.array([0, 0, 0, 0, 1], np.int8)})


def records(**meta) -> Records:
    itl = LogHistogram()
    itl.add(np.array([0.1] * 12))
    m = {"num_gpu_blocks": 101, "replica_num_gpu_blocks": [101, 201], "num_replicas": 2,
         "replica_pools": ["mixed", "mixed"], "sim_time_s": 10.0, "replica_downtime_s": 5.0,
         "num_failures": 2, "prefix_caching": True}
    m.update(meta)
    return Records(requests(), timeline(), itl, m)


def test_kv_cluster_and_step_metrics():
    s = summarize(records())
    assert (s["num_preemptions"], s["num_swaps"]) == (3, 1)
    assert s["prefix_cache_hit_rate"] == pytest.approx(350 / 1000)  # completed prompts only
    assert s["num_replicas"] == 2 and s["num_failures"] == 2
    assert (s["retried_requests"], s["num_retries"]) == (1, 2)
    assert s["availability"] == pytest.approx(1 - 5.0 / (2 * 10.0))
    # the transfer row is not a step; KV usage is per replica's own capacity, time-weighted
    assert s["num_steps"] == 4
    assert s["mean_batch_size"] == pytest.approx((1 + 2 + 3 + 4 * 3) / 6)
    usage = np.array([10 / 101, 20 / 201, 30 / 101, 40 / 201])
    assert s["mean_kv_usage"] == pytest.approx(np.average(usage, weights=[1, 1, 1, 3]))
    assert s["comm_bound_share"] == 0.0
    assert "mean_kv_transfer_ms" not in s
    assert math.isnan(summarize(records(prefix_caching=False))["prefix_cache_hit_rate"])


def test_per_class_metrics():
    s = summarize(records(), SLOConfig(name="x", ttft_ms=600))
    chat, batch = s["classes"]["chat"], s["classes"]["batch"]
    assert (chat["completed"], chat["rejected"]) == (2, 0)
    assert (batch["completed"], batch["rejected"]) == (1, 1)
    assert chat["mean_ttft_ms"] == pytest.approx(600.0)     # (1000 + 200) / 2
    assert batch["p99_ttft_ms"] == pytest.approx(2000.0)
    assert chat["slo_attainment"] == pytest.approx(0.5)     # 1000 ms misses 600
    assert chat["ttft_slo_attainment"] == pytest.approx(0.5)  # own target 500 ms
    assert batch["ttft_slo_attainment"] == pytest.approx(0.0)  # 2000 > 1000; a rejection
    assert chat["request_throughput"] == pytest.approx(2 / 4.0)


def test_kv_transfer_metrics_of_a_disaggregated_run():
    rec = records()
    rec.requests["kv_transfer_start_s"] = [0.6, 1.05, 2.1, np.nan]
    rec.requests["kv_transfer_end_s"] = [0.7, 1.1, 2.4, np.nan]
    s = summarize(rec)
    assert s["mean_kv_transfer_ms"] == pytest.approx((100 + 50 + 300) / 3)


def test_queue_by_class_counts_requests_not_yet_scheduled():
    q = queue_by_class(requests(), np.array([0.0, 0.6, 1.0, 1.5, 2.5]))
    batch = q[q["class"] == "batch"]["waiting"].tolist()
    chat = q[q["class"] == "chat"]["waiting"].tolist()
    assert chat == [1, 0, 0, 0, 0]   # request 0 waits 0 → 0.5; request 1 starts on arrival
    assert batch == [0, 0, 1, 1, 0]  # request 2 waits 1 → 2; the rejected one never queues


def test_files_and_plots_of_a_cluster_run(tmp_path):
    rec = records()
    s = summarize(rec)
    write_run(rec, s, tmp_path)
    tl = pd.read_parquet(tmp_path / "timeline.parquet")
    assert tl["kind"].astype(str).tolist() == ["step"] * 4 + ["kv_transfer"]
    assert json.loads((tmp_path / "summary.json").read_text())["classes"]["chat"]["completed"] \
        == 2
    paths = write_plots(rec, tmp_path)
    assert all(p.stat().st_size > 0 for p in paths)
    text = format_summary(s)
    assert "Replicas" in text and "Availability" in text and "[chat] P99 TTFT" in text
