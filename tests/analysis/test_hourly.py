"""A run whose traffic follows a daily curve, read hour by hour (``analysis.hourly``)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.hourly import format_hourly, hourly_metrics
from analysis.metrics import per_request_latencies
from analysis.stats import t_interval
from scenarios import requests_for_seed
from sim import simulate

HOURS = [0.3, 0.9, 0.6]  # multipliers of the peak, one per (compressed) hour
PEAK, HOUR_S = 5.0, 400.0  # req/s: one H100 serves Llama-3.1-8B chat up to about 6


def batch_mean(ttft_ms: np.ndarray, batches: int = 20):
    """Mean TTFT and its 99% half-width by batch means (a queue's TTFTs are correlated)."""
    n = len(ttft_ms) // batches * batches
    return t_interval(ttft_ms[:n].reshape(batches, -1).mean(axis=1), level=0.99)


def test_a_day_on_fixed_replicas_matches_steady_runs_at_each_hours_rate(compose_cfg):
    """One replica under a 3-hour profile (hours of 400 s): each hour's mean TTFT lies
    within the confidence intervals of a steady-state run at that hour's rate (independent
    seeds), and the hours differ from one another (the profile is not averaged away)."""
    over = ("workload=chat", f"workload.rate={PEAK}", "slo=none")
    day = compose_cfg(*over, f"workload.rate_profile.hourly={HOURS}",
                      f"workload.rate_profile.hour_s={HOUR_S}")
    req = simulate(day, requests_for_seed(day.workload, 1)).requests
    lat = per_request_latencies(req)
    hour = np.floor(req.loc[lat.index, "arrival_s"].to_numpy() / HOUR_S)
    means = []
    for h, weight in enumerate(HOURS):
        # the hour's first minute follows the previous hour's load: leave it out
        t0 = req.loc[lat.index, "arrival_s"].to_numpy() - h * HOUR_S
        varying = batch_mean(lat["ttft_ms"].to_numpy()[(hour == h) & (t0 >= 60)])
        steady_cfg = compose_cfg(*over, f"workload.rate={PEAK * weight}",
                                 f"workload.num_requests={int(PEAK * weight * 2 * HOUR_S)}",
                                 "seed=7")
        steady_req = simulate(steady_cfg, requests_for_seed(steady_cfg.workload, 7)).requests
        steady_lat = per_request_latencies(steady_req)
        warm = steady_req.loc[steady_lat.index, "arrival_s"].to_numpy() >= 60
        steady = batch_mean(steady_lat["ttft_ms"].to_numpy()[warm])
        gap = abs(varying.mean - steady.mean)
        assert gap <= np.hypot(varying.half_width, steady.half_width), (h, varying, steady)
        means.append(varying)
    low, high = means[0], means[1]  # 1.5 against 4.5 req/s
    assert high.mean - low.mean > high.half_width + low.half_width


def test_zero_delay_and_the_rate_policy_approach_the_per_hour_optimum(compose_cfg):
    """Issue 21's second target. The capacity search's largest rate one replica sustains
    under p99 TTFT <= 300 ms (``max_rate``: λ*) gives each hour's optimum,
    ``autoscaled_replicas`` = ceil(rate / λ*). A day at 2.8 λ* peak on an autoscaler with no
    scale-up delay and the ``rate`` policy at target λ* (HPA on the arrival rate, 30 s window:
    the policy that knows the capacity) keeps each hour's mean ready replicas within 0.35 of
    that optimum, the day's replica-hours within 5%, and the SLO met every hour."""
    from analysis.autoscaling import hourly_replicas
    from analysis.capacity_search import Evaluator, max_rate
    from analysis.forecast import autoscaled_replicas

    base = ("cost_model=constant", "cost_model.step_time_ms=50", "scheduler.max_num_seqs=4",
            "workload.input_tokens=50", "workload.output_tokens=10", "slo=none")
    one = compose_cfg(*base, "workload.num_requests=1500")
    ev = Evaluator(one, {"p99_ttft_ms": 300.0}, [0], "auto", 0.95)
    lam = max_rate(lambda r: ev(r, 1), 4.0, 0.05, 0.1, 100.0, 12).rate
    profile, hour_s, peak = [0.25, 0.5, 1.0, 1.0, 0.75, 0.5], 150.0, 2.8 * lam
    day = compose_cfg(*base, f"workload.rate={peak}", f"workload.rate_profile.hourly={profile}",
                      f"workload.rate_profile.hour_s={hour_s}", "cluster=autoscaled",
                      "cluster.autoscaler.policy=rate", f"cluster.autoscaler.target={lam}",
                      "cluster.autoscaler.rate_window_s=30", "cluster.autoscaler.interval_s=5",
                      "cluster.autoscaler.provision_s=0", "cluster.autoscaler.engine_start_s=0",
                      "cluster.autoscaler.storage_bandwidth=1e30",
                      "cluster.autoscaler.scale_down_stabilization_s=0")
    rec = simulate(day, requests_for_seed(day.workload, 0))
    optimum = autoscaled_replicas(peak, profile, lam, 0)
    assert optimum.tolist() == [1, 2, 3, 3, 3, 2]
    ready = np.array([h["ready_replicas"] for h in hourly_replicas(rec.meta, rec.requests,
                                                                    hour_s, len(profile))])
    assert np.abs(ready - optimum).max() <= 0.35, ready
    assert ready.sum() == pytest.approx(optimum.sum(), rel=0.05)
    p99 = [h["p99_ttft_ms"] for h in hourly_metrics(rec.requests, hour_s, len(profile))]
    assert max(p99) <= 300.0, p99


def test_hourly_rows_count_each_request_in_the_hour_it_arrived():
    req = pd.DataFrame({
        "request_id": [0, 1, 2, 3], "arrival_s": [0.5, 1.5, 1.9, 3.5],
        "first_token_s": [0.6, 1.9, np.nan, 3.6], "completion_s": [1.0, 2.3, np.nan, 3.7],
        "generated_tokens": [5, 5, 0, 1],
        "status": ["completed", "completed", "rejected", "completed"]})

    class SLO:
        ttft_ms, tpot_ms, e2el_ms = 200.0, None, None

    rows = hourly_metrics(req, 1.0, 4, SLO(), span_s=3.5)
    assert [r["arrivals"] for r in rows] == [1, 2, 0, 1]
    assert [r["completed"] for r in rows] == [1, 1, 0, 1]
    assert rows[1]["rejected"] == 1 and rows[1]["offered_rate"] == 2.0
    assert rows[1]["mean_ttft_ms"] == pytest.approx(400.0)
    assert rows[0]["slo_attainment"] == 1.0 and rows[1]["slo_attainment"] == 0.0
    assert np.isnan(rows[2]["slo_attainment"]) and np.isnan(rows[2]["mean_ttft_ms"])
    assert np.isnan(rows[3]["p99_tpot_ms"])  # one token: no TPOT
    assert rows[3]["offered_rate"] == 2.0  # one arrival in the half hour of the span
    assert len(format_hourly(rows).splitlines()) == 6
