"""The compiled loop and the SimPy engine agree for an overlapping engine
(``backend.overlap_scheduler``: a request reaching a busy engine is held for the step after
next); the random-run and shipped-model comparisons in ``test_compiled_core`` cover it too."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from sim import simulate
from tests.sim.schedulers.test_compiled_core import (
    CASES,
    assert_same_records,
    both_engines,
    workload,
)


@pytest.mark.parametrize("replicas", [1, 3])
@pytest.mark.parametrize("case", CASES)
def test_an_overlapping_engine_is_the_same_in_both_engines(tiny_config, requests, case,
                                                           replicas):
    """Requests held for the step after next (``backend.overlap_scheduler``), also while the
    SimPy engine fast-forwards decode windows that a waiting queue keeps from being cut."""
    fields = {"num_blocks": 200, "block_size": 8, "max_seqs": 16, "budget": 256} | CASES[case]
    cfg = tiny_config("vllm", roofline=True, **fields)
    cfg.cluster = replace(cfg.cluster, replicas=replicas, router="least_outstanding")
    cfg.backend = replace(cfg.backend, overlap_scheduler=True)
    req = workload(requests, np.random.default_rng(len(case) + 7), 160,
                   cfg.scheduler.max_model_len)
    assert_same_records(*both_engines(cfg, req))


@pytest.mark.parametrize("ulps", [-1, 0, 1])
def test_an_arrival_on_a_step_boundary_is_held_alike(tiny_config, requests, ulps):
    """A request that reaches an overlapping engine exactly at a step boundary (or an ulp
    either side, as the SimPy clock may land) joins the same step in both engines, inside a
    decode window a waiting queue keeps from being cut."""
    def config():
        cfg = tiny_config("vllm", num_blocks=200, block_size=4, max_seqs=2, budget=256,
                          roofline=True)
        cfg.backend = replace(cfg.backend, overlap_scheduler=True)
        return cfg

    cfg = config()
    cfg.engine = "python"
    steps = simulate(cfg, requests([0, 0, 0, 0, 1e3], [10] * 5, [50] * 5)).timeline
    at = float(steps["time_s"][steps["time_s"] > 0.02].iloc[0])
    for _ in range(abs(ulps)):
        at = float(np.nextafter(at, np.inf if ulps > 0 else 0.0))
    assert_same_records(*both_engines(config(), requests([0, 0, 0, 0, at], [10] * 5,
                                                           [50] * 5)))
