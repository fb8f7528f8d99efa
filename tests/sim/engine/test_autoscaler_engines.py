"""The autoscaler on the compiled loop (``sim.compiled.scaling``) against the SimPy engine:
the same requests, state logs and GPU-hours on compressed days, at the ties of an
evaluation's instant and of the run's last instant; the autoscalers that stay on SimPy say
why."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from scenarios import requests_for_seed
from sim import simulate
from sim.engine.autoscaler import DRAINING, OFF, STARTING

DAY = ("workload=diurnal", "workload.rate_profile.hour_s=5", "workload.rate=30",
       "cluster=autoscaled", "cluster.autoscaler.interval_s=2", "cluster.autoscaler.provision_s=3",
       "cluster.autoscaler.engine_start_s=0", "cluster.autoscaler.scale_down_stabilization_s=6")


@pytest.mark.parametrize("over", [
    ("cluster.autoscaler.policy=running", "cluster.router=round_robin"),
    ("cluster.autoscaler.policy=queue", "cluster.autoscaler.target=3", "scheduler=sglang"),
    ("cluster.autoscaler.policy=kv_usage", "cluster.autoscaler.target=0.05",
     "scheduler=sarathi"),
    ("cluster.autoscaler.policy=rate", "cluster.autoscaler.target=5",
     "cluster.autoscaler.rate_window_s=6", "cluster.autoscaler.provision_s=0",
     "cluster.autoscaler.storage_bandwidth=1e30",
     "cluster.autoscaler.scale_down_stabilization_s=0"),
], ids=["running-rr", "queue-sglang", "kv_usage-sarathi", "rate-no-delay"])
def test_the_compiled_loop_scales_as_the_simpy_engine(compose_cfg, over):
    """A compressed day on the autoscaler, SimPy engine against the compiled loop: the same
    requests (to 1e-9 s), the same state log (starts, readies, drains, stops, restarts of
    stopped replicas), the same GPU-hours."""
    runs = {}
    for engine in ("python", "auto"):
        cfg = compose_cfg(*DAY, *over, f"engine={engine}")
        runs[engine] = simulate(cfg, requests_for_seed(cfg.workload, 0))
    a, b = runs["python"], runs["auto"]
    assert b.meta["engine"] == "compiled"
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=False, rtol=0, atol=1e-9)
    la, lb = a.meta["autoscaler"]["log"], b.meta["autoscaler"]["log"]
    assert la.shape == lb.shape and np.allclose(la, lb, rtol=0, atol=1e-9)
    assert (la[:, 2] == OFF).sum() > 8 and (la[:, 2] == DRAINING).sum() >= 3
    def restarts(r):
        states = la[(la[:, 1] == r) & (la[:, 0] > 0), 2].tolist()
        return sum(a == OFF and b == STARTING for a, b in zip(states[:-1], states[1:], strict=True))

    if "rate" not in over[0]:  # (the rate policy's day stops its spares for good)
        assert sum(restarts(r) for r in np.unique(la[:, 1])) > 0  # one stopped, restarted
    assert b.meta["autoscaler"]["gpu_hours"] == pytest.approx(a.meta["autoscaler"]["gpu_hours"],
                                                              rel=1e-12)


@pytest.mark.parametrize("over, why", [
    (("cluster.autoscaler.policy=slo", "cluster.autoscaler.slo_ttft_ms=500"),
     "cluster.autoscaler.policy=slo"),
    (("cluster.autoscaler.policy=rate", "workload=closed_loop"),
     "cluster.autoscaler.policy=rate with closed-loop clients"),
])
def test_autoscalers_the_compiled_loop_cannot_run_say_why(compose_cfg, over, why):
    cfg = compose_cfg("cluster=autoscaled", *over, "workload.num_requests=30")
    rec = simulate(cfg, requests_for_seed(cfg.workload, 0))
    assert rec.meta["engine"] == f"python ({why})"


def _both_engines(compose_cfg, over, requests):
    """The records of ``requests`` under ``over`` on the SimPy engine and the compiled loop."""
    out = [simulate(compose_cfg(*over, f"engine={e}"), requests) for e in ("python", "auto")]
    assert out[1].meta["engine"] == "compiled"
    return out


def _same_scaling(a, b) -> None:
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=False, rtol=0, atol=1e-9)
    la, lb = a.meta["autoscaler"]["log"], b.meta["autoscaler"]["log"]
    assert la.shape == lb.shape and np.array_equal(la, lb), (la[la[:, 0] > 0], lb[lb[:, 0] > 0])


def test_the_engines_agree_on_arrivals_at_an_evaluations_instant(compose_cfg):
    """Arrivals every 0.5 s and evaluations every 2 s land on the same instants: an arrival
    whose event was created after the evaluation's is not yet in its rate window, on either
    engine (the compiled loop counts only what its cursor has released)."""
    over = ("workload.input_tokens=50", "workload.output_tokens=4",
            "workload.num_requests=120", "slo=none", "cluster=autoscaled",
            "cluster.autoscaler.policy=rate", "cluster.autoscaler.target=1.5",
            "cluster.autoscaler.rate_window_s=4", "cluster.autoscaler.interval_s=2",
            "cluster.autoscaler.scale_down_stabilization_s=0", "cluster.autoscaler.tolerance=0.01")
    req = requests_for_seed(compose_cfg(*over).workload, 0)
    req["arrival_time_s"] = 0.5 * np.arange(1, len(req) + 1)
    a, b = _both_engines(compose_cfg, over, req)
    _same_scaling(a, b)
    log = a.meta["autoscaler"]["log"]
    assert log[(log[:, 0] > 0) & (log[:, 2] == STARTING), 0].tolist() == [4.0]


def test_the_engines_agree_at_the_runs_last_instant(compose_cfg):
    """The last request is refused at 62 s, the instant an evaluation is due that drains a
    replica: SimPy ends the run after it (created before the end), and so does the compiled
    loop. And two replicas ending their last steps at one instant, one of them draining: its
    stop, created before the run's end, is logged by both."""
    over = ("workload.input_tokens=100", "workload.output_tokens=400",
            "workload.num_requests=41", "slo=none", "cluster=autoscaled", "cluster.replicas=2",
            "cluster.autoscaler.policy=running", "cluster.autoscaler.target=1",
            "cluster.autoscaler.max_replicas=2", "cluster.autoscaler.interval_s=2",
            "cluster.autoscaler.scale_down_stabilization_s=40")
    req = requests_for_seed(compose_cfg(*over).workload, 0)
    req["arrival_time_s"] = np.append(0.5 * np.arange(1, 41), 62.0)
    req.loc[40, "input_tokens"] = 10**7  # refused: longer than the context
    a, b = _both_engines(compose_cfg, over, req)
    _same_scaling(a, b)
    log = a.meta["autoscaler"]["log"]
    assert log[log[:, 0] > 0].tolist() == [[62.0, 0.0, DRAINING]]

    over = ("slo=none", "cluster=autoscaled", "cluster.replicas=2", "cluster.router=round_robin",
            "cluster.autoscaler.policy=running", "cluster.autoscaler.target=100",
            "cluster.autoscaler.max_replicas=2", "cluster.autoscaler.interval_s=1",
            "cluster.autoscaler.scale_down_stabilization_s=0")
    req = pd.DataFrame({"arrival_time_s": [0.0, 0.0], "input_tokens": [100, 100],
                        "output_tokens": [2000, 2000], "client": -1, "think_time_s": 0.0})
    a, b = _both_engines(compose_cfg, over, req)
    _same_scaling(a, b)
    log = a.meta["autoscaler"]["log"]
    end = a.meta["sim_time_s"]  # the last step's end (the frontend streams a little later)
    assert log[log[:, 0] > 0].tolist() == [[1.0, 0.0, DRAINING], [end, 0.0, OFF]]
