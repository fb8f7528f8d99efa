"""Orca's iteration-level decisions, without SimPy."""

from __future__ import annotations


def test_whole_prompts_only_no_chunking(make, step):
    s, _, _ = make("orca", [6000, 3000], [5, 5], max_num_batched_tokens=8192)
    b, _ = step(s, 0.0)
    # 3000 more tokens do not fit in the 2192 left: Orca does not split the prompt
    assert list(b.ids) == [0] and list(b.new_tokens) == [6000] and list(s.waiting) == [1]
    b, _ = step(s, 1.0)
    assert list(b.ids) == [0, 1] and list(b.new_tokens) == [1, 3000]


def test_vllm_chunks_where_orca_waits(make):
    s, _, _ = make("vllm", [6000, 3000], [5, 5], max_num_batched_tokens=8192)
    assert list(s.schedule(0.0).new_tokens) == [6000, 2192]


def test_max_batch_size(make):
    s, _, _ = make("orca", [10, 10, 10], [4, 4, 4], max_num_seqs=2)
    assert list(s.schedule(0.0).ids) == [0, 1] and list(s.waiting) == [2]


def test_reserves_max_tokens_at_admission_and_never_preempts(make, step):
    # 10 blocks of 4 tokens; each request reserves ceil((8 + 20 − 1) / 4) = 7 blocks
    s, t, kv = make("orca", [8, 8], [20, 20], num_blocks=10, block_size=4)
    b, _ = step(s, 0.0)
    assert list(b.ids) == [0] and kv.held[0] == 7 and list(s.waiting) == [1]
    now = 1.0
    while s.has_work():
        step(s, now)
        now += 1.0
        assert kv.free_blocks >= 0
    assert list(t.preemptions) == [0, 0] and list(t.generated) == [20, 20]
    assert t.first_scheduled[1] == 20.0  # admitted once request 0 freed its reservation
