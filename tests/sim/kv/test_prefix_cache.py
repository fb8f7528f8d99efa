"""Prefix caching: chained block hashes, reference counts, LRU eviction and hit rates."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.config import SchedulerConfig
from sim.kv.manager import PagedKVCache
from sim.kv.prefix import PrefixPool, block_hashes
from sim.records import LogHistogram
from sim.schedulers import SCHEDULERS
from sim.state import FINISHED, RequestTable

TRACE = Path(__file__).resolve().parents[3] / ".." / "shared" / "traces" / \
    "mooncake_conversation.csv"


def check_blocks(kv: PagedKVCache, live) -> None:
    """Free + referenced cached + private + state blocks add up to the capacity."""
    pool = kv.prefix
    shared = sum(1 for r in pool.refs.values() if r > 0) if pool is not None else 0
    private = sum(int(kv.held[r]) - kv._ref.get(r, 0) for r in live)
    state = kv.state_blocks * sum(1 for r in live if kv.held[r] > 0)
    assert 0 <= kv.free_blocks <= kv.num_blocks
    assert kv.free_blocks + shared + private + state == kv.num_blocks
    if pool is not None:
        assert len(pool.lru) == sum(1 for r in pool.refs.values() if r == 0)
        assert len(pool.lru) <= kv.free_blocks


def test_block_hashes_are_chained_and_map_trace_blocks_onto_engine_blocks():
    a = block_hashes((7, 8, 9), 1536, trace_block=512, block_size=16)
    b = block_hashes((7, 8, 5), 1536, trace_block=512, block_size=16)
    c = block_hashes((6, 8, 9), 1536, trace_block=512, block_size=16)
    assert len(a) == 96 and len(set(a)) == 96
    assert a[:64] == b[:64] and a[64] != b[64]         # shared as far as the ids agree
    assert not set(a) & set(c)                         # a different first block: no sharing
    assert len(block_hashes((7, 8, 9), 1000, 512, 16)) == 62   # only full blocks of the prompt
    assert len(block_hashes((7,), 5000, 512, 16)) == 32        # only blocks the ids name
    # an engine block straddling two trace blocks belongs to the later one
    d = block_hashes((1, 2), 1024, trace_block=512, block_size=48)
    e = block_hashes((1, 3), 1024, trace_block=512, block_size=48)
    assert d[:10] == e[:10] and d[10] != e[10]         # block 10 holds tokens 480..527


def test_pool_reference_counts_and_lru_order():
    pool = PrefixPool()
    assert all(pool.insert(h) for h in (1, 2, 3))
    assert pool.match([1, 2, 3, 4], 10) == 3 and pool.match([1, 2, 3], 2) == 2
    assert pool.touch([1, 2]) == 0 and pool.refs == {1: 2, 2: 2, 3: 1}
    assert pool.release([1, 2, 3]) == 1                # only 3 drops to zero
    assert pool.release([1, 2]) == 2
    assert list(pool.lru) == [3, 2, 1]                 # a prefix is evicted from its tail
    assert pool.touch([1]) == 1 and list(pool.lru) == [3, 2]
    assert not pool.insert(2) and list(pool.lru) == [3]
    assert pool.evict(1) == [3] and pool.match([1, 2, 3], 3) == 2
    assert pool.release([1]) == 1 and list(pool.lru) == [1] and pool.refs == {1: 0, 2: 1}
    # 1 is free (revived, not surplus), 2 referenced (surplus), 5 new
    assert pool.insert_many([1, 2, 5]) == 1
    assert pool.refs == {1: 1, 2: 2, 5: 1} and not pool.lru


def test_hit_skips_whole_blocks_but_never_the_last_token():
    kv = PagedKVCache(101, 16, 3, prefix_caching=True)
    kv.set_prefix_source(np.array([(1, 2), (1, 2), (1, 3)], dtype=object), trace_block=32)
    computed = np.zeros(3, np.int64)
    assert kv.match_prefix(0, 64) == 0
    assert kv.allocate(0, 0, 64) == 4
    computed[0] = 64
    kv.commit(computed)
    assert kv.cached_blocks == 4
    assert kv.match_prefix(1, 64) == 48                 # 64 cached, the last token is not
    assert kv.used_blocks == 4                          # the hit shares blocks: none taken
    assert kv.match_prefix(2, 64) == 32                 # its second trace block differs
    check_blocks(kv, [0, 1, 2])
    kv.free([0, 1, 2])
    assert kv.free_blocks == 100 and kv.cached_blocks == 4
    check_blocks(kv, [])


def test_a_request_without_ids_finds_only_its_own_blocks_again():
    """A synthetic prompt shares nothing, but a request preempted by recompute restarts from
    its blocks still cached (vLLM's freed blocks stay hashed in the free queue)."""
    kv = PagedKVCache(101, 16, 2, prefix_caching=True)
    kv.set_prefix_source(None, lengths=np.array([80, 80]))
    computed = np.zeros(2, np.int64)
    assert kv.match_prefix(0, 64) == 0
    kv.allocate(0, 0, 64)
    computed[0] = 64
    kv.commit(computed)
    kv.free(0)                                          # preempted: its 4 blocks stay cached
    assert kv.cached_blocks == 4 and kv.free_blocks == 100
    assert kv.match_prefix(1, 64) == 0                  # same length, other content
    assert kv.match_prefix(0, 70) == 64                 # its own 4 blocks (70 tokens now)
    check_blocks(kv, [0])
    plain = PagedKVCache(101, 16, 2, prefix_caching=True)
    plain.set_prefix_source(None)                       # no lengths: nothing is named
    plain.allocate(0, 0, 64)
    plain.commit(computed)
    plain.free(0)
    assert plain.cached_blocks == 0 and plain.match_prefix(0, 70) == 0


def test_free_cached_blocks_are_evicted_least_recent_first():
    kv = PagedKVCache(9, 4, 4, prefix_caching=True)     # 8 usable blocks of 4 tokens
    kv.set_prefix_source(np.array([(1,), (2,), (3,), (1,)], dtype=object), trace_block=16)
    computed = np.zeros(4, np.int64)
    for rid in (0, 1):
        assert kv.match_prefix(rid, 16) == 0
        kv.allocate(rid, 0, 16)
        computed[rid] = 16
        kv.commit(computed)
        kv.free(rid)
    assert kv.cached_blocks == 8 and kv.free_blocks == 8
    kv.allocate(2, 0, 8)                               # 2 empty blocks short: evict 2 of rid 0
    assert kv.cached_blocks == 6
    assert kv.match_prefix(3, 17) == 8                 # rid 0's prefix lost its tail blocks
    check_blocks(kv, [2, 3])


def test_state_blocks_are_held_once_per_request():
    kv = PagedKVCache(11, 4, 3, state_blocks=2)         # 10 usable
    assert kv.allocate(0, 0, 5) == 4                    # 2 KV blocks + 2 state blocks
    assert kv.allocate(0, 5, 3) == 0 and kv.allocate(0, 8, 1) == 1
    assert not kv.allocate_all(np.array([1, 2]), np.zeros(2, int), np.array([4, 4]))
    assert kv.allocate_all(np.array([1]), np.zeros(1, int), np.array([4]))
    assert kv.free_blocks == 2
    kv.free(np.array([0, 1]))
    assert kv.free_blocks == 10
    assert kv.fits_alone(32) and not kv.fits_alone(33)


def _replay(hash_ids, prompts, num_blocks: int, block_size: int = 64) -> float:
    """Serve the requests one at a time through the cache; the share of prompt tokens hit."""
    kv = PagedKVCache(num_blocks, block_size, len(prompts), prefix_caching=True)
    kv.set_prefix_source(hash_ids)
    computed = np.zeros(len(prompts), np.int64)
    hit = 0
    for rid, n in enumerate(prompts.tolist()):
        h = kv.match_prefix(rid, n)
        assert kv.allocate(rid, h, n - h) is not None
        computed[rid] = n
        kv.commit(computed)
        kv.free(rid)
        hit += h
    return hit / prompts.sum()


@pytest.mark.skipif(not TRACE.exists(), reason="needs ../shared/traces/mooncake_conversation.csv")
def test_mooncake_hit_rate_rises_with_cache_size_up_to_the_trace_limit():
    from scenarios.traces import read_trace

    df = read_trace(str(TRACE)).iloc[:3000]
    prompts = df["input_tokens"].to_numpy(np.int64)
    ids = df["hash_ids"].to_numpy()
    rates = [_replay(ids, prompts, blocks) for blocks in (2000, 6000, 20_000, 10**7)]
    assert all(a < b for a, b in zip(rates, rates[1:], strict=False)), rates
    # the trace's own bound, walking the leading ids already seen, on these requests
    seen, ideal = set(), 0
    for row, n in zip(ids, prompts.tolist(), strict=True):
        k = 0
        while k < len(row) and row[k] in seen:
            k += 1
        ideal += min(k * 512, n)
        seen.update(row)
    assert rates[-1] <= ideal / prompts.sum() + 1e-9
    assert rates[-1] > 0.9 * ideal / prompts.sum()


def test_a_hit_whose_state_blocks_do_not_fit_waits_with_its_hit():
    """vLLM's allocate_slots counts the free cached blocks a hit revives with the request's
    other blocks and returns None when they do not fit: the request keeps waiting with its
    hit; it never starts over without it, though a small chunk from scratch would fit."""
    t = RequestTable(np.zeros(3), np.array([16, 17, 11]), np.array([1, 1, 2]))
    kv = PagedKVCache(11, 4, 3, prefix_caching=True, state_blocks=2)  # 10 usable
    kv.set_prefix_source(_ids([(1,), (1,), (2,)]), trace_block=16)
    s = SCHEDULERS["vllm"](SchedulerConfig(name="vllm", max_num_seqs=4,
                                           max_num_batched_tokens=12), t, kv, LogHistogram())
    s.add_request(0)
    now = _serve(s)                                     # its 4 blocks stay cached, free
    s.add_request(2)
    b = s.schedule(now)                                 # 3 blocks + 2 state: 5 free, 1 empty
    s.update(b, now + 1)
    s.add_request(1)                                    # hits 4 free cached blocks + 2 state
    free, refs = kv.free_blocks, dict(kv.prefix.refs)
    assert kv.match_prefix(1, 17) is None and kv.held[1] == 0
    assert (kv.free_blocks, kv.prefix.refs) == (free, refs)  # the failed hit touched nothing
    b = s.schedule(now + 1)
    assert list(b.ids) == [2] and list(s.waiting) == [1]  # an 11-token chunk from scratch fits
    s.update(b, now + 2)
    _serve(s, now + 2)
    assert t.cached_tokens[1] == 16 and (t.status == FINISHED).all()
    check_blocks(kv, [])


def _ids(hash_ids) -> np.ndarray:
    """One object per request: its ids, or None."""
    out = np.empty(len(hash_ids), dtype=object)
    for i, ids in enumerate(hash_ids):
        out[i] = ids
    return out


def _sched(prompts, outputs, hash_ids, num_blocks, block_size=16, name="vllm", **cfg):
    """A scheduler over a prefix-caching cache whose requests without ids have blocks of
    their own (as ``sim.engine.cluster`` sets it up)."""
    t = RequestTable(np.zeros(len(prompts)), np.array(prompts), np.array(outputs))
    kv = PagedKVCache(num_blocks + 1, block_size, len(prompts), prefix_caching=True)
    kv.set_prefix_source(_ids(hash_ids), trace_block=block_size,
                         lengths=t.prompt + t.max_output)
    return SCHEDULERS[name](SchedulerConfig(name=name, **cfg), t, kv, LogHistogram()), t, kv


def test_vllm_admission_starts_a_request_at_its_cached_prefix():
    s, t, kv = _sched([64, 64], [2, 2], [(1, 2, 3, 4), (1, 2, 3, 5)], 100)
    s.add_request(0)
    b = s.schedule(0.0)
    s.update(b, 1.0)
    s.add_request(1)
    b = s.schedule(1.0)
    assert list(b.ids) == [0, 1] and list(b.new_tokens) == [1, 16]
    assert list(b.context_tokens) == [64, 48]
    assert t.cached_tokens[1] == 48 and t.cached_tokens[0] == 0
    check_blocks(kv, [0, 1])


def _serve(s, now: float = 0.0) -> float:
    while (b := s.schedule(now)) is not None:
        now += 1.0
        s.update(b, now)
    return now


@pytest.mark.parametrize("fast_forward", [False, True])
def test_generated_blocks_are_cached_as_far_as_the_ids_name_them(fast_forward):
    """Ids naming prompt and output (a multi-turn turn) cache the output's full blocks, so
    the next turn hits (P + O − 1) // bs blocks; ids naming the prompt only (a trace) cache
    the prompt's."""
    # request 0: 8-token prompt, 8 outputs, ids (1..4) name all 16 tokens; request 1 repeats
    # them and adds 4 tokens; request 2 names only request 0's prompt blocks (1, 2)
    s, t, kv = _sched([8, 20, 20], [8, 2, 2], [(1, 2, 3, 4), (1, 2, 3, 4, 5), (1, 2, 6, 7, 8)],
                      100, block_size=4)
    s.add_request(0)
    b = s.schedule(0.0)
    s.update(b, 1.0)
    if fast_forward:  # the rest of request 0 in one decode window
        b = s.schedule(1.0)
        assert s.can_fast_forward(b)
        s.update_window(b, 2.0 + np.arange(s.decode_window_limit(b)))
    _serve(s, 10.0)
    assert t.status[0] == FINISHED and t.computed[0] == 15
    assert kv.cached_blocks == 3                        # tokens 0..11: 15 computed, not 16
    for rid in (1, 2):
        s.add_request(rid)
    _serve(s, 20.0)
    assert t.cached_tokens[1] == 12 and t.cached_tokens[2] == 8
    check_blocks(kv, [])


POLICIES = {"vllm": {}, "sarathi": {"chunk_size": 64}, "trtllm": {},
            "trtllm_max_util": {"capacity_scheduler_policy": "MAX_UTILIZATION"},
            "sglang": {"chunk_size": 64}}


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 120), st.integers(1, 12), st.integers(0, 3)),
                min_size=1, max_size=14),
       st.integers(12, 40), st.integers(0, 20), st.booleans(), st.booleans())
def test_conservation_and_block_invariants_with_prefix_caching(policy, reqs, blocks, host,
                                                               outputs_named, fast_forward):
    prompts = [p for p, _, _ in reqs]
    outputs = [o for _, o, _ in reqs]
    # requests share leading blocks by their group: ids (g, g+10, ...), one per 8 tokens of
    # the prompt, or of prompt and output (then generated blocks are cached too); group 3
    # has no ids: blocks of its own
    ids = [tuple(g * 100 + i for i in range(-(-(p + o * outputs_named) // 8))) if g < 3
           else None for p, o, g in reqs]
    s, t, kv = _sched(prompts, outputs, ids, blocks, block_size=8, max_num_batched_tokens=64,
                      name=policy.split("_")[0], **POLICIES[policy])
    if host:
        from sim.kv.offload import HostTier

        kv.enable_offload(HostTier(host), block_copy_s=1e-3)
    fits = kv.fits_alone(t.prompt + t.max_output - 1)
    for rid in np.flatnonzero(fits):
        s.add_request(int(rid))
    now, done = 0.0, 0
    for _ in range(2000):
        b = s.schedule(now)
        if b is None:
            break
        if fast_forward and s.can_fast_forward(b):
            k = s.decode_window_limit(b)
            done += len(s.update_window(b, now + np.arange(1.0, k + 1)))
            now += k
        else:
            now += 1.0
            done += len(s.update(b, now))
        check_blocks(kv, [int(r) for r in s.running])
    assert done == int(fits.sum()) and not s.has_work()
    assert (t.cached_tokens <= t.prompt - 1).all()
    check_blocks(kv, [])


@pytest.mark.skipif(not TRACE.exists(), reason="needs ../shared/traces/mooncake_conversation.csv")
def test_trace_hits_on_an_unbounded_cache_stay_within_earlier_prompts(compose_cfg):
    """Mooncake's ids name prompts only: with generated blocks cached, no request hits more
    than the prompt blocks of the requests before it (served one by one), and all but a few
    blocks still computing when a request arrives are hit."""
    from scenarios import requests_for_seed
    from sim import simulate

    cfg = compose_cfg("workload=trace", f"workload.trace_path={TRACE}",
                      "workload.max_requests=300", "workload.time_scale=4",
                      "cost_model=constant", "kv_cache.prefix_caching=true",
                      "kv_cache.num_gpu_blocks=20000000")
    req = requests_for_seed(cfg.workload, 0)
    cached = simulate(cfg, req).requests["cached_tokens"].to_numpy()
    ids = req["hash_ids"].to_numpy()
    prompts = req["input_tokens"].to_numpy(np.int64)
    kv = PagedKVCache(10**7, 16, len(prompts), prefix_caching=True)
    kv.set_prefix_source(ids)
    bound = np.zeros(len(prompts), np.int64)
    computed = np.zeros(len(prompts), np.int64)
    for rid in np.argsort(req["arrival_time_s"].to_numpy(), kind="stable").tolist():
        bound[rid] = kv.match_prefix(rid, int(prompts[rid]))
        kv.allocate(rid, int(bound[rid]), int(prompts[rid] - bound[rid]))
        computed[rid] = prompts[rid]
        kv.commit(computed)
        kv.free(rid)
    assert (cached <= bound).all()
    assert cached.sum() > 0.99 * bound.sum()


def _mooncake_run(compose_cfg, n: int, *overrides: str):
    from scenarios import requests_for_seed
    from sim import simulate

    cfg = compose_cfg("workload=trace", f"workload.trace_path={TRACE}",
                      f"workload.max_requests={n}", "workload.time_scale=4",
                      "cost_model=constant", "kv_cache.prefix_caching=true", *overrides)
    return simulate(cfg, requests_for_seed(cfg.workload, 0))


@pytest.mark.skipif(not TRACE.exists(), reason="needs ../shared/traces/mooncake_conversation.csv")
def test_mooncake_hit_rate_through_the_simulator(compose_cfg):
    rates = []
    for blocks in (2500, 100_000):
        r = _mooncake_run(compose_cfg, 500, f"kv_cache.num_gpu_blocks={blocks}").requests
        done = r[r.status == "completed"]
        assert (done.cached_tokens < done.input_tokens).all()
        rates.append(done.cached_tokens.sum() / done.input_tokens.sum())
    assert 0 < rates[0] < rates[1] <= 0.374


@pytest.mark.skipif(not TRACE.exists(), reason="needs ../shared/traces/mooncake_conversation.csv")
def test_fast_forward_is_exact_with_prefix_caching(compose_cfg):
    a = _mooncake_run(compose_cfg, 100, "kv_cache.num_gpu_blocks=6000").requests
    b = _mooncake_run(compose_cfg, 100, "kv_cache.num_gpu_blocks=6000",
                      "fast_forward=false").requests
    assert a.cached_tokens.sum() > 0
    assert (a.cached_tokens == b.cached_tokens).all()
    np.testing.assert_allclose(a.first_token_s, b.first_token_s, rtol=0, atol=1e-9)
    np.testing.assert_allclose(a.completion_s, b.completion_s, rtol=0, atol=1e-9)


def test_host_tier_keeps_evicted_blocks_and_copies_them_back():
    from sim.kv.offload import HostTier

    kv = PagedKVCache(9, 4, 4, prefix_caching=True)     # 8 usable blocks of 4 tokens
    kv.enable_offload(HostTier(3), block_copy_s=0.5)
    kv.set_prefix_source(np.array([(1,), (2,), (1,), (1,)], dtype=object), trace_block=16)
    computed = np.zeros(4, np.int64)
    for rid in (0, 1):                                 # 0's four blocks, then 1's evict them
        assert kv.match_prefix(rid, 16) == 0
        kv.allocate(rid, 0, 16)
        computed[rid] = 16
        kv.commit(computed)
        kv.free(rid)
    kv.allocate(3, 0, 32)                              # all 8 blocks: every cached one goes
    assert kv.cached_blocks == 0 and len(kv.host) == 3  # the host keeps the 3 latest
    kv.free(3)
    # rid 0's blocks 0..3 went first (LRU), then rid 1's: the tier holds only rid 1's tail
    assert kv.match_prefix(2, 17) == 0 and kv.take_copy_time() == 0
    kv.free(2)
    tier = HostTier(8)
    kv2 = PagedKVCache(9, 4, 4, prefix_caching=True)
    kv2.enable_offload(tier, block_copy_s=0.5)
    kv2.set_prefix_source(np.array([(1,), (2,), (1,), (1,)], dtype=object), trace_block=16)
    for rid in (0, 1):
        kv2.match_prefix(rid, 16)
        kv2.allocate(rid, 0, 16)
        computed[rid] = 16
        kv2.commit(computed)
        kv2.free(rid)
    kv2.allocate(3, 0, 16)                             # evicts rid 0's four blocks to the host
    assert len(tier) == 4
    assert kv2.match_prefix(2, 17) == 16               # all four come back from the host
    assert kv2.take_copy_time() == pytest.approx(2.0) and kv2.take_copy_time() == 0
    check_blocks(kv2, [2, 3])
    kv2.free([2, 3])
    check_blocks(kv2, [])
