"""The autoscaler in the loop (``sim.engine.autoscaler``): its policies' decisions without
SimPy, the scale-up delay by hand, and runs in which replicas start and drain."""

from __future__ import annotations

import signal
from collections import deque

import numpy as np
import pandas as pd
import pytest

from analysis.autoscaling import autoscaler_metrics, hourly_replicas, peak_billed
from scenarios import requests_for_seed
from sim import simulate
from sim.config.autoscaler import AutoscalerConfig
from sim.engine.autoscaler import (
    DRAINING,
    OFF,
    READY,
    STARTING,
    Stabilizer,
    hpa_recommendation,
    scale_up_delay_s,
    slo_recommendation,
    state_seconds,
    while_starting,
    windowed_rate,
)
from sim.errors import ConfigError


@pytest.mark.parametrize("ready, current, total, expected", [
    (2, 2, 12.0, 3),  # 6 per replica against 4: ceil(12 / 4)
    (2, 2, 8.4, 2),  # mean 4.2: within 10% of 4, no change
    (2, 3, 8.4, 3),  # ... the current count, a replica still starting included (as HPA)
    (4, 4, 0.0, 0),  # idle: as few as allowed (the bounds apply after)
    (3, 3, 30.0, 8),  # ceil(30 / 4)
    (1, 3, 8.0, 3),  # 8 on one ready replica: growing, but two starting at zero load
                     # bring the mean to 2.7 <= 4: wait for them (HPA's not-yet-ready rule)
    (1, 2, 12.0, 3),  # 12 over 2 counted replicas is still 6 > 4.4: grow to ceil(12 / 4)
])
def test_the_utilisation_policies_recommend_as_kubernetes_hpa(ready, current, total,
                                                             expected):
    assert hpa_recommendation(ready, current, total, 4.0, 0.1) == expected


def test_the_kv_usage_policy_is_hpa_on_the_mean_usage():
    # three replicas at 0.9, 0.8, 0.7 KV usage against a target of 0.6: ceil(2.4 / 0.6)
    assert hpa_recommendation(3, 3, 2.4, 0.6, 0.1) == 4


@pytest.mark.parametrize("ready, current, observed, waiting, expected", [
    (2, 2, [(0.9, 0.5)], 0, 3),  # a quantile over its bound: one more
    (2, 3, [(0.9, 0.5)], 0, 3),  # ... one is already starting: wait for it
    (2, 2, [(0.2, 0.5), (0.02, 0.05)], 0, 1),  # all below half: one fewer
    (2, 3, [(0.2, 0.5)], 0, 2),  # ... the start is the one given up
    (2, 2, [(0.2, 0.5)], 3, 2),  # ... unless requests wait
    (2, 3, [(0.3, 0.5)], 0, 3),  # between: hold, a start included
    (2, 2, [], 0, 1),  # nothing completed and nothing waits: idle
    (2, 2, [], 5, 3),  # nothing completed and requests wait: stuck
])
def test_the_slo_policy_steps_one_replica_on_the_observed_quantiles(ready, current, observed,
                                                                    waiting, expected):
    assert slo_recommendation(ready, current, observed, waiting, 0.5) == expected


def test_the_rate_policy_counts_the_arrivals_of_its_window():
    assert windowed_rate(deque([1.0, 2.0, 3.0]), 3.0, 60.0) == 1.0  # before a whole
    arrivals = deque([1.0, 2.0, 3.0, 10.0, 11.0])  # window: over the time so far
    assert windowed_rate(arrivals, 12.0, 5.0) == 2 / 5.0  # 10 and 11 are in (7, 12]
    assert list(arrivals) == [10.0, 11.0]  # the older ones are dropped
    assert windowed_rate(arrivals, 15.0, 5.0) == 1 / 5.0  # 10 is exactly 5 s old: out
    # a pool of 3 replicas at 4 req/s each on 17 req/s: HPA on the rate asks for 5
    assert hpa_recommendation(3, 3, 17.0, 4.0, 0.1) == 5


def test_stabilization_grows_on_the_lowest_and_shrinks_on_the_highest_recommendation():
    s = Stabilizer(up_s=30.0, down_s=60.0)
    assert s(0.0, 5, 2) == 5  # up: the lowest of the last 30 s is this one
    assert s(15.0, 2, 5) == 5  # down: the highest of the last 60 s is 5
    assert s(45.0, 3, 5) == 5
    assert s(75.0, 3, 5) == 3  # 5 was 75 s ago: the highest of the window is now 3
    s = Stabilizer(up_s=30.0, down_s=0.0)
    assert s(0.0, 2, 2) == 2
    assert s(10.0, 6, 2) == 2  # a recommendation of 2 in the last 30 s holds the count
    assert s(40.0, 6, 2) == 6  # 2 was 40 s ago; 6 at 10 s is exactly 30 s old: out


def test_a_window_keeps_recommendations_strictly_inside_it_as_hpa():
    """HPA keeps a recommendation while its time is after now − window: with the default
    300 s down window and 15 s evaluations, a 5 at t = 0 no longer holds at t = 300."""
    s = Stabilizer(up_s=0.0, down_s=300.0)
    assert s(0.0, 5, 5) == 5
    assert [s(t, 2, 5) for t in np.arange(15.0, 301.0, 15.0)][-2:] == [5, 2]


def test_the_scale_up_delay_adds_its_parts():
    a = AutoscalerConfig(provision_s=60.0, storage_bandwidth=2e9, engine_start_s=30.0)
    assert scale_up_delay_s(a, 16e9) == pytest.approx(60.0 + 8.0 + 30.0)


def test_state_seconds_and_ramps_read_the_state_log():
    log = np.array([[0, 0, READY], [0, 1, OFF], [10, 1, STARTING], [30, 1, READY],
                    [50, 1, DRAINING], [55, 1, OFF]], float)
    assert state_seconds(log, (STARTING, READY, DRAINING), 0, 100) == 100 + 45
    assert state_seconds(log, (READY,), 20, 40) == 20 + 10
    assert while_starting(log, np.array([5.0, 10.0, 29.9, 30.0])).tolist() == \
        [False, True, True, False]
    assert peak_billed(log) == 2


BURST = ("cost_model=constant", "cost_model.step_time_ms=10", "scheduler.max_num_seqs=4",
         "workload.input_tokens=50", "workload.output_tokens=20", "slo=none",
         "cluster.autoscaler.interval_s=5", "cluster.autoscaler.provision_s=10",
         "cluster.autoscaler.engine_start_s=0", "cluster.autoscaler.storage_bandwidth=1e15",
         "cluster.autoscaler.scale_down_stabilization_s=20", "cluster.autoscaler.target=2",
         "cluster.router=least_outstanding")
# 5 req/s, 60 req/s from 60 s to 120 s, 5 req/s to 240 s: one replica takes about 19
PROFILE = ("workload.rate=1", "workload.rate_profile.points=[{time_s: 0, multiplier: 5}, "
           "{time_s: 240, multiplier: 5}]",
           "workload.rate_profile.flash_crowds=[{start_s: 60, duration_s: 60, factor: 12}]")


@pytest.fixture(scope="module")
def burst_run():
    from hydra import compose, initialize_config_module
    with initialize_config_module("conf", version_base=None):
        cfg = compose("config", overrides=[*BURST, *PROFILE, "cluster.replicas=1",
                                           "cluster.autoscaler.policy=queue",
                                           "cluster.autoscaler.max_replicas=6",
                                           "check_invariants=true"])
    requests = requests_for_seed(cfg.workload, 0)
    return cfg, simulate(cfg, requests)


def test_a_flash_crowd_starts_replicas_that_serve_after_the_delay_and_drain_after(burst_run):
    """The crowd starts replicas; each is ready exactly the delay (10 s) after its start
    and first serves a request after that; after the crowd they drain and stop; every
    request completes (none lost in a drain) and no request reaches a replica off, starting
    or draining (the invariant checker ran every step)."""
    cfg, rec = burst_run
    a = rec.meta["autoscaler"]
    log = pd.DataFrame(a["log"], columns=["time_s", "replica", "state"])
    delay = a["scale_up_delay_s"]  # 10 s provisioning, 16 GB at 1e15 B/s
    assert delay == pytest.approx(10.0 + 14.96 * 2**30 / 1e15, rel=1e-4)
    starts = log[(log["state"] == STARTING) & (log["time_s"] > 0)]
    assert len(starts) >= 2 and (starts["time_s"] >= 60).all()
    req = rec.requests
    assert (req["status"] == "completed").all()
    for _, s in starts.iterrows():
        later = log[(log["replica"] == s["replica"]) & (log["time_s"] > s["time_s"])]
        ready = later.iloc[0]
        if ready["state"] != READY:  # cancelled before it was ready
            assert ready["state"] == OFF
            continue
        assert ready["time_s"] == pytest.approx(s["time_s"] + delay)
        served = req[req["replica"] == s["replica"]]["first_scheduled_s"]
        assert (served[served > s["time_s"]] >= ready["time_s"]).all()
    drains = log[log["state"] == DRAINING]
    assert len(drains) >= 1
    for _, d in drains.iterrows():  # nothing is routed to a draining replica
        mine = req[req["replica"] == d["replica"]]
        after = log[(log["replica"] == d["replica"]) & (log["time_s"] > d["time_s"])]
        until = after["time_s"].iloc[0] if len(after) else np.inf
        assert not ((mine["arrival_s"] > d["time_s"]) & (mine["arrival_s"] < until)).any()
        # it stops only once its last request ended
        if len(after) and after["state"].iloc[0] == OFF:
            held = mine[mine["arrival_s"] <= d["time_s"]]
            assert (held["completion_s"] <= until + 1e-9).all()
    assert log.groupby("replica")["state"].last().eq(READY).sum() >= 1


def billed_by_hand(log: np.ndarray, end: float) -> float:
    """Replica-seconds billed (starting, ready or draining) up to ``end``, walking the log
    replica by replica."""
    total = 0.0
    for r in np.unique(log[:, 1]):
        rows = log[log[:, 1] == r]
        for (t, _, state), nxt in zip(rows, [*rows[1:, 0], end], strict=True):
            if state != OFF:
                total += min(nxt, end) - t
    return total


def test_gpu_hours_follow_the_replicas_billed(burst_run):
    cfg, rec = burst_run
    m = autoscaler_metrics(rec.requests, rec.meta)
    log, end = rec.meta["autoscaler"]["log"], rec.meta["sim_time_s"]
    billed = billed_by_hand(log, end)
    assert billed == pytest.approx(state_seconds(log, (STARTING, READY, DRAINING), 0, end))
    assert m["gpu_hours"] == pytest.approx(billed / 3600)
    assert m["cost"] == pytest.approx(billed / 3600 * 3.0)
    assert 1 < m["mean_replicas"] < m["peak_replicas"] <= 6
    rows = hourly_replicas(rec.meta, rec.requests, 60.0, 4)  # "hours" of 60 s
    assert sum(r["gpu_hours"] for r in rows) == pytest.approx(m["gpu_hours"])
    assert rows[0]["replicas"] == 1 and rows[1]["replicas"] > 2  # the crowd's hour


def test_an_autoscaler_held_at_a_fixed_count_changes_nothing(compose_cfg):
    """min = max = 2: the same records as two replicas without an autoscaler (its
    evaluations add events, not order)."""
    over = (*BURST, *PROFILE, "cluster.replicas=2")
    fixed = compose_cfg(*over, "engine=python")
    held = compose_cfg(*over, "cluster.autoscaler.policy=queue",
                       "cluster.autoscaler.min_replicas=2", "cluster.autoscaler.max_replicas=2")
    req = requests_for_seed(fixed.workload, 0)
    a, b = simulate(fixed, req), simulate(held, req)
    pd.testing.assert_frame_equal(a.requests, b.requests)
    assert b.meta["engine"].startswith("python")  # both on the SimPy engine
    # and on the compiled loop (the roofline cost model): two fixed replicas
    over = ("workload.num_requests=400", "workload.rate=12", "cluster.replicas=2",
            "cluster.router=least_outstanding")
    req = requests_for_seed(compose_cfg(*over).workload, 0)
    fixed = simulate(compose_cfg(*over), req)
    held = simulate(compose_cfg(*over, "cluster.autoscaler.policy=queue",
                                "cluster.autoscaler.min_replicas=2",
                                "cluster.autoscaler.max_replicas=2"), req)
    assert held.meta["engine"] == fixed.meta["engine"] == "compiled"
    pd.testing.assert_frame_equal(fixed.requests, held.requests)


@pytest.mark.parametrize("over, field", [
    (["cluster.autoscaler.policy=hpa"], "cluster.autoscaler.policy"),
    (["cluster.autoscaler.policy=queue", "cluster.autoscaler.min_replicas=0"],
     "cluster.autoscaler.min_replicas"),
    (["cluster.autoscaler.policy=queue", "cluster.autoscaler.max_replicas=2",
      "cluster.replicas=3"], "cluster.replicas"),
    (["cluster.autoscaler.policy=queue", "cluster=disagg"], "cluster.autoscaler.policy"),
    (["cluster.autoscaler.policy=queue", "cluster.failure.mtbf_s=100"],
     "cluster.autoscaler.policy"),
    (["cluster.autoscaler.policy=kv_usage", "cluster.autoscaler.target=2"],
     "cluster.autoscaler.target"),
    (["cluster.autoscaler.policy=slo"], "cluster.autoscaler.slo_ttft_ms"),
    (["cluster.autoscaler.policy=slo", "cluster.autoscaler.slo_ttft_ms=500",
      "cluster.autoscaler.slo_quantile=1"], "cluster.autoscaler.slo_quantile"),
    (["cluster.autoscaler.policy=queue", "cluster.autoscaler.interval_s=0.5"],
     "cluster.autoscaler.interval_s"),
    (["cluster.autoscaler.policy=rate", "cluster.autoscaler.rate_window_s=0"],
     "cluster.autoscaler.rate_window_s"),
])
def test_a_bad_autoscaler_is_one_error_naming_its_field(compose_cfg, over, field):
    cfg = compose_cfg(*over, "workload.num_requests=5")
    with pytest.raises(ConfigError) as e:
        simulate(cfg, requests_for_seed(cfg.workload, 0))
    assert e.value.field == field


def test_a_drained_replica_finishes_what_it_holds_then_stops(compose_cfg):
    """Two replicas each running a few 300-token requests; the running-requests policy
    (target 10) wants one: at the first evaluation (5 s) one drains, takes no more
    requests, and stops at the instant its last request completes, not before."""
    cfg = compose_cfg(*BURST, "workload.output_tokens=300", "workload.rate=2",
                      "workload.num_requests=60", "cluster.replicas=2",
                      "cluster.autoscaler.policy=running", "cluster.autoscaler.target=10",
                      "cluster.autoscaler.scale_down_stabilization_s=0")
    rec = simulate(cfg, requests_for_seed(cfg.workload, 0))
    log = pd.DataFrame(rec.meta["autoscaler"]["log"], columns=["time_s", "replica", "state"])
    drain = log[log["state"] == DRAINING].iloc[0]
    r, t0 = int(drain["replica"]), drain["time_s"]
    assert t0 == 5.0
    off = log[(log["replica"] == r) & (log["time_s"] > t0 - 1e-9) & (log["state"] == OFF)]
    req = rec.requests
    mine = req[req["replica"] == r]
    held = mine[mine["arrival_s"] <= t0]
    assert len(held) >= 2 and (req["status"] == "completed").all()
    assert not (mine["arrival_s"] > t0).any()  # nothing routed to it after
    assert off["time_s"].iloc[0] == pytest.approx(held["completion_s"].max())
    assert held["completion_s"].min() > t0  # it was holding requests when it drained


def test_a_stalled_run_is_reported_not_ticked_through_forever(compose_cfg, monkeypatch):
    """A request lost by a bug (here: routing drops request 3) stalls the run: with an
    autoscaler, whose evaluations never run out, it must still end with the stall error."""
    from sim.engine.cluster import Cluster
    route = Cluster.route
    monkeypatch.setattr(Cluster, "route", lambda self, pool, rid: None if rid == 3
                        else route(self, pool, rid))
    cfg = compose_cfg(*BURST, "workload.num_requests=20", "cluster.autoscaler.policy=queue",
                      "cluster.autoscaler.max_replicas=2")

    def hung(signum, frame):  # a run ticked through forever fails here instead of hanging
        raise TimeoutError("the stalled run did not end")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    try:
        with pytest.raises(RuntimeError, match="simulation stalled with 1 unfinished"):
            simulate(cfg, requests_for_seed(cfg.workload, 0))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_an_autoscalers_spares_are_replicas_of_the_pool(compose_cfg):
    """Replica ids run to max_replicas: a straggler may be a spare (it is slow once it
    starts), and the config check accepts its id."""
    cfg = compose_cfg(*BURST, *PROFILE, "cluster.replicas=1", "cluster.autoscaler.policy=queue",
                      "cluster.autoscaler.max_replicas=6", "cluster.straggler.replicas=[5]")
    rec = simulate(cfg, requests_for_seed(cfg.workload, 0))
    assert (rec.requests["status"] == "completed").all()
    assert rec.meta["num_replicas"] == 6


def test_a_comparison_refuses_an_autoscaled_run(tmp_path):
    """analysis.compare divides throughput by a fixed GPU count: an autoscaled run's
    GPUs move with its load, so it is refused with one line naming its config."""
    from analysis.compare import job_settings
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "config.yaml").write_text(
        "workload: {arrival: poisson, rate: 5.0}\nslo: null\n"
        "cluster: {replicas: 1, tensor_parallel_size: 1, pipeline_parallel_size: 1,\n"
        "          autoscaler: {policy: running}}\n")
    with pytest.raises(ConfigError, match="a run on a fixed replica count"):
        job_settings(tmp_path)


def test_a_replica_ready_and_drained_at_one_instant_stops_cleanly(compose_cfg):
    """A start whose delay is a whole number of evaluations: the replica is ready at the
    instant of an evaluation that drains it (it holds nothing); its engine, not yet resumed
    from the restart, must stop after that instant, not be interrupted where it cannot be
    (this once raised simpy.Interrupt out of the run)."""
    cfg = compose_cfg("cost_model=constant", "engine=python", "slo=none", "cluster.replicas=1",
                      "cluster.autoscaler.policy=running", "cluster.autoscaler.max_replicas=2",
                      "cluster.autoscaler.target=1", "cluster.autoscaler.tolerance=0",
                      "cluster.autoscaler.interval_s=1", "cluster.autoscaler.provision_s=1",
                      "cluster.autoscaler.engine_start_s=0",
                      "cluster.autoscaler.storage_bandwidth=1e30",
                      "cluster.autoscaler.scale_down_stabilization_s=0")
    req = pd.DataFrame({"arrival_time_s": [0.0, 0.0], "input_tokens": [1, 1],
                        "output_tokens": [150, 300], "client": -1, "think_time_s": 0.0})
    rec = simulate(cfg, req)
    log = rec.meta["autoscaler"]["log"]
    assert [tuple(x) for x in log[log[:, 1] == 1][:, [0, 2]]] == \
        [(0.0, OFF), (1.0, STARTING), (2.0, READY), (2.0, DRAINING), (2.0, OFF)]
    assert (rec.requests["status"] == "completed").all()


def test_the_slo_policy_can_bound_the_end_to_end_latency(compose_cfg):
    """slo_latency_ms alone: 200-token answers at 10 ms a step take 2 s end to end against
    a 1 s bound while nothing waits (64 sequences a step): every evaluation sees the bound
    broken and adds a replica up to max_replicas (on TTFT or with nothing observed it would
    shrink, nothing waiting)."""
    cfg = compose_cfg(*BURST, "scheduler.max_num_seqs=64", "workload.output_tokens=200",
                      "workload.rate=2", "workload.num_requests=120", "cluster.replicas=1",
                      "cluster.autoscaler.policy=slo", "cluster.autoscaler.slo_latency_ms=1000",
                      "cluster.autoscaler.max_replicas=3")
    rec = simulate(cfg, requests_for_seed(cfg.workload, 0))
    log = rec.meta["autoscaler"]["log"]
    ups = log[(log[:, 2] == STARTING) & (log[:, 0] > 0), 0]
    assert ups.tolist() == [5.0, 20.0]  # one at a time: the first ready at 15 s
    assert (rec.requests["status"] == "completed").all()
