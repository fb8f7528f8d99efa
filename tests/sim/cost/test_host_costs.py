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
