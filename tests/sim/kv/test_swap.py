"""Preemption by swap: host space bounds, copy time, fallback to recompute, and config checks."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.builders import plain
from sim.config import SchedulerConfig, check_kv_cache
from sim.errors import ConfigError
from sim.kv.build import build_kv_cache
from sim.kv.manager import PagedKVCache
from sim.kv.swap import SwapSpace
from sim.records import LogHistogram
from sim.schedulers.vllm import VllmScheduler
from sim.state import RequestTable

BLOCK_BYTES, PCIE = 1 << 20, 1e9  # 1 MiB blocks over 1 GB/s: 1.048576 ms per block


def make(prompts, outputs, num_blocks, host_blocks, block_size=4, state_blocks=0, **cfg):
    t = RequestTable(np.zeros(len(prompts)), np.array(prompts), np.array(outputs))
    kv = PagedKVCache(num_blocks + 1, block_size, len(prompts), state_blocks=state_blocks)
    kv.enable_swap(SwapSpace(host_blocks, BLOCK_BYTES, PCIE))
    s = VllmScheduler(SchedulerConfig(**cfg), t, kv, LogHistogram())
    for rid in range(len(prompts)):
        s.add_request(rid)
    return s, t, kv


def run(s, limit=5000):
    """Step until idle; the batches."""
    out, now = [], 0.0
    for _ in range(limit):
        b = s.schedule(now)
        if b is None:
            return out
        now += 1.0
        s.update(b, now)
        out.append(b)
    raise AssertionError("did not finish")


def test_swap_out_and_in_cost_copy_time_and_keep_progress():
    # two requests of 8 prompt tokens (2 blocks each) grow into a 5-block cache: one must go
    s, t, kv = make([8, 8], [6, 6], num_blocks=5, host_blocks=10, state_blocks=0)
    batches = run(s)
    swapped = [b for b in batches if b.swap_s]
    assert t.swaps[1] >= 1 and t.swaps[0] == 0
    assert t.preemptions.sum() == t.swaps.sum()        # every preemption was a swap
    one_block = BLOCK_BYTES / PCIE
    # a swap moves whole requests' blocks; each step's time is a whole number of blocks
    for b in swapped:
        assert b.swap_s / one_block == pytest.approx(round(b.swap_s / one_block))
    assert len(swapped) >= 2                           # one step swaps out, a later one in
    assert (t.generated == 6).all() and kv.free_blocks == kv.num_blocks
    assert kv.swap.used_blocks == 0 and kv.swap.peak_used > 0
    # swapped requests resume where they were: no prompt token is computed twice
    assert sum(b.num_prefill_tokens for b in batches) == 16


def test_full_host_space_falls_back_to_recompute():
    s, t, kv = make([8, 8, 8], [8, 8, 8], num_blocks=7, host_blocks=3)
    run(s)
    assert t.preemptions.sum() > t.swaps.sum()         # some victims did not fit on the host
    assert kv.swap.peak_used <= 3 and (t.generated == 8).all()


def test_swap_step_is_not_fast_forwarded():
    s, t, kv = make([8, 8], [6, 6], num_blocks=5, host_blocks=10)
    for b in run(s):
        if b.swap_s:
            assert not s.can_fast_forward(b)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.integers(1, 20)), min_size=1, max_size=10),
       st.integers(10, 30), st.integers(0, 30), st.integers(0, 2))
def test_conservation_and_bounds_with_swap(reqs, blocks, host, state):
    prompts, outputs = [p for p, _ in reqs], [o for _, o in reqs]
    s, t, kv = make(prompts, outputs, num_blocks=blocks, host_blocks=host,
                    state_blocks=state, max_num_batched_tokens=32)
    fits = kv.fits_alone(t.prompt + t.max_output - 1)
    s.waiting.clear()
    for rid in np.flatnonzero(fits):
        s.add_request(int(rid))
    now = 0.0
    for _ in range(5000):
        b = s.schedule(now)
        if b is None:
            break
        now += 1.0
        s.update(b, now)
        assert 0 <= kv.free_blocks <= kv.num_blocks
        assert 0 <= kv.swap.used_blocks <= host
    assert not s.has_work()
    assert (t.generated[fits] == t.max_output[fits]).all()
    assert kv.free_blocks == kv.num_blocks and kv.swap.used_blocks == 0


def _budget(blocks=1000, state=0):
    return SimpleNamespace(num_gpu_blocks=blocks, block_size=16, block_bytes=BLOCK_BYTES,
                           state_blocks_per_request=state)


def test_build_kv_cache_override_swap_space_and_errors():
    hw = SimpleNamespace(pcie_bandwidth=PCIE)
    cfg = SimpleNamespace(num_gpu_blocks=None, prefix_caching=False, preemption="recompute",
                          swap_space_gib=1.0)
    kv = build_kv_cache(cfg, hw, _budget(state=2), 4)
    assert kv.num_blocks == 999 and kv.state_blocks == 2 and kv.swap is None
    cfg.num_gpu_blocks = 50
    assert build_kv_cache(cfg, hw, _budget(), 4).num_blocks == 49
    cfg.preemption = "swap"
    kv = build_kv_cache(cfg, hw, _budget(), 4, largest_request_tokens=1000)
    assert kv.swap.num_blocks == 1024
    with pytest.raises(ConfigError, match="kv_cache.swap_space_gib"):
        build_kv_cache(cfg, hw, _budget(), 4, largest_request_tokens=16 * 1025)
    with pytest.raises(ConfigError, match="hardware.pcie_bandwidth"):
        build_kv_cache(cfg, SimpleNamespace(pcie_bandwidth=0.0), _budget(), 4)
    cfg.num_gpu_blocks = 2
    with pytest.raises(ConfigError, match="kv_cache.num_gpu_blocks"):
        build_kv_cache(cfg, hw, _budget(state=1), 4)


def test_config_checks_preemption_mode_and_swap_space(compose_cfg):
    with pytest.raises(ConfigError, match="kv_cache.preemption"):
        check_kv_cache(plain(compose_cfg("kv_cache.preemption=evict")).kv_cache)
    with pytest.raises(ConfigError, match="kv_cache.swap_space_gib"):
        check_kv_cache(plain(compose_cfg("kv_cache.swap_space_gib=-1")).kv_cache)
    cfg = plain(compose_cfg("kv_cache.preemption=swap", "kv_cache.swap_space_gib=8")).kv_cache
    check_kv_cache(cfg)
    assert cfg.preemption == "swap" and cfg.swap_space_gib == 8


def test_swaps_are_counted_through_the_simulator(compose_cfg, open_loop):
    from sim import simulate

    req = open_loop(np.zeros(30), np.full(30, 500), np.full(30, 200))
    common = ("kv_cache.num_gpu_blocks=200", "cost_model=constant")
    swap = simulate(compose_cfg(*common, "kv_cache.preemption=swap"), req).requests
    recompute = simulate(compose_cfg(*common), req).requests
    assert (swap.status == "completed").all() and (recompute.status == "completed").all()
    assert swap.num_swaps.sum() > 0 and recompute.num_swaps.sum() == 0
    assert (swap.num_swaps <= swap.num_preemptions).all()
    with pytest.raises(ConfigError, match="kv_cache.swap_space_gib"):
        simulate(compose_cfg(*common, "kv_cache.preemption=swap",
                             "kv_cache.swap_space_gib=0.01"), req)
