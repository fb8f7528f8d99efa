"""The serving system's costs around the GPU step — the async scheduler's hidden host time, the
per-step host work, each replica's API server — give the same records on the compiled loop as
on the SimPy engine."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from sim.config.backend import FrontendConfig
from tests.sim.schedulers.test_compiled_core import assert_same_records, both_engines, workload


def test_async_scheduling_is_the_same_in_both_engines(tiny_config, requests):
    cfg = tiny_config("vllm", roofline=True, max_seqs=6, budget=128)
    cfg.backend = replace(cfg.backend, async_scheduling=True)
    req = workload(requests, np.random.default_rng(5), 80, cfg.scheduler.max_model_len)
    assert_same_records(*both_engines(cfg, req))


@pytest.mark.parametrize("kv", [{}, {"num_blocks": 40}], ids=["roomy", "recompute"])
def test_host_costs_are_the_same_in_both_engines(tiny_config, requests, kv):
    """Per-step host time by sequences, new requests and scheduled tokens (``sim.cost.host``),
    also when recompute preemption restarts prompts."""
    cfg = tiny_config("vllm", roofline=True, max_seqs=6, budget=128, **kv)
    cfg.cost_model = replace(cfg.cost_model, host_overhead_ms=0.4,
                             host_overhead_per_seq_us=20.0,
                             host_overhead_per_new_request_us=300.0,
                             host_overhead_per_token_us=2.0)
    req = workload(requests, np.random.default_rng(3), 80, cfg.scheduler.max_model_len)
    a, b = both_engines(cfg, req)
    assert_same_records(a, b)
    assert (a.timeline["host_s"] > 0.4e-3 + 20e-6).all()


@pytest.mark.parametrize("admission,streaming", [("fifo", "shared"), ("interleaved", "shared"),
                                                 ("fifo", "own_process"),
                                                 ("interleaved", "own_process")])
@pytest.mark.parametrize("replicas", [1, 3])
@pytest.mark.parametrize("case", ["burst", "closed_loop", "streaming_only", "latency_only"])
def test_frontend_is_the_same_in_both_engines(tiny_config, requests, case, replicas,
                                              admission, streaming):
    """Each replica's API server (``sim.engine.frontend``): a burst queues there (one by one,
    or one instant's arrivals together), streaming delays what clients see and the admissions
    behind it (unless a process of its own streams), closed-loop clients send their next
    request once they saw the end; requests too long to serve are refused before it."""
    rng = np.random.default_rng(7)
    cfg = tiny_config("vllm", roofline=True, max_seqs=6, budget=128)
    cfg.cluster = replace(cfg.cluster, replicas=replicas, router="least_outstanding")
    costs = {"burst": {"per_request_ms": 2.0, "per_prompt_token_us": 15.0,
                       "per_output_token_us": 300.0, "latency_ms": 1.0},
             "closed_loop": {"per_request_ms": 1.0, "per_output_token_us": 500.0},
             "streaming_only": {"per_output_token_us": 800.0},
             "latency_only": {"latency_ms": 4.0}}[case]
    zero = dict.fromkeys(("per_request_ms", "per_prompt_token_us", "per_output_token_us",
                          "latency_ms"), 0.0)  # what a case leaves out costs nothing
    cfg.backend = replace(cfg.backend, frontend=FrontendConfig(**(zero | costs),
                                                               admission=admission,
                                                               streaming=streaming))
    n = 90
    outputs = rng.integers(1, 40, n)
    outputs[rng.random(n) < 0.05] = 1000  # exceeds max_model_len: refused at once
    if case == "burst":
        req = requests(np.zeros(n), rng.integers(1, 200, n), outputs)
    else:
        req = requests(np.where(np.arange(n) < 5, rng.uniform(0, 0.01, n), np.nan),
                       rng.integers(1, 200, n), outputs)
        req["client"] = np.arange(n) % 5
        req["think_time_s"] = 0.003 if case == "closed_loop" else 0.0
    a, b = both_engines(cfg, req)
    assert_same_records(a, b)
    r = a.requests[a.requests["status"] == "completed"]
    waited = r["engine_arrival_s"] - r["arrival_s"]
    assert (waited >= 0).all()
    if case != "streaming_only":
        assert (waited > 0).all()
    else:  # only behind streaming, and only where the admitting server streams
        assert (waited > 0).any() == (streaming == "shared")
    assert (r["first_scheduled_s"] >= r["engine_arrival_s"]).all()
    if case == "burst" and replicas == 1 and admission == "fifo":
        # FIFO behind streaming, never faster than alone
        alone = np.cumsum(2e-3 + 15e-6 * r["input_tokens"]) + 1e-3
        assert (r["engine_arrival_s"].to_numpy() >= alone.to_numpy() - 1e-12).all()
    if case == "burst" and replicas == 1 and admission == "interleaved":
        # the whole burst, refused requests aside, reaches the engine at once, after all of
        # its admission work
        sent = a.requests[a.requests["status"] != "rejected"]
        work = (2e-3 + 15e-6 * sent["input_tokens"]).sum() + 1e-3
        assert r["engine_arrival_s"].to_numpy() == pytest.approx(np.full(len(r), work))


@pytest.mark.parametrize("replicas", [1, 3])
def test_one_arrival_time_is_one_admission_group_after_an_inexact_clock(tiny_config, requests,
                                                                         replicas):
    """Requests of one trace time arrive together (one interleaved admission group, one
    routing round) even where the SimPy clock reaches that time inexactly:
    0.8 + (3.1 - 0.8) is 3.0999999999999996, which once released the first 3.1 s request
    alone and the second 4e-16 s later."""
    cfg = tiny_config("vllm", roofline=True, max_seqs=6, budget=128)
    cfg.cluster = replace(cfg.cluster, replicas=replicas, router="least_outstanding")
    cfg.backend = replace(cfg.backend, frontend=FrontendConfig(
        per_request_ms=2.0, per_prompt_token_us=15.0, per_output_token_us=0.0, latency_ms=0.0,
        admission="interleaved", streaming="shared"))
    assert 0.8 + (3.1 - 0.8) < 3.1
    req = requests([0.8, 3.1, 3.1], [128, 100, 100], [20, 20, 20])
    a, b = both_engines(cfg, req)
    assert_same_records(a, b)
    if replicas == 1:  # one group: both reach the engine once both are admitted
        late = a.requests["engine_arrival_s"].to_numpy()[1:]
        assert late[0] == late[1]
