"""Replica failures: nothing is lost, retried requests are counted, availability."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import simpy

from analysis.metrics import summarize
from sim import simulate
from sim.engine.cluster import Cluster
from sim.records import LogHistogram
from sim.state import RequestTable

STEP_S = 0.010
FLAKY = ["cluster.failure.mtbf_s=4", "cluster.failure.mttr_s=1"]
CONSTANT = ["cost_model=constant", "cost_model.step_time_ms=5"]


def check_nothing_lost(rec):
    req = rec.requests
    assert (req["status"] == "completed").all() and (req["fail_reason"] == "").all()
    assert (req["generated_tokens"] == req["output_tokens"]).all()
    assert (req["first_token_s"] >= req["arrival_s"]).all()
    assert (req["completion_s"] >= req["first_token_s"]).all()
    s = summarize(rec)
    assert s["retried_requests"] == int((req["num_retries"] > 0).sum())
    assert s["num_retries"] == int(req["num_retries"].sum())
    assert s["num_failures"] == len(rec.meta["failures"])
    return s


@pytest.mark.parametrize("overrides", [
    ["cluster.replicas=4", "cluster.router=least_outstanding"],
    ["cluster.replicas=1"],
    ["cluster=disagg", "cluster.prefill_replicas=2", "cluster.decode_replicas=2"],
    ["cluster.replicas=3", "workload=closed_loop", "workload.concurrency=12"],
])
def test_failures_lose_nothing_and_retries_are_counted(compose_cfg, requests_for, overrides):
    cfg = compose_cfg("workload.num_requests=250", "workload.rate=10", *CONSTANT, *FLAKY,
                      "check_invariants=true", *overrides)
    rec = simulate(cfg, requests_for(cfg))
    s = check_nothing_lost(rec)
    assert s["num_failures"] > 0 and s["retried_requests"] > 0
    # availability: the share of replica-time up, failures cut at the end of the run
    end = rec.meta["sim_time_s"]
    down = sum(min(f["up_s"] if f["up_s"] is not None else end, end) - f["down_s"]
               for f in rec.meta["failures"])
    assert s["availability"] == pytest.approx(1 - down / (s["num_replicas"] * end))
    assert 0 < s["availability"] < 1


def test_requests_wait_for_the_repair_when_every_replica_is_down(compose_cfg, requests_for):
    cfg = compose_cfg("workload.num_requests=200", "workload.rate=5", "cluster.replicas=1",
                      "cluster.failure.mtbf_s=5", "cluster.failure.mttr_s=3", *CONSTANT)
    rec = simulate(cfg, requests_for(cfg))
    check_nothing_lost(rec)
    req = rec.requests
    waited = 0
    for f in rec.meta["failures"]:
        if f["up_s"] is None:
            continue
        during = req[(req["arrival_s"] > f["down_s"]) & (req["arrival_s"] < f["up_s"])]
        assert (during["first_scheduled_s"] >= f["up_s"]).all()
        waited += len(during)
    assert waited > 0
    # a replica down serves nothing: no step starts inside a down interval
    tl = rec.timeline
    for f in rec.meta["failures"]:
        if f["up_s"] is not None:
            assert not ((tl["time_s"] > f["down_s"]) & (tl["time_s"] < f["up_s"])).any()


@pytest.mark.parametrize("fast_forward", [True, False])
def test_a_failed_request_is_recomputed_elsewhere_as_computed_by_hand(compose_cfg,
                                                                      fast_forward):
    """One request (100 prompt tokens, 10 output tokens, 10 ms steps) on replica 0 of two;
    replica 0 fails at 35 ms, after tokens at 10, 20 and 30 ms. Replica 1 recomputes the
    prompt and the 3 tokens in one step (token 4 at 45 ms), then decodes the rest."""
    cfg = compose_cfg("cost_model=constant", f"cost_model.step_time_ms={STEP_S * 1e3}",
                      "cluster.replicas=2")
    cfg.fast_forward = fast_forward
    table = RequestTable(np.zeros(1), np.array([100]), np.array([10]))
    env = simpy.Environment()
    itl = LogHistogram(keep_samples=True)
    cluster = Cluster(env, cfg, table, itl, fast_forward=fast_forward)
    ended = []
    cluster.on_done = lambda ids, now: ended.extend(ids.tolist())
    pool = cluster.pools[0]

    def script():
        cluster.submit(0)
        yield env.timeout(0.035)
        cluster.fail(pool, 0)
        yield env.timeout(1.0)
        cluster.repair(pool, 0)

    env.process(script())
    env.run()
    assert ended == [0]
    assert table.first_token[0] == pytest.approx(0.010)
    assert table.completion[0] == pytest.approx(0.035 + 7 * STEP_S)
    assert (table.retries[0], table.replica[0], table.generated[0]) == (1, 1, 10)
    gaps = np.sort(itl.samples())
    np.testing.assert_allclose(gaps, [STEP_S] * 8 + [0.015])  # one longer gap at the failure
    assert pool.view.outstanding.tolist() == [0, 0]
    assert cluster.held.sum() == 0


def test_failure_settings_are_checked(compose_cfg):
    from sim.errors import ConfigError

    for override, field in (("cluster.failure.mtbf_s=0", "cluster.failure.mtbf_s"),
                            ("cluster.failure.mttr_s=-1", "cluster.failure.mttr_s")):
        cfg = compose_cfg(override)
        with pytest.raises(ConfigError) as e:
            simulate(cfg, pd.DataFrame({"arrival_time_s": [0.0], "input_tokens": [10],
                                        "output_tokens": [2], "client": [-1],
                                        "think_time_s": [0.0]}))
        assert e.value.field == field
