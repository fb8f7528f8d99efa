"""Preemption by swap under sarathi and trtllm (MAX_UTILIZATION), as under vllm: victims'
blocks go to host memory while it has room, come back on re-admission, and no token is
computed twice; with too little host space they fall back to recompute."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim import simulate
from sim.kv.budget import kv_bytes_per_token
from sim.kv.swap import SwapSpace

BLOCK_BYTES, PCIE = 1 << 20, 1e9  # 1 MiB blocks over 1 GB/s
ONE_BLOCK_S = BLOCK_BYTES / PCIE
# the policies that preempt, with the fields that make them preempt
PREEMPTING = {
    "sarathi": {"chunk_size": 64, "max_num_batched_tokens": 64},
    "trtllm": {"capacity_scheduler_policy": "MAX_UTILIZATION", "max_num_batched_tokens": 64},
    "vllm": {"max_num_batched_tokens": 64},
}


def with_swap(made, host_blocks):
    s, t, kv = made
    kv.enable_swap(SwapSpace(host_blocks, BLOCK_BYTES, PCIE))
    return s, t, kv


def drain(s, limit=5000):
    """Step until idle; the batches."""
    out, now = [], 0.0
    for _ in range(limit):
        b = s.schedule(now)
        if b is None:
            assert not s.has_work(), "stalled with work left"
            return out
        now += 1.0
        s.update(b, now)
        out.append(b)
    raise AssertionError("did not finish")


def test_sarathi_swaps_the_latest_arrivals_and_resumes_them(make, step):
    # as test_sarathi's preemption case: 8 blocks of 4 tokens, four 8-token prompts
    s, t, kv = with_swap(make("sarathi", [8, 8, 8, 8], [20, 20, 20, 20],
                              arrivals=[0.0, 0.1, 0.2, 0.3], num_blocks=8, block_size=4,
                              chunk_size=64, max_num_batched_tokens=64), host_blocks=100)
    first, _ = step(s, 0.0)
    b, _ = step(s, 1.0)
    # 0 swaps 3 out, then 2 swaps itself out: 2 blocks each go to the host
    assert list(b.ids) == [0, 1] and list(t.swaps) == [0, 0, 1, 1]
    assert list(t.preemptions) == [0, 0, 1, 1]
    assert b.swap_s == pytest.approx(4 * ONE_BLOCK_S) and not s.can_fast_forward(b)
    assert kv.swap.used_blocks == 4 and list(t.computed[2:]) == [8, 8]  # progress kept
    assert list(s.waiting) == [2, 3]
    batches = [first, b, *drain(s)]
    assert (t.generated == 20).all() and kv.free_blocks == kv.num_blocks
    assert kv.swap.used_blocks == 0 and t.swaps.sum() == t.preemptions.sum()
    # nothing recomputed: every prompt and generated token (but the last) computed once
    assert sum(b.num_tokens for b in batches) == int((t.prompt + t.max_output - 1).sum())
    # the swap-ins of 2 and 3 are charged to later steps, as many blocks as went out
    assert sum(b.swap_s for b in batches[2:]) >= 4 * ONE_BLOCK_S - 1e-12


def test_trtllm_max_utilization_swaps_the_last_started(make, step):
    s, t, kv = with_swap(make("trtllm", [8, 8, 8, 8], [20, 20, 20, 20],
                              arrivals=[0.0, 0.1, 0.2, 0.3], num_blocks=8, block_size=4,
                              **PREEMPTING["trtllm"]), host_blocks=100)
    first, _ = step(s, 0.0)
    b, _ = step(s, 1.0)
    # 0 and 1 get their 3rd block by pausing 3 and then 2 (last started first)
    assert list(b.ids) == [0, 1] and list(t.swaps) == [0, 0, 1, 1]
    assert b.swap_s == pytest.approx(4 * ONE_BLOCK_S)
    assert list(t.computed[2:]) == [8, 8] and s.preempted_in_last_step
    batches = [first, b, *drain(s)]
    assert (t.generated == 20).all() and kv.free_blocks == kv.num_blocks
    assert t.swaps.sum() == t.preemptions.sum()
    assert sum(b.num_tokens for b in batches) == int((t.prompt + t.max_output - 1).sum())


@pytest.mark.parametrize("name", ["sarathi", "trtllm"])
def test_too_little_host_space_falls_back_to_recompute(make, name):
    s, t, kv = with_swap(make(name, [8, 8, 8, 8], [20, 20, 20, 20],
                              arrivals=[0.0, 0.1, 0.2, 0.3], num_blocks=8, block_size=4,
                              **PREEMPTING[name]), host_blocks=2)
    drain(s)
    assert t.swaps.sum() >= 1 and t.preemptions.sum() > t.swaps.sum()
    assert kv.swap.peak_used <= 2 and (t.generated == 20).all()
    assert kv.free_blocks == kv.num_blocks and kv.swap.used_blocks == 0


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(sorted(PREEMPTING)),
       reqs=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 20)), min_size=1,
                     max_size=10),
       blocks=st.integers(10, 30), host=st.integers(0, 40), block_size=st.sampled_from([1, 4]))
def test_conservation_and_bounds_with_swap(make, name, reqs, blocks, host, block_size):
    """Every request that fits alone completes; GPU and host blocks stay in bounds and are
    all returned; with enough host space no token is computed twice."""
    prompts, outputs = [p for p, _ in reqs], [o for _, o in reqs]
    s, t, kv = with_swap(make(name, prompts, outputs, num_blocks=blocks, block_size=block_size,
                              add=False, **PREEMPTING[name]), host)
    fits = kv.fits_alone(t.prompt + t.max_output - 1)
    for rid in np.flatnonzero(fits):
        s.add_request(int(rid))
    now, computed = 0.0, 0
    for _ in range(5000):
        b = s.schedule(now)
        if b is None:
            break
        now += 1.0
        s.update(b, now)
        computed += b.num_tokens
        assert 0 <= kv.free_blocks <= kv.num_blocks
        assert 0 <= kv.swap.used_blocks <= host
    assert not s.has_work()
    assert (t.generated[fits] == t.max_output[fits]).all()
    assert kv.free_blocks == kv.num_blocks and kv.swap.used_blocks == 0
    assert (t.swaps <= t.preemptions).all()
    if t.swaps.sum() == t.preemptions.sum():  # every preemption was a swap: no recompute
        assert computed == int((t.prompt + t.max_output - 1)[fits].sum())


@st.composite
def swap_scenario(draw, tiny_config, requests):
    """A tiny server under a preempting policy with ``preemption=swap``: a KV cache of one to
    three times the largest request (so that requests preempt each other), host space from
    just the largest request to plenty, and a random open-loop workload."""
    name = draw(st.sampled_from(sorted(PREEMPTING)))
    block_size = draw(st.sampled_from([1, 4, 16]))
    budget = draw(st.integers(8, 128))
    fields = {}
    if name == "sarathi":
        fields["chunk_size"] = draw(st.integers(1, budget))
    elif name == "trtllm":
        fields["capacity_scheduler_policy"] = "MAX_UTILIZATION"
        fields["enable_chunked_prefill"] = draw(st.booleans())
        if not fields["enable_chunked_prefill"]:  # a whole prompt must fit in one step
            budget = 200
    n = draw(st.integers(2, 30))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    req = requests(np.cumsum(rng.exponential(1 / draw(st.floats(1, 500)), n)),
                   rng.integers(1, 120, n), rng.integers(1, 80, n))
    largest = -(-int((req.input_tokens + req.output_tokens).max()) // block_size)
    cfg = tiny_config(name, num_blocks=largest * draw(st.sampled_from([1, 2, 3])),
                      block_size=block_size, max_seqs=draw(st.integers(2, 8)), budget=budget,
                      max_len=200, roofline=draw(st.booleans()), **fields)
    block_bytes = kv_bytes_per_token(cfg.model, cfg.kv_cache, 1) * block_size
    host = largest * draw(st.sampled_from([1, 2, 1000]))
    cfg.kv_cache.preemption = "swap"
    cfg.kv_cache.swap_space_gib = host * block_bytes / (1 << 30)
    return cfg, req


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(data=st.data())
def test_swap_through_the_simulator_conserves_and_fast_forwards_exactly(
        data, tiny_config, requests):
    cfg, req = data.draw(swap_scenario(tiny_config, requests))
    a = simulate(cfg, req, keep_itl_samples=True)
    r, tl = a.requests, a.timeline
    assert set(r.status) <= {"completed", "rejected"}
    done = r[r.status == "completed"]
    assert (done.generated_tokens == done.output_tokens).all()
    assert (r.num_swaps <= r.num_preemptions).all()
    assert tl.kv_blocks_used.between(0, a.meta["num_gpu_blocks"] - 1).all()
    cfg.fast_forward = False
    b = simulate(cfg, req, keep_itl_samples=True)
    cols = ["first_scheduled_s", "first_token_s", "completion_s", "num_preemptions",
            "num_swaps"]
    np.testing.assert_allclose(r[cols].to_numpy(float), b.requests[cols].to_numpy(float),
                               rtol=1e-12, atol=1e-12, equal_nan=True)
    assert len(tl) == len(b.timeline)
    np.testing.assert_allclose(tl.drop(columns="bound").to_numpy(float),
                               b.timeline.drop(columns="bound").to_numpy(float),
                               rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("scheduler", ["sarathi", "trtllm"])
def test_swaps_are_counted_and_timed_through_the_simulator(compose_cfg, open_loop, scheduler):
    req = open_loop(np.zeros(30), np.full(30, 500), np.full(30, 200))
    common = (f"scheduler={scheduler}", "kv_cache.num_gpu_blocks=200", "cost_model=constant")
    if scheduler == "trtllm":
        common += ("scheduler.capacity_scheduler_policy=MAX_UTILIZATION",)
    swap = simulate(compose_cfg(*common, "kv_cache.preemption=swap"), req)
    recompute = simulate(compose_cfg(*common), req)
    s, r = swap.requests, recompute.requests
    assert (s.status == "completed").all() and (r.status == "completed").all()
    assert s.num_swaps.sum() > 0 and r.num_swaps.sum() == 0
    assert (s.num_swaps == s.num_preemptions).all()  # 4 GiB of host space: every one swaps
    assert swap.timeline.swap_s.sum() > 0 and recompute.timeline.swap_s.sum() == 0
    # a swapped request does not recompute its prompt: fewer prefill tokens in total
    assert swap.timeline.prefill_tokens.sum() < recompute.timeline.prefill_tokens.sum()
