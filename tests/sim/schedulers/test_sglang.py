"""SGLang's scheduler as a plain object: its decisions, and fast-forward exactness."""

from __future__ import annotations

import pickle

import numpy as np
import pandas as pd
import pytest
import simpy

from sim import simulate
from sim.config import SchedulerConfig
from sim.cost import ConstantCostModel
from sim.engine.replica import Replica
from sim.errors import ConfigError
from sim.kv.manager import PagedKVCache
from sim.records import LogHistogram
from sim.schedulers import sglang
from sim.schedulers.sglang import SglangScheduler
from sim.state import RequestTable


def make(prompts, outputs, num_blocks=10_000, block_size=16, hash_ids=None, add=True, **cfg):
    t = RequestTable(np.zeros(len(prompts)), np.array(prompts), np.array(outputs))
    kv = PagedKVCache(num_blocks + 1, block_size, len(prompts),
                      prefix_caching=hash_ids is not None)
    if hash_ids is not None:
        kv.set_prefix_source(np.array(hash_ids, dtype=object), trace_block=block_size)
    cfg = {"max_num_seqs": 64, "max_num_batched_tokens": 16384, "chunk_size": 8192} | cfg
    s = SglangScheduler(SchedulerConfig(name="sglang", **cfg), t, kv, LogHistogram())
    if add:
        for rid in range(len(prompts)):
            s.add_request(rid)
    return s, t, kv


def step(s, now):
    b = s.schedule(now)
    s.update(b, now + 1.0)
    return b


def test_prefill_steps_come_first_and_never_mix_with_decodes():
    s, t, _ = make([100, 50], [5, 5], add=False)
    s.add_request(0)
    step(s, 0.0)
    s.add_request(1)
    b = step(s, 1.0)
    assert list(b.ids) == [1] and list(b.new_tokens) == [50]   # request 0 waits a step
    b = step(s, 2.0)
    assert list(b.ids) == [0, 1] and list(b.new_tokens) == [1, 1]


def test_long_prompt_is_chunked_and_continued_first():
    s, t, _ = make([20_000, 10], [3, 3], chunk_size=8192)
    b = step(s, 0.0)
    assert list(b.ids) == [0] and list(b.new_tokens) == [8192]
    b = step(s, 1.0)
    assert list(b.ids) == [0] and list(b.new_tokens) == [8192]
    b = step(s, 2.0)                                             # last chunk, then the next
    assert list(b.ids) == [0, 1] and list(b.new_tokens) == [3616, 10]
    assert s.chunked == -1


def test_admission_reserves_future_decode_tokens():
    # 100 blocks of 16 = 1600 tokens; a running request reserves min(left, 4096) × 0.7
    s, t, kv = make([100, 100, 100], [1000, 1000, 1000], num_blocks=100)
    b = step(s, 0.0)
    # each needs 100 + 1000 tokens of the 1600: only the first fits
    assert list(b.ids) == [0]
    b = step(s, 1.0)
    # 1600 − 16·7 used ... minus 999 × ratio reserved: no room for 1100 more
    assert list(b.ids) == [0] and list(s.waiting) == [1, 2]
    assert s.new_token_ratio == pytest.approx(0.7 - sglang.NEW_TOKEN_RATIO_DECAY)


def test_new_token_ratio_decays_to_its_minimum_and_resets_when_idle():
    s, t, _ = make([10], [2000])
    for i in range(1000):
        step(s, float(i))
    assert s.new_token_ratio == pytest.approx(sglang.MIN_NEW_TOKEN_RATIO)
    while s.has_work():
        step(s, 0.0)
    assert s.schedule(0.0) is None and s.new_token_ratio == sglang.INIT_NEW_TOKEN_RATIO


def test_retraction_picks_the_least_progressed_longest_prompt_and_bumps_the_ratio():
    # 20 blocks of 4 tokens cannot hold three requests to their ends: one must be retracted
    s, t, kv = make([8, 12, 8], [40, 40, 40], num_blocks=20, block_size=4,
                    max_num_batched_tokens=64, chunk_size=64)
    now = 0.0
    while True:
        s.new_token_ratio = 0.0  # admit as a fully decayed ratio would
        gen, run = t.generated.copy(), s.running.copy()
        b = s.schedule(now)
        now += 1.0
        if s.preempted_in_last_step:
            break
        s.update(b, now)
    assert len(run) == 3
    first = min(run.tolist(), key=lambda r: (gen[r], -t.prompt[r]))
    assert t.preemptions[first] == 1 and first in s.waiting and first not in b.ids
    kept = b.ids
    assert s.new_token_ratio == pytest.approx(
        min(1.0, (gen[kept].sum() + 20 * len(kept)) / (t.max_output[kept].sum() + 1)))
    assert kv.free_blocks >= 0


def test_an_empty_server_admits_a_request_larger_than_its_reservation_allows():
    s, t, kv = make([8], [100], num_blocks=20, block_size=4)   # 108 tokens > 80 of cache
    b = step(s, 0.0)
    assert list(b.ids) == [0]


def test_longest_prefix_match_orders_the_waiting_queue():
    ids = [(1, 2, 3, 4), (5, 6, 7, 8), (1, 2, 3, 9), (1, 2, 9, 9)]
    s, t, kv = make([64, 64, 64, 64], [2, 2, 2, 2], hash_ids=ids, add=False)
    s.add_request(0)
    while s.has_work():
        step(s, 0.0)
    for rid in (1, 3, 2):
        s.add_request(rid)
    assert s.ordered_waiting() == [2, 3, 1]   # 48, 32 and 0 cached tokens
    b = s.schedule(1.0)
    assert list(b.ids) == [2, 3, 1] and list(b.context_tokens) == [48, 32, 0]
    assert list(t.cached_tokens) == [0, 0, 48, 32]


def _run(prompts, outputs, arrivals, fast_forward, hash_ids=None, num_blocks=400):
    env = simpy.Environment()
    s, t, kv = make(prompts, outputs, num_blocks=num_blocks, hash_ids=hash_ids, add=False,
                    max_num_batched_tokens=256, chunk_size=128)
    rep = Replica(env, s, ConstantCostModel(step_time_s=0.01),
                  on_complete=lambda ids, now: None, fast_forward=fast_forward)

    def arrive():
        for rid in np.argsort(arrivals, kind="stable"):
            yield env.timeout(arrivals[rid] - env.now)
            t.arrival[rid] = env.now
            rep.submit(int(rid))

    env.process(arrive())
    env.run()
    return t


@pytest.mark.parametrize("prefix", [False, True])
def test_fast_forward_is_exact(prefix):
    rng = np.random.default_rng(3)
    n = 40
    prompts = rng.integers(10, 300, n)
    outputs = rng.integers(1, 120, n)
    arrivals = np.sort(rng.exponential(0.05, n).cumsum())
    ids = [tuple([int(g)] + list(range(100 * i, 100 * i + 10))) for i, g in
           enumerate(rng.integers(0, 3, n))] if prefix else None
    a = _run(prompts, outputs, arrivals, True, ids)
    b = _run(prompts, outputs, arrivals, False, ids)
    assert (a.generated == outputs).all()
    np.testing.assert_allclose(a.first_token, b.first_token, rtol=0, atol=1e-9)
    np.testing.assert_allclose(a.completion, b.completion, rtol=0, atol=1e-9)
    assert (a.preemptions == b.preemptions).all() and (a.cached_tokens == b.cached_tokens).all()
    if prefix:
        assert a.cached_tokens.sum() > 0


def _drain(s, limit: int = 500) -> int:
    """Steps until nothing runs; the number of requests finished."""
    done, now = 0, 0.0
    while (b := s.schedule(now)) is not None and limit:
        now, limit = now + 1.0, limit - 1
        done += len(s.update(b, now))
    return done


def test_a_chunk_counts_against_the_tokens_left_for_new_requests():
    """17 blocks of 8: request 0's second chunk (41 tokens) and request 1 (25 + 1) would
    leave no block for either to go on; counting the chunk (as SGLang's add_chunked_req
    does) keeps request 1 waiting until there is room, and both finish."""
    s, t, kv = make([105, 25], [9, 1], num_blocks=17, block_size=8,
                    max_num_batched_tokens=64, chunk_size=64)
    b = step(s, 0.0)
    assert list(b.ids) == [0] and list(b.new_tokens) == [64]
    b = step(s, 1.0)
    assert list(b.ids) == [0] and list(b.new_tokens) == [41]
    assert _drain(s) == 2 and (t.generated == t.max_output).all()


def test_cached_blocks_a_hit_locks_count_against_the_tokens_left():
    """15 blocks of 8: request 2 hits request 0's 6 freed cached blocks; they are no longer
    evictable, so request 1 (65 tokens) is not admitted beside it into a cache it cannot
    finish in, and every request finishes."""
    s, t, kv = make([48, 65, 49], [1, 6, 9], num_blocks=15, block_size=8,
                    hash_ids=[tuple(range(100, 106)), tuple(range(7)),
                              tuple(range(100, 107))],
                    max_num_batched_tokens=64, chunk_size=64)
    step(s, 0.0)
    b = step(s, 1.0)
    assert list(b.ids) == [2] and t.cached_tokens[2] == 48
    assert _drain(s) == 2 and (t.generated == t.max_output).all()  # 0 finished in step 0


def test_a_cache_the_last_decode_and_a_chunked_prefill_fill_ends_the_run_with_one_line(
        compose_cfg):
    """gpt-oss (9 sliding-window state blocks a request) in 40 blocks: request 1, retracted
    and re-admitted with its 155 tokens in 16-token chunks, holds 18 blocks when request 0,
    decoding alone, needs its 23rd. Neither can go on (SGLang stops there too): the run ends
    with a ConfigError naming the field, through SimPy's re-raise, not an AssertionError."""
    cfg = compose_cfg("cost_model=constant", "engine=python", "scheduler=sglang",
                      "model=gpt_oss_120b", "kv_cache.block_size=16", "scheduler.max_num_seqs=3",
                      "scheduler.chunk_size=16", "scheduler.max_num_batched_tokens=16",
                      "kv_cache.num_gpu_blocks=41")
    req = pd.DataFrame({"arrival_time_s": [0.397327, 0.422148], "input_tokens": [21, 6],
                        "output_tokens": [199, 196], "client": -1, "think_time_s": 0.0})
    with pytest.raises(ConfigError) as e:
        simulate(cfg, req)
    assert str(e.value).startswith("kv_cache.num_gpu_blocks=41: the KV cache is full")
    assert "\n" not in str(e.value)
    assert str(pickle.loads(pickle.dumps(e.value))) == str(e.value)  # as a sweep's worker
    cfg.kv_cache.num_gpu_blocks = 46  # room for both: they finish
    assert (simulate(cfg, req).requests["status"] == "completed").all()
