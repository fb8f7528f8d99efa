"""TensorRT-LLM capacity and micro-batch decisions, without SimPy."""

from __future__ import annotations

import numpy as np


def test_guaranteed_no_evict_reserves_the_full_length(make):
    # 10 blocks of 4 tokens; a request's full length is ceil((8 + 20 − 1) / 4) = 7 blocks
    s, _, kv = make("trtllm", [8, 8], [20, 20], num_blocks=10, block_size=4)
    b = s.schedule(0.0)
    assert list(b.ids) == [0] and list(s.waiting) == [1]
    assert kv.held[0] == 2  # paged: only the prompt's blocks are taken now


def test_max_utilization_admits_on_current_need(make):
    s, _, _ = make("trtllm", [8, 8], [20, 20], num_blocks=10, block_size=4,
                   capacity_scheduler_policy="MAX_UTILIZATION")
    assert list(s.schedule(0.0).ids) == [0, 1]


def test_context_chunks_are_whole_blocks_after_generation_tokens(make, step):
    s, _, _ = make("trtllm", [30, 200], [5, 5], block_size=16, max_num_batched_tokens=100,
                   max_num_seqs=4)
    b, _ = step(s, 0.0)
    # 30 fit whole; the 70 left are cut to 64, a multiple of the block size
    assert list(b.ids) == [0, 1] and list(b.new_tokens) == [30, 64]
    b, _ = step(s, 1.0)
    # the generation token first, then 99 tokens of room → 96
    assert list(b.ids) == [0, 1] and list(b.new_tokens) == [1, 96]


def test_without_chunking_a_context_that_does_not_fit_waits(make):
    s, _, _ = make("trtllm", [30, 200], [5, 5], max_num_batched_tokens=100, max_num_seqs=4,
                   enable_chunked_prefill=False)
    b = s.schedule(0.0)
    assert list(b.ids) == [0] and list(s.waiting) == [1]


def test_max_utilization_pauses_the_last_started(make, step):
    # 6 blocks of 4; three 8-token prompts take them all; each decode then needs a block
    s, t, kv = make("trtllm", [8, 8, 8], [20, 20, 20], num_blocks=6, block_size=4,
                    capacity_scheduler_policy="MAX_UTILIZATION")
    step(s, 0.0)
    b, _ = step(s, 1.0)
    assert list(b.ids) == [0, 1] and list(t.preemptions) == [0, 0, 1]
    assert list(s.waiting) == [2] and s.preempted_in_last_step


def test_guaranteed_no_evict_never_preempts(make, step):
    # 6 blocks of 4; each request's full length (8 + 8 − 1 tokens) needs 4: one at a time
    s, t, kv = make("trtllm", [8, 8, 8], [8, 8, 8], num_blocks=6, block_size=4)
    for i in range(30):
        if not s.has_work():
            break
        b, _ = step(s, float(i))
        assert len(b.ids) == 1 and kv.free_blocks >= 0
    assert not t.preemptions.any() and np.array_equal(t.generated, [8, 8, 8])


def test_budget_smaller_than_a_block_is_its_own_chunk_unit(make, step):
    s, _, _ = make("trtllm", [13], [2], block_size=16, max_num_batched_tokens=8, max_num_seqs=1)
    assert list(step(s, 0.0)[0].new_tokens) == [8]
    assert list(step(s, 1.0)[0].new_tokens) == [5]
