"""The engine's per-step host time (``sim.cost.host``) against hand-computed sums."""

from __future__ import annotations

import numpy as np
import pytest

from sim.builders import build_cost_model, plain
from sim.cost.host import HostCosts, new_requests

HOST = ("cost_model.host_overhead_ms=0.5", "cost_model.host_overhead_per_seq_us=30",
        "cost_model.host_overhead_per_new_request_us=200",
        "cost_model.host_overhead_per_token_us=1.5")


def test_host_time_is_the_sum_of_its_four_parts():
    h = HostCosts.from_units(overhead_ms=0.5, per_seq_us=30, per_new_request_us=200,
                             per_token_us=1.5)
    assert h.time(3, 2, 151) == pytest.approx(0.5e-3 + 3 * 30e-6 + 2 * 200e-6 + 151 * 1.5e-6)
    assert h.units() == pytest.approx({"overhead_ms": 0.5, "per_seq_us": 30,
                                       "per_new_request_us": 200, "per_token_us": 1.5})


def test_new_requests_are_the_chunks_without_context():
    # a first chunk, a later chunk of another prompt, a decode, a one-token prompt
    assert new_requests(np.array([0, 512, 90, 0])) == 2


def test_a_mixed_step_pays_each_new_prompt_and_token(compose_cfg):
    """Two prompts starting (100 and 50 tokens), one continuing (64 tokens after 512),
    two decodes: 5 sequences, 2 new, 216 tokens."""
    with_host = build_cost_model(plain(compose_cfg(*HOST)))
    n, c = np.array([100, 50, 64, 1, 1]), np.array([0, 0, 512, 700, 900])
    step = with_host.step_cost(n, c)
    assert step.host_s == pytest.approx(0.5e-3 + 5 * 30e-6 + 2 * 200e-6 + 216 * 1.5e-6)
    assert step.time_s == pytest.approx(step.compute_s + step.memory_s + step.comm_s
                                        + step.host_s)


def test_decode_steps_pay_no_new_request_cost(compose_cfg):
    m = build_cost_model(plain(compose_cfg(*HOST)))
    c = np.full(8, 1000)
    window = m.decode_window(c, 4)
    assert window[4] == pytest.approx(np.full(4, 0.5e-3 + 8 * 30e-6 + 8 * 1.5e-6))
    assert m.step_cost(np.ones(8, int), c).host_s == pytest.approx(window[4][0])


def test_a_calibration_without_the_new_keys_prices_them_at_zero(compose_cfg):
    m = build_cost_model(plain(compose_cfg()))
    assert m.host.per_new_request_s >= 0 and m.host.per_token_s >= 0
    bare = build_cost_model(plain(compose_cfg("cost_model.host_overhead_ms=0",
                                              "cost_model.host_overhead_per_seq_us=0",
                                              "cost_model.host_overhead_per_new_request_us=0",
                                              "cost_model.host_overhead_per_token_us=0")))
    assert bare.step_cost(np.array([100]), np.array([0])).host_s == 0.0


def test_async_scheduling_hides_host_time_under_the_gpu(compose_cfg):
    """vLLM's --async-scheduling: a step takes max(GPU, host), not their sum."""
    sync = build_cost_model(plain(compose_cfg("cost_model.host_overhead_ms=3")))
    hidden = build_cost_model(plain(compose_cfg("cost_model.host_overhead_ms=3",
                                                "backend.async_scheduling=true")))
    n, c = np.ones(64, int), np.full(64, 1000)
    a, b = sync.step_cost(n, c), hidden.step_cost(n, c)
    gpu = a.compute_s + a.memory_s + a.comm_s
    assert a.time_s == pytest.approx(gpu + a.host_s)
    assert b.time_s == pytest.approx(max(gpu, a.host_s)) and b.host_s == pytest.approx(
        max(0.0, a.host_s - gpu))
    long = build_cost_model(plain(compose_cfg("cost_model.host_overhead_ms=100",
                                              "backend.async_scheduling=true")))
    assert long.step_cost(n, c).time_s == pytest.approx(0.1 + 64 * long.host.per_seq_s)


@pytest.mark.parametrize("backend", ["sglang", "trtllm"])
def test_an_overlap_scheduler_hides_host_time_as_async_scheduling_does(compose_cfg, backend):
    """SGLang's and TensorRT-LLM's default loops schedule a step while the GPU runs the one
    before it, so their host work shows only where it outlasts the GPU's; with the overlap
    off (or pipeline parallelism, where the engines turn it off) it adds to the step."""
    def step(*extra):
        m = build_cost_model(plain(compose_cfg(f"backend={backend}", f"scheduler={backend}",
                                               *HOST, *extra)))
        return m.step_cost(np.array([100, 1, 1]), np.array([0, 700, 900]))

    default, off = step(), step("backend.overlap_scheduler=false")
    gpu = off.compute_s + off.memory_s + off.comm_s
    assert off.time_s == pytest.approx(gpu + off.host_s)
    assert default.host_s == pytest.approx(max(0.0, off.host_s - gpu))
    assert default.time_s == pytest.approx(max(gpu, off.host_s))
    piped = step("cluster.pipeline_parallel_size=2")
    assert piped.host_s == pytest.approx(off.host_s)
