"""``python -m analysis.capacity`` end to end: the maximum rate against the M/D/1 formula, the
verified replica count, capacity.json and its plot and report, and bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from analysis.report_md import write_report

STEP_MS, OUTPUT_TOKENS, WAIT_MS = 10.0, 1, 5.0
# M/D/1 with deterministic service D: Wq = ρ D / (2 (1 − ρ)), so the largest ρ with
# Wq <= W is 2W / (D + 2W) and the rate is ρ / D
D_S = STEP_MS * OUTPUT_TOKENS / 1e3
RHO = 2 * WAIT_MS / 1e3 / (D_S + 2 * WAIT_MS / 1e3)
MD1_RATE = RHO / D_S

MD1 = ["cost_model=constant", f"cost_model.step_time_ms={STEP_MS}", "scheduler.max_num_seqs=1",
       "workload=poisson", "workload.num_requests=10000", "workload.input_tokens=100",
       f"workload.output_tokens={OUTPUT_TOKENS}", "capacity.slo.p99_ttft_ms=null",
       "capacity.slo.p99_tpot_ms=null", f"capacity.slo.mean_wait_ms={WAIT_MS}",
       "capacity.search.rel_tol=0.01", "capacity.search.rate_start=40",
       "capacity.forecast.peak_rate=100", "capacity.verify.requests_per_replica=2000",
       "capacity.forecast.horizon_months=1"]
SMALL = ["cost_model=constant", "workload.num_requests=200", "capacity.search.min_rate=0.5"]
RUNS = {
    "md1": MD1,
    "unknown_metric": ["capacity.slo.p95_latency_ms=3"],
    "negative_traffic": ["capacity.forecast.growth=linear",
                         "capacity.forecast.growth_per_month=-0.4",
                         "capacity.forecast.horizon_months=4"],
    "unmeetable": [*SMALL, "capacity.slo.p99_ttft_ms=1"],
    "unknown_search_backend": ["capacity.config_search.backend=[bogus]"],
    "day_without_autoscaler": ["capacity.day.enabled=true"],
    # a day compressed into 5 s hours on an autoscaler that starts replicas in 1 s
    "day": [*SMALL, "capacity.forecast.peak_rate=20", "capacity.forecast.horizon_months=1",
            "cluster=autoscaled",
            "cluster.autoscaler.interval_s=1", "cluster.autoscaler.provision_s=1",
            "cluster.autoscaler.engine_start_s=0", "cluster.autoscaler.storage_bandwidth=1e15",
            "cluster.autoscaler.scale_down_stabilization_s=5", "capacity.day.enabled=true",
            "capacity.day.hour_s=5"],
}


def _run(args: list[str], cwd, outdir) -> subprocess.CompletedProcess:
    env = dict(os.environ, CI="1")
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, "-m", "analysis.capacity", *args,
                           f"hydra.run.dir={outdir}"], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every run of this module, started at once."""
    cwd = tmp_path_factory.mktemp("capacity")
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {k: pool.submit(_run, a, cwd, cwd / k) for k, a in RUNS.items()}
        return {k: (f.result(), cwd / k) for k, f in futures.items()}


def test_max_rate_matches_md1_and_the_cluster_is_verified(runs):
    proc, out = runs["md1"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads((out / "capacity.json").read_text())
    assert r["feasible"] and r["slo"] == {"mean_wait_ms": WAIT_MS}
    assert r["max_rate_per_replica"] == pytest.approx(MD1_RATE, rel=0.03)
    lo, hi = r["search"]["bracket"]
    assert lo < hi <= lo * 1.01
    # 100 req/s of 10 ms jobs: two servers hold the wait bound (ρ = 0.5 each), one cannot
    (p,) = r["periods"]
    assert r["replicas_needed"] == [2] and r["gpus_needed"] == [2] and p["verified"]
    assert p["at_size"]["ok"] and not p["one_fewer"]["ok"] and p["one_fewer"]["replicas"] == 1
    assert r["cost_per_hour"] == [pytest.approx(2 * r["gpu_hour_price"])]
    assert r["cost_per_million_tokens"][0] > 0
    assert (out / "capacity_gpus.png").read_bytes()[:4] == b"\x89PNG"
    assert "max rate per replica" in proc.stdout
    text = write_report(out).read_text()
    assert "# Capacity plan" in text and "capacity_gpus.png" in text
    assert "Maximum sustainable rate of one replica" in text


@pytest.mark.parametrize("name, field", [
    ("unknown_metric", "capacity.slo.p95_latency_ms"),
    ("negative_traffic", "capacity.forecast.growth_per_month"),
    ("unknown_search_backend", "capacity.config_search"),
    ("day_without_autoscaler", "capacity.day.enabled"),
])
def test_bad_input_is_one_line(runs, name, field):
    proc, out = runs[name]
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert err.startswith(f"error: {field}=") and "\n" not in err, err
    assert not (out / "capacity.json").exists()


def test_an_unmeetable_slo_says_so_and_reports_the_best(runs):
    proc, out = runs["unmeetable"]
    assert proc.returncode == 1
    err = proc.stderr.strip().splitlines()[-1]
    assert err.startswith("error: the SLO cannot be met") and "best found" in err
    r = json.loads((out / "capacity.json").read_text())
    assert not r["feasible"] and r["max_rate_per_replica"] is None
    assert r["best_found"]["violations"] and "periods" not in r
    assert "cannot be met" in write_report(out).read_text()


def test_a_day_on_the_autoscaler_is_planned_beside_the_peak_hour(runs):
    """capacity.day: the month's day (forecast.diurnal at its peak) on the autoscaled
    cluster: replicas follow the curve (more in the busy hours than at night), the day's
    GPU-hours are its billed replica-time scaled to a real day, and the verified peak-hour
    plan (a fixed count: the autoscaler is off in the search) stands beside it."""
    proc, out = runs["day"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads((out / "capacity.json").read_text())
    (p,) = r["periods"]
    assert p["verified"] and p["at_size"]["replicas"] == p["replicas"]
    d = p["day"]
    by_hour = d["replicas_by_hour"]
    assert len(by_hour) == 24 and d["hour_s"] == 5.0 and d["scale_ups"] >= 1
    assert max(by_hour[11:16]) > min(by_hour[2:5])  # afternoon against the small hours
    # billed replica-seconds / 5 s hours = real GPU-hours (one GPU a replica)
    assert d["gpu_hours"] == pytest.approx(sum(by_hour), rel=0.1)
    assert d["cost"] == pytest.approx(d["gpu_hours"] * r["gpu_hour_price"])
    assert all(0 <= h < 24 for h in d["hours_missing_slo"])
    assert "its day on the autoscaler" in proc.stdout
    assert "## A day on the autoscaler" in write_report(out).read_text()
