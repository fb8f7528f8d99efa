"""vLLM's priority policy and EDF: waiting order and victim choice, without SimPy."""

from __future__ import annotations

import signal
from dataclasses import replace

import numpy as np
import pytest

from sim import simulate
from sim.errors import ConfigError


def test_priority_orders_admission_then_arrival(make, step):
    s, t, _ = make("vllm", [10, 10, 10, 10], [1, 1, 1, 1], arrivals=[0.0, 0.1, 0.2, 0.3],
                   priority=np.array([2, 0, 1, 0]), policy="priority", max_num_seqs=1)
    order = []
    for i in range(4):
        b, _ = step(s, float(i))
        order += list(b.ids)
    assert order == [1, 3, 2, 0]


def test_fcfs_ignores_priorities(make):
    s, _, _ = make("vllm", [10, 10], [1, 1], priority=np.array([5, 0]), max_num_seqs=1)
    assert list(s.schedule(0.0).ids) == [0]


def test_priority_preempts_the_least_urgent_wherever_it_runs(make, step):
    # 8 blocks of 4 tokens; four 8-token prompts take all of them
    s, t, kv = make("vllm", [8, 8, 8, 8], [20, 20, 20, 20], num_blocks=8, block_size=4,
                    priority=np.array([1, 0, 2, 0]), policy="priority")
    step(s, 0.0)
    # 0 needs a block: the victim is 2 (priority 2), not the last admitted (3); 0 and 1 get
    # theirs; 3 then needs one: the least urgent left is 0 (priority 1), already scheduled in
    # this step, so its token goes back to the budget and 3 runs instead
    b = s.schedule(1.0)
    assert list(b.ids) == [1, 3] and list(b.new_tokens) == [1, 1]
    assert list(t.preemptions) == [1, 0, 1, 0] and list(s.running) == [1, 3]
    assert list(s.waiting) == [0, 2]  # back in the queue by priority, not at the front
    assert kv.held[0] == kv.held[2] == 0 and kv.free_blocks == 2


def test_priority_victim_ties_go_to_the_latest_arrival(make, step):
    s, t, _ = make("vllm", [8, 8, 8], [20, 20, 20], arrivals=[0.0, 0.2, 0.1], num_blocks=6,
                   block_size=4, priority=np.array([0, 0, 0]), policy="priority")
    step(s, 0.0)
    s.schedule(1.0)
    assert t.preemptions[1] == 1  # same priority: the latest arrival (0.2) goes first


def test_keyed_queue_with_room_does_not_fast_forward(make, step):
    s, _, kv = make("vllm", [8, 8, 100], [20, 20, 5], num_blocks=6, block_size=4,
                    priority=np.array([0, 0, 0]), policy="priority", max_num_seqs=4)
    step(s, 0.0)  # 0 and 1 run; 2 needs 25 blocks and waits
    b = s.schedule(1.0)
    assert list(s.waiting) == [2] and not s.can_fast_forward(b)
    fcfs, _, _ = make("vllm", [8, 8, 100], [20, 20, 5], num_blocks=6, block_size=4,
                      max_num_seqs=4)
    step(fcfs, 0.0)
    assert fcfs.can_fast_forward(fcfs.schedule(1.0))


def test_edf_serves_the_earliest_ttft_deadline(make, step):
    # deadlines 0 + 10, 0.1 + 0.5, 0.2 + 1.0 → order 1, 2, 0
    s, _, _ = make("edf", [10, 10, 10], [1, 1, 1], arrivals=[0.0, 0.1, 0.2],
                   ttft_slo_s=np.array([10.0, 0.5, 1.0]), max_num_seqs=1)
    order = [int(step(s, float(i))[0].ids[0]) for i in range(3)]
    assert order == [1, 2, 0]


def test_edf_without_targets_is_fcfs(make, step):
    s, _, _ = make("edf", [10, 10, 10], [1, 1, 1], arrivals=[0.0, 0.1, 0.2], max_num_seqs=1)
    assert [int(step(s, float(i))[0].ids[0]) for i in range(3)] == [0, 1, 2]


def test_equal_keys_preempt_the_larger_id(make, step):
    """Two requests of one priority and arrival: the victim is the later one in the waiting
    queue's order (the larger id), not the first of the running list; were it the first,
    each would preempt the other as it is readmitted at the front, forever."""
    s, t, _ = make("vllm", [8, 8], [20, 20], num_blocks=5, block_size=4,
                   priority=np.array([0, 0]), policy="priority")
    step(s, 0.0)
    assert list(s.running) == [0, 1]
    for now in range(1, 4):
        step(s, float(now))
    assert list(t.preemptions) == [0, 1]


@pytest.mark.parametrize("engine", ["python", "auto"])
def test_equal_keys_that_cannot_all_fit_end(tiny_config, requests, engine):
    """EDF in 3-token chunks on a cache too small for its four requests behind
    ``prefix_affinity`` (an adversarial campaign's case): it ends (it ran forever when each
    of two requests with one key was the other's victim)."""
    cfg = tiny_config("edf", num_blocks=15, block_size=4, max_seqs=2, budget=400,
                      roofline=True, long_prefill_token_threshold=3,
                      enable_chunked_prefill=False)
    cfg.kv_cache = replace(cfg.kv_cache, prefix_caching=True)
    cfg.cluster = replace(cfg.cluster, replicas=2, router="prefix_affinity",
                          prefix_block_tokens=3)
    cfg.engine = engine
    ids = np.empty(4, object)
    ids[:] = [(0, 1, 2, 3, 4, 5, 10200, 10201, 0, 0, 1), (200, 10250, 10251, 200, 200, 10250),
              None, (0,)]
    req = requests([0.0] * 4, [35, 17, 20, 1], [20, 10, 20, 20], hash_ids=ids)
    signal.signal(signal.SIGALRM, _too_long)
    signal.alarm(60)
    try:
        rec = simulate(cfg, req)
    finally:
        signal.alarm(0)
    assert (rec.requests["status"] == "completed").all()


def _too_long(*_):
    raise TimeoutError("the run did not end within 60 s")


@pytest.mark.parametrize("value", [np.nan, 0.0, -5.0])
def test_a_ttft_target_that_is_not_a_number_above_zero_is_one_error(tiny_config, requests,
                                                                     value):
    """A NaN deadline would compare with nothing (no victim among equal keys again); the
    table column is refused as the workload's classes are (inf: no target)."""
    req = requests([0.0, 0.1], [10, 10], [5, 5])
    req["ttft_slo_ms"] = [np.inf, value]
    cfg = tiny_config("edf", roofline=True)
    with pytest.raises(ConfigError, match="a number > 0") as err:
        simulate(cfg, req)
    assert err.value.field == "requests.ttft_slo_ms (row 1)"
    req["ttft_slo_ms"] = [np.inf, 50.0]
    assert (simulate(cfg, req).requests["status"] == "completed").all()
