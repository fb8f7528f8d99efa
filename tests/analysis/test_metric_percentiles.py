"""``metrics.percentiles``: the latency percentiles a run reports, named as ``vllm bench serve
--metric-percentiles`` names them (``median_``, ``p99_``, ``p99.9_``), in ``summary.json`` and
the printed tables; the default ([50, 90, 99]) keeps today's keys."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from analysis.diffusion_metrics import summarize_jobs
from analysis.metrics import (
    MetricsConfig,
    check_metrics,
    percentile_label,
    summarize,
    value_stats,
)
from analysis.report import format_job_summary, format_summary
from sim.diffusion.records import DiffusionRecords
from sim.errors import ConfigError
from sim.records import LogHistogram, Records

CHOSEN = [50, 90, 95, 99, 99.9]
STATS = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")


def records(n: int = 200) -> Records:
    """``n`` completed requests with spread latencies (two classes), and their ITL gaps."""
    rng = np.random.default_rng(0)
    arrival = np.arange(n) * 0.1
    ttft = rng.lognormal(-2.0, 0.8, n)
    out = rng.integers(2, 50, n)
    e2e = ttft + out * rng.uniform(0.01, 0.03, n)
    req = pd.DataFrame({
        "request_id": np.arange(n), "client": -1, "replica": 0, "arrival_s": arrival,
        "first_scheduled_s": arrival, "first_token_s": arrival + ttft,
        "completion_s": arrival + e2e, "input_tokens": 100, "output_tokens": out,
        "generated_tokens": out, "num_preemptions": 0, "status": "completed",
        "reject_reason": "", "request_class": np.where(np.arange(n) % 2, "a", "b")})
    itl = LogHistogram(keep_samples=True)
    itl.add(rng.uniform(0.005, 0.05, 1000))
    return Records(req, pd.DataFrame(), itl, {})


def job_records(n: int = 100) -> DiffusionRecords:
    rng = np.random.default_rng(1)
    arrival = np.sort(rng.uniform(0, 100, n))
    queue, service = rng.uniform(0, 5, n), rng.uniform(1, 10, n)
    jobs = pd.DataFrame({
        "job_id": np.arange(n), "status": "completed", "arrival_s": arrival,
        "start_s": arrival + queue, "completion_s": arrival + queue + service,
        "service_s": service, "step_s": 0.1, "frames": 1, "images": 1, "batch_size": 1,
        "num_preemptions": 0, "num_restarts": 0, "reject_reason": "", "fail_reason": ""})
    nodes = pd.DataFrame({"time_s": [0.0], "node": [0], "busy_gpus": [0], "running_jobs": [0],
                          "up": [True]})
    return DiffusionRecords(jobs, nodes, {"num_nodes": 1, "gpus_per_node": 8,
                                          "sim_time_s": 120.0})


@pytest.mark.parametrize("q, label", [(50, "median"), (50.0, "median"), (90, "p90"),
                                      (99.0, "p99"), (99.9, "p99.9"), (99.99, "p99.99"),
                                      (100, "p100"), (0.5, "p0.5")])
def test_labels_are_vllm_names(q, label):
    """vLLM: ``p_word = str(int(p)) if int(p) == p else str(p)``, median for 50."""
    assert percentile_label(q) == label


def test_value_stats_reports_the_chosen_percentiles():
    v = np.random.default_rng(2).lognormal(size=500)
    d = value_stats("ttft_ms", v, [90, 99.9, 50])
    assert list(d) == ["mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "p99.9_ttft_ms"]
    assert d["p99.9_ttft_ms"] == pytest.approx(np.percentile(v, 99.9))
    assert d["median_ttft_ms"] == pytest.approx(np.median(v))
    # median is always reported, as vLLM does; an empty series gives NaN for each key
    assert list(value_stats("x", v, [99])) == ["mean_x", "median_x", "p99_x"]
    empty = value_stats("x", np.array([np.nan]), [95, 99.9])
    assert list(empty) == ["mean_x", "median_x", "p95_x", "p99.9_x"]
    assert all(math.isnan(x) for x in empty.values())


def test_default_keys_are_unchanged():
    s = summarize(records())
    for name in STATS:
        keys = [k for k in s if k.endswith(f"_{name}") and "." not in k]
        assert keys == [f"{p}_{name}" for p in ("mean", "median", "p90", "p99")], keys
    assert MetricsConfig().percentiles == [50, 90, 99]


def test_summarize_covers_ttft_tpot_itl_e2el_and_classes():
    rec = records()
    s = summarize(rec, percentiles=CHOSEN)
    for name in STATS:
        for p in ("mean", "median", "p90", "p95", "p99", "p99.9"):
            assert f"{p}_{name}" in s, (p, name)
        assert f"p50_{name}" not in s
    lat = (rec.requests["first_token_s"] - rec.requests["arrival_s"]) * 1e3
    assert s["p99.9_ttft_ms"] == pytest.approx(np.percentile(lat, 99.9))
    assert s["p95_itl_ms"] == pytest.approx(rec.itl.quantile(0.95) * 1e3)
    assert {"p95_ttft_ms", "p99.9_ttft_ms"} <= set(s["classes"]["a"])
    only = summarize(rec, percentiles=[99.9])
    assert "p99_ttft_ms" not in only and "p90_itl_ms" not in only
    assert "p99.9_e2el_ms" in only and "median_tpot_ms" in only


def test_the_percentiles_reach_llm_and_diffusion_summaries():
    s = summarize(records(), percentiles=[50, 99.9])
    j = summarize_jobs(job_records(), percentiles=[50, 99.9])
    assert "p99.9_ttft_ms" in s and "p99_ttft_ms" not in s
    assert "p99.9_job_latency_s" in j and "p90_job_queue_s" not in j
    assert "p99_ttft_ms" in summarize(records())  # the default


def test_printed_tables_show_the_chosen_percentiles():
    s = summarize(records(), percentiles=[50, 95, 99.9])
    text = format_summary(s)
    for title in ("TTFT (ms)", "TPOT (ms)", "ITL (ms)", "E2E latency (ms)"):
        rows = [ln.split("  ")[0] for ln in text.splitlines() if title in ln
                and not ln.startswith("[")]
        assert rows == [f"{p} {title}" for p in ("Mean", "Median", "P95", "P99.9")], rows
    assert "P90" not in text
    assert "[a] P99.9 TTFT (ms)" in text  # a class's tail: the highest percentile chosen
    default = format_summary(summarize(records()))
    assert "P90 TTFT (ms)" in default and "[a] P99 TTFT (ms)" in default
    jobs = format_job_summary(summarize_jobs(job_records(), [99.9]) | {
        "jobs_steady": True})
    assert "P99.9 job latency (s)" in jobs and "P90" not in jobs


@pytest.mark.parametrize("values, shown", [([], "[]"), ([0], "0"), ([-5], "-5"),
                                           ([100.5], "100.5"), ([99, 99.0], "99.0"),
                                           ([float("nan")], "nan")])
def test_bad_percentiles_are_one_line_errors(values, shown):
    with pytest.raises(ConfigError) as e:
        check_metrics(MetricsConfig(percentiles=values))
    line = str(e.value)
    assert "\n" not in line and line.startswith(f"metrics.percentiles={shown}"), line


def test_good_percentiles_pass():
    for values in ([50, 90, 99], [99.9], [0.1, 100], CHOSEN):
        check_metrics(MetricsConfig(percentiles=values))


def _sim(tmp_path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, CI="1")
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, "-m", "sim", "plots=false", "progress=false", *args,
                           f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


def test_cli_run_writes_and_prints_the_chosen_percentiles(tmp_path):
    proc = _sim(tmp_path, "workload.num_requests=30",
                "metrics.percentiles=[50,90,95,99,99.9]")
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    for name in STATS:
        assert all(f"{p}_{name}" in s for p in ("median", "p90", "p95", "p99", "p99.9"))
    assert "P99.9 TTFT (ms)" in proc.stdout and "P95 ITL (ms)" in proc.stdout


def test_cli_refuses_bad_percentiles(tmp_path):
    proc = _sim(tmp_path, "workload.num_requests=30", "metrics.percentiles=[50,101]")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: metrics.percentiles=101.0: each percentile a number in (0, 100]"]


def test_capacity_says_it_ignores_the_percentiles(monkeypatch, caplog, tmp_path):
    # a plan is judged by capacity.slo; the run-summary percentiles change nothing there
    import logging

    from hydra import compose, initialize_config_module

    import analysis.capacity as capacity
    from analysis.capacity_config import register

    register()

    class Stop(Exception):
        pass

    def stop(cfg):
        raise Stop

    monkeypatch.setattr(capacity, "evaluator", stop)
    for percentiles, warned in (("[50,99.9]", True), ("[50,90,99]", False)):
        with initialize_config_module("conf", version_base=None):
            cfg = compose("capacity", overrides=[f"metrics.percentiles={percentiles}"])
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="capacity"), pytest.raises(Stop):
            capacity.plan(cfg, tmp_path, [])
        lines = [r.getMessage() for r in caplog.records if "metrics.percentiles" in r.getMessage()]
        assert bool(lines) == warned, lines
        if warned:
            assert "is ignored" in lines[0] and "capacity.slo" in lines[0]
