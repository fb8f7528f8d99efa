"""Sliding-window blocks at the edges: a request exactly as long as the cache allows is served,
not stalled; a disaggregated prefill pool charges the prompt's window only; the static
scheduler reserves the window's blocks too."""

from __future__ import annotations

import numpy as np
import pytest

from sim import simulate
from sim.kv.manager import PagedKVCache


def test_fits_alone_agrees_with_what_a_request_takes():
    """Gemma-2-2B's window (13 layers, 257 blocks at most): a request of 2,033 + 32 tokens
    caches 2,064 (129 blocks) and its window as many; 258 usable blocks hold it exactly."""
    kv = PagedKVCache(259, 16, 1, window=(13, 13, 257))
    kv.set_lengths(np.array([2033]), np.array([32]))
    assert kv.fits_alone(2064)
    assert kv.blocks_for(2064) + int(kv.state_of(0)) <= kv.num_blocks
    assert kv.allocate(0, 0, 2064) == 129 + 129


@pytest.mark.parametrize("scheduler", ["vllm", "sarathi", "trtllm", "sglang", "static"])
def test_a_request_that_just_fits_is_served(compose_cfg, open_loop, scheduler):
    cfg = compose_cfg("model=gemma2_2b", f"scheduler={scheduler}", "backend=vllm",
                      "kv_cache.num_gpu_blocks=259", "cost_model=constant",
                      "scheduler.max_model_len=8192")
    rec = simulate(cfg, open_loop(np.zeros(2), np.array([2033, 100]), np.array([32, 4])))
    assert (rec.requests["status"] == "completed").all()


def test_static_reserves_the_window_blocks(compose_cfg, open_loop):
    """Two requests of 1,000 + 105 tokens (1,104 cached: 69 blocks each and their window's 69)
    do not fit together in 269 usable blocks: the static batch takes one, then the other."""
    cfg = compose_cfg("model=gemma2_2b", "scheduler=static", "kv_cache.num_gpu_blocks=270",
                      "cost_model=constant", "scheduler.max_model_len=8192",
                      "check_invariants=true")
    rec = simulate(cfg, open_loop(np.zeros(2), np.full(2, 1000), np.full(2, 105)))
    assert (rec.requests["status"] == "completed").all()
    assert rec.timeline["kv_blocks_used"].max() == 69 + 69
    assert rec.requests["first_token_s"].nunique() == 2  # two batches, one after the other


def test_a_prefill_pool_holds_the_prompts_window(compose_cfg, open_loop):
    """Disaggregated: the prefill replica holds a 400-token prompt's 25 blocks and its
    window's 25, not the 257 its 4,000 output tokens take on the decode side."""
    cfg = compose_cfg("model=gemma2_2b", "cluster=disagg", "kv_cache.num_gpu_blocks=600",
                      "cost_model=constant", "scheduler.max_model_len=8192")
    rec = simulate(cfg, open_loop(np.zeros(1), np.full(1, 400), np.full(1, 4000)))
    assert (rec.requests["status"] == "completed").all()
    prefill = rec.timeline[rec.timeline["replica"] == 0]
    assert prefill["kv_blocks_used"].max() == 25 + 25
