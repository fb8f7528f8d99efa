"""Many replicas behind a router: queueing behaviour, determinism, fast-forward, records."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from analysis.metrics import summarize
from sim import simulate

CONSTANT = ["cost_model=constant", "cost_model.step_time_ms=5"]
# a replica is a 2-server queue with deterministic service (50 steps of 5 ms)
QUEUE = [*CONSTANT, "scheduler.max_num_seqs=2", "workload.input_tokens=100",
         "workload.output_tokens=50"]


def test_least_outstanding_beats_random_on_eight_replicas(compose_cfg, requests_for):
    p99 = {}
    for router in ("random", "least_outstanding"):
        cfg = compose_cfg(*QUEUE, "cluster.replicas=8", f"cluster.router={router}",
                          "workload.rate=45", "workload.num_requests=1200")
        rec = simulate(cfg, requests_for(cfg))
        assert (rec.requests["status"] == "completed").all()
        assert set(rec.requests["replica"]) == set(range(8))
        p99[router] = summarize(rec)["p99_ttft_ms"]
    # random routing leaves some replicas with long queues while others idle
    assert p99["least_outstanding"] < 0.5 * p99["random"], p99


def test_one_replica_records_are_those_of_a_cluster_of_one(compose_cfg, requests_for):
    cfg = compose_cfg("workload.num_requests=200", *CONSTANT)
    rec = simulate(cfg, requests_for(cfg))
    assert (rec.requests["replica"] == 0).all()
    assert (rec.timeline["replica"] == 0).all() and (rec.timeline["kind"] == 0).all()
    assert (rec.requests["num_retries"] == 0).all()
    assert rec.meta["num_replicas"] == 1 and rec.meta["replica_pools"] == ["mixed"]
    s = summarize(rec)
    assert s["num_replicas"] == 1 and s["availability"] == 1.0
    assert math.isnan(s["prefix_cache_hit_rate"])  # no prefix cache: null in summary.json


def test_same_seed_same_output_and_routing_has_its_own_stream(compose_cfg, requests_for):
    cfg = compose_cfg(*QUEUE, "cluster.replicas=4", "cluster.router=random",
                      "workload.rate=30", "workload.num_requests=300",
                      "cluster.failure.mtbf_s=5", "cluster.failure.mttr_s=1", "seed=3")
    req = requests_for(cfg, 3)
    a, b = simulate(cfg, req), simulate(cfg, req)
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.timeline, b.timeline)
    assert a.meta["failures"] == b.meta["failures"]
    cfg.seed = 4  # other routing and failure draws over the same requests
    c = simulate(cfg, req)
    assert not c.requests["replica"].equals(a.requests["replica"])
    assert c.requests["input_tokens"].equals(a.requests["input_tokens"])


@pytest.mark.parametrize("overrides", [
    ["cluster.replicas=3", "cluster.router=power_of_two"],
    ["cluster.replicas=3", "cluster.router=jsq_tokens", "cluster.failure.mtbf_s=3",
     "cluster.failure.mttr_s=0.5"],
    ["cluster=disagg", "cluster.decode_replicas=2", "cluster.router=kv_aware"],
])
def test_fast_forward_equals_stepping_on_a_cluster(compose_cfg, requests_for, overrides):
    """Arrivals routed to a replica cut its decode windows exactly where single steps would
    first see them; failures settle the steps of a window that had ended."""
    cfg = compose_cfg("workload.num_requests=120", "workload.rate=20", *CONSTANT, *overrides)
    req = requests_for(cfg)
    a = simulate(cfg, req, keep_itl_samples=True)
    cfg.fast_forward = False
    b = simulate(cfg, req, keep_itl_samples=True)
    cols = ["replica", "first_scheduled_s", "first_token_s", "completion_s", "num_retries"]
    np.testing.assert_allclose(a.requests[cols].to_numpy(float), b.requests[cols].to_numpy(float),
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.sort(a.itl.samples()), np.sort(b.itl.samples()), rtol=1e-9)
    assert len(a.timeline) == len(b.timeline)
    np.testing.assert_allclose(a.timeline.drop(columns="bound").to_numpy(float),
                               b.timeline.drop(columns="bound").to_numpy(float),
                               rtol=1e-9, atol=1e-12)


def sessions(n_sessions=11, turns=4, gap=2.0):
    """Multi-turn conversations: each turn's hash_ids extend the previous turn's."""
    rows = []
    for s in range(n_sessions):
        prefix = []
        for k in range(turns):
            prefix = prefix + [1000 * s + k * 10 + j for j in range(3)]
            rows.append((s * 0.13 + k * gap, 512 * len(prefix), 8, tuple(prefix), s))
    df = pd.DataFrame(rows, columns=["arrival_time_s", "input_tokens", "output_tokens",
                                     "hash_ids", "session"]).sort_values("arrival_time_s")
    df["client"], df["think_time_s"] = -1, 0.0
    return df.reset_index(drop=True)


def test_prefix_affinity_keeps_a_conversation_on_one_replica(compose_cfg):
    req = sessions()
    spread = {}
    for router in ("prefix_affinity", "round_robin"):
        cfg = compose_cfg("cluster.replicas=4", f"cluster.router={router}", *CONSTANT)
        rec = simulate(cfg, req.drop(columns="session"))
        replicas = rec.requests["replica"].groupby(req["session"]).nunique()
        spread[router] = replicas.mean()
    assert spread["prefix_affinity"] == 1.0
    assert spread["round_robin"] > 2


def test_bad_cluster_input_is_one_line_naming_the_field():
    run = subprocess.run([sys.executable, "-m", "sim", "cluster=disagg",
                          "cluster.decode_replicas=0", "plots=false"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cluster.decode_replicas=0:"), \
        run.stderr
