"""Static and dynamic batching decisions, without SimPy."""

from __future__ import annotations

import math

import numpy as np


def test_static_batch_is_padded_and_runs_to_its_longest_output(make, step):
    s, t, kv = make("static", [10, 30, 20, 5], [3, 1, 2, 2], max_num_seqs=3,
                    max_num_batched_tokens=1000)
    b, done = step(s, 0.0)
    assert list(b.ids) == [0, 1, 2] and list(b.new_tokens) == [10, 30, 20]
    new, ctx = b.cost_shape()
    assert list(new) == [30, 30, 30] and list(ctx) == [0, 0, 0]  # padded to the longest prompt
    # request 1 (one output token) finished with the prefill and gave its blocks back
    assert list(done) == [1] and list(kv.held[:3]) == [1, 0, 2]
    assert list(s.waiting) == [3]
    b, done = step(s, 1.0)
    assert list(b.ids) == [0, 2] and list(b.context_tokens) == [10, 20]
    new, ctx = b.cost_shape()
    assert list(new) == [1, 1, 1] and list(ctx) == [30, 30, 30]  # finished rows stay as padding
    assert list(done) == [2]
    b, done = step(s, 2.0)
    assert list(b.ids) == [0] and list(b.cost_shape()[1]) == [31, 31, 31]
    assert list(done) == [0]
    b, _ = step(s, 3.0)  # only now does the waiting request start
    assert list(b.ids) == [3] and list(b.cost_shape()[0]) == [5]
    assert t.first_scheduled[3] == 3.0


def test_static_reservation_while_batch_runs(make):
    s, _, kv = make("static", [10, 30], [3, 1], max_num_seqs=3)
    s.schedule(0.0)
    # 0: 10 + 3 − 1 = 12 tokens → 1 block; 1: 30 + 1 − 1 = 30 tokens → 2 blocks
    assert list(kv.held) == [1, 2]


def test_static_batch_stops_at_the_padded_token_budget(make):
    s, _, _ = make("static", [100, 300, 50], [2, 2, 2], max_num_seqs=8,
                   max_num_batched_tokens=600)
    b = s.schedule(0.0)
    assert list(b.ids) == [0, 1]  # 3 × 300 padded tokens would exceed 600
    assert b.num_tokens == 400 and list(b.cost_shape()[0]) == [300, 300]


def test_static_batch_stops_when_the_cache_cannot_reserve(make):
    # 4-token blocks, 10 of them: each request reserves ceil((8 + 20 − 1) / 4) = 7
    s, _, kv = make("static", [8, 8], [20, 20], num_blocks=10, block_size=4)
    b = s.schedule(0.0)
    assert list(b.ids) == [0] and kv.held[0] == 7 and list(s.waiting) == [1]


def test_static_never_fast_forwards(make, step):
    s, _, _ = make("static", [10, 10], [50, 50])
    step(s, 0.0)
    assert not s.can_fast_forward(s.schedule(1.0))


def test_dynamic_waits_for_the_queue_delay(make):
    s, t, _ = make("dynamic", [10, 10, 10], [2, 2, 2], arrivals=[0.0, 0.05, 0.5],
                   add=False, max_num_seqs=4, max_queue_delay_ms=100.0)
    s.add_request(0)
    assert s.schedule(0.0) is None and math.isclose(s.next_wakeup(0.0), 0.1)
    s.add_request(1)
    assert s.schedule(0.05) is None and math.isclose(s.next_wakeup(0.05), 0.1)
    b = s.schedule(0.1)
    assert list(b.ids) == [0, 1]
    assert s.next_wakeup(0.1) == math.inf  # a batch is running
    assert np.allclose(t.first_scheduled[:2], 0.1)


def test_dynamic_starts_a_full_batch_at_once(make):
    s, _, _ = make("dynamic", [10, 10, 10], [2, 2, 2], max_num_seqs=2,
                   max_queue_delay_ms=1000.0)
    b = s.schedule(0.0)
    assert list(b.ids) == [0, 1] and list(s.waiting) == [2]


def test_dynamic_batch_is_full_when_a_limit_stops_it(make):
    # the padded budget takes only two of three waiting requests: the batch cannot grow
    s, _, _ = make("dynamic", [100, 300, 50], [2, 2, 2], max_num_seqs=8,
                   max_num_batched_tokens=600, max_queue_delay_ms=1000.0)
    assert list(s.schedule(0.0).ids) == [0, 1]


def test_dynamic_with_zero_delay_is_static(make, step):
    a, ta, _ = make("dynamic", [10, 40, 20, 5], [3, 1, 4, 2], max_num_seqs=2)
    b, tb, _ = make("static", [10, 40, 20, 5], [3, 1, 4, 2], max_num_seqs=2)
    for i in range(12):
        step(a, float(i))
        step(b, float(i))
    assert np.array_equal(ta.completion, tb.completion, equal_nan=True)
