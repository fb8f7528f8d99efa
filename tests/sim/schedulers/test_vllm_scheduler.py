"""The vLLM-style scheduler as a plain object, without SimPy."""

from __future__ import annotations

import numpy as np

from sim.config import SchedulerConfig
from sim.kv.manager import PagedKVCache
from sim.records import LogHistogram
from sim.schedulers.vllm import VllmScheduler
from sim.state import RequestTable


def make(prompts, outputs, num_blocks=10_000, block_size=16, **sched):
    t = RequestTable(np.zeros(len(prompts)), np.array(prompts), np.array(outputs))
    kv = PagedKVCache(num_blocks + 1, block_size, len(prompts))  # + vLLM's null block
    s = VllmScheduler(SchedulerConfig(**sched), t, kv, LogHistogram(keep_samples=True))
    for rid in range(len(prompts)):
        s.add_request(rid)
    return s, t, kv


def step(s, now):
    batch = s.schedule(now)
    done = s.update(batch, now + 1.0)
    return batch, done


def test_long_prompt_is_chunked_by_the_token_budget():
    s, t, _ = make([10_000], [3], max_num_batched_tokens=8192)
    b, _ = step(s, 0.0)
    assert list(b.new_tokens) == [8192] and np.isnan(t.first_token[0])
    b, _ = step(s, 1.0)
    assert list(b.new_tokens) == [1808] and list(b.context_tokens) == [8192]
    assert t.first_token[0] == 2.0 and t.generated[0] == 1


def test_running_requests_are_served_before_waiting_ones():
    s, t, _ = make([100, 9000], [5, 5], max_num_batched_tokens=8192)
    s.waiting.pop()  # request 1 arrives later
    step(s, 0.0)      # request 0 prefilled
    s.add_request(1)
    b, _ = step(s, 1.0)
    assert list(b.ids) == [0, 1]
    assert list(b.new_tokens) == [1, 8191]  # decode first, the rest of the budget to the prefill


def test_max_num_seqs_and_fcfs_admission():
    s, _, _ = make([10, 10, 10], [4, 4, 4], max_num_seqs=2)
    b = s.schedule(0.0)
    assert list(b.ids) == [0, 1] and list(s.waiting) == [2]


def test_finished_requests_leave_and_free_their_blocks():
    s, t, kv = make([20, 20], [1, 3], block_size=4)
    _, done = step(s, 0.0)
    assert list(done) == [0] and kv.held[0] == 0 and t.completion[0] == 1.0
    assert list(s.running) == [1]
    step(s, 1.0)
    _, done = step(s, 2.0)
    assert list(done) == [1] and kv.free_blocks == kv.num_blocks
    assert len(s.itl.samples()) == 2  # tokens 2 and 3 of request 1


def test_full_cache_preempts_the_last_admitted_by_recompute():
    # 8 blocks of 4 tokens; four 8-token prompts take all of them
    s, t, kv = make([8, 8, 8, 8], [20, 20, 20, 20], num_blocks=8, block_size=4)
    b, _ = step(s, 0.0)
    assert list(b.ids) == [0, 1, 2, 3] and kv.free_blocks == 0
    # each now needs a 3rd block: 3 (last admitted) is preempted, serving 0 and 1; then 2 needs
    # a block, and the last running request is 2 itself, so it is preempted too
    b, _ = step(s, 1.0)
    assert list(b.ids) == [0, 1] and list(b.new_tokens) == [1, 1]
    assert list(s.waiting) == [2, 3]  # most recently preempted at the front
    assert list(t.preemptions) == [0, 0, 1, 1]
    assert t.computed[2] == 0 and t.num_tokens[2] == 9  # keeps its generated token
    assert s.preempted_in_last_step
    # recompute: 2 comes back with its prompt and generated token as a 9-token prefill
    s.kv.free(np.array([0, 1]))
    s.running = s.running[:0]
    b = s.schedule(2.0)
    assert list(b.ids) == [2, 3] and list(b.new_tokens) == [9, 9]


def test_no_admission_in_a_step_that_preempted():
    s, _, kv = make([8, 8, 8], [20, 20, 20], num_blocks=6, block_size=4, max_num_seqs=2)
    step(s, 0.0)
    assert list(s.waiting) == [2]
    s.kv.free_blocks -= 1  # squeeze the cache so the next step must preempt
    b = s.schedule(1.0)
    assert s.preempted_in_last_step and 2 not in b.ids
