"""Sarathi-Serve's stall-free batching decisions, without SimPy."""

from __future__ import annotations

import numpy as np


def test_decodes_first_then_chunks_fill_the_chunk_size(make, step):
    s, _, kv = make("sarathi", [100, 1000], [5, 5], add=False, chunk_size=512,
                    max_num_batched_tokens=512, max_num_seqs=8)
    s.add_request(0)
    step(s, 0.0)
    s.add_request(1)
    b, _ = step(s, 1.0)
    assert list(b.ids) == [0, 1] and list(b.new_tokens) == [1, 511]
    assert kv.held[1] == 63  # the whole 1000-token prompt's blocks, taken at admission
    b, _ = step(s, 2.0)
    assert list(b.ids) == [0, 1] and list(b.new_tokens) == [1, 489]


def test_prompts_are_chunked_fcfs(make):
    s, _, _ = make("sarathi", [300, 300, 300], [2, 2, 2], chunk_size=512,
                   max_num_batched_tokens=512)
    b = s.schedule(0.0)
    assert list(b.ids) == [0, 1] and list(b.new_tokens) == [300, 212]
    assert list(s.waiting) == [2]


def test_admission_needs_room_for_the_whole_prompt(make):
    # 10 blocks of 4 tokens: a 30-token prompt needs 8, the next 12-token prompt 3 > 2 left
    s, _, _ = make("sarathi", [30, 12], [2, 2], num_blocks=10, block_size=4, chunk_size=16,
                   max_num_batched_tokens=16)
    b = s.schedule(0.0)
    assert list(b.ids) == [0] and list(b.new_tokens) == [16] and list(s.waiting) == [1]


def test_short_cache_preempts_the_latest_arrival_not_yet_visited(make, step):
    # 8 blocks of 4 tokens; four 8-token prompts take all of them (2 each)
    s, t, kv = make("sarathi", [8, 8, 8, 8], [20, 20, 20, 20], arrivals=[0.0, 0.1, 0.2, 0.3],
                    num_blocks=8, block_size=4, chunk_size=64, max_num_batched_tokens=64)
    b, _ = step(s, 0.0)
    assert list(b.ids) == [0, 1, 2, 3] and kv.free_blocks == 0
    # every decode needs a 3rd block: 0 preempts 3 (the latest arrival) and then 0 and 1 get
    # one; 2 has no one left after it to preempt but itself
    b, _ = step(s, 1.0)
    assert list(b.ids) == [0, 1] and list(t.preemptions) == [0, 0, 1, 1]
    assert s.preempted_in_last_step
    # Sarathi also admits in a step that preempted; here 2 is back at the front of the queue
    # and its 9 tokens (prompt + generated) need 3 blocks, one more than the 2 free
    assert list(s.waiting) == [2, 3] and kv.free_blocks == 2


def test_decode_only_batch_can_fast_forward(make, step):
    s, _, _ = make("sarathi", [10, 10], [50, 50], chunk_size=64, max_num_batched_tokens=64)
    step(s, 0.0)
    b = s.schedule(1.0)
    assert np.array_equal(b.new_tokens, [1, 1]) and s.can_fast_forward(b)
