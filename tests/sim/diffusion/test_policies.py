"""The diffusion pool's policies and gang sizing as plain objects, without SimPy: queue
order, preemption victims, elastic gang sizes and best-fit placement."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from sim.diffusion.policies import (
    FCFSPolicy,
    JobQueue,
    NodeView,
    PriorityPolicy,
    SJFPolicy,
    build_policy,
)
from sim.diffusion.policies.gang import GangSizer, best_fit, node_sizes


def unit(uid, seq=None, priority=0, predicted_s=1.0, gpus=8, run_start=0.0):
    return SimpleNamespace(uid=uid, seq=uid if seq is None else seq, priority=priority,
                           predicted_s=predicted_s, gpus=gpus, run_start=run_start)


def order(policy, units):
    q = JobQueue(policy)
    for u in units:
        q.push(u)
    return [q.pop().uid for _ in range(len(q))]


def test_fcfs_serves_in_arrival_order():
    units = [unit(3), unit(1), unit(2)]
    assert order(FCFSPolicy(), units) == [1, 2, 3]


def test_sjf_serves_the_shortest_predicted_first_ties_by_arrival():
    units = [unit(1, predicted_s=5.0), unit(2, predicted_s=1.0), unit(3, predicted_s=5.0),
             unit(4, predicted_s=0.5)]
    assert order(SJFPolicy(), units) == [4, 2, 1, 3]


def test_priority_serves_the_lowest_value_first_then_arrival():
    units = [unit(1, priority=2), unit(2, priority=0), unit(3, priority=2), unit(4, priority=1)]
    assert order(PriorityPolicy(), units) == [2, 4, 1, 3]


def test_queue_skips_removed_units():
    q = JobQueue(FCFSPolicy())
    a, b, c = unit(1), unit(2), unit(3)
    for u in (a, b, c):
        q.push(u)
    q.remove(a)
    assert len(q) == 2 and a not in q and b in q
    assert q.peek() is b and sorted(u.uid for u in q.units()) == [2, 3]


def test_only_priority_preempts_and_only_when_asked():
    assert not FCFSPolicy().preemptive and not SJFPolicy().preemptive
    assert PriorityPolicy().preemptive and not build_policy("priority", False).preemptive
    assert isinstance(build_policy("sjf"), SJFPolicy)


def test_priority_victims_are_the_least_urgent_on_the_cheapest_node():
    head = unit(99, priority=0)
    n0 = NodeView(0, free=0, draining=0, running=[unit(1, priority=1, gpus=4),
                                                   unit(2, priority=3, gpus=4)])
    n1 = NodeView(1, free=4, draining=0, running=[unit(3, priority=5, gpus=4)])
    victims = PriorityPolicy().victims(head, 8, [n0, n1])
    assert [v.uid for v in victims] == [3]  # one pause on node 1 beats two on node 0
    victims = PriorityPolicy().victims(head, 8, [n0])
    assert [v.uid for v in victims] == [2, 1]  # least urgent first


def test_priority_never_pauses_equal_or_more_urgent_jobs_nor_while_gpus_drain():
    head = unit(99, priority=1)
    same = NodeView(0, free=0, draining=0, running=[unit(1, priority=1), unit(2, priority=0)])
    assert PriorityPolicy().victims(head, 8, [same]) == []
    draining = NodeView(1, free=4, draining=4, running=[unit(3, priority=9, gpus=4)])
    assert PriorityPolicy().victims(head, 8, [draining]) == []


def test_node_sizes_and_best_fit():
    assert node_sizes(8) == [1, 2, 4, 8]
    assert node_sizes(6) == [1, 2, 4, 6]
    free = np.array([8, 3, 4, 0])
    assert best_fit(free, 4) == 2 and best_fit(free, 2) == 1 and best_fit(free, 9) == -1


def test_fixed_gangs_take_gpus_per_job_on_the_best_fitting_node():
    sizer = GangSizer(8, 4, elastic=False)
    assert sizer.place(np.array([8, 4]), 5, lambda g: True) == (1, 4)
    assert sizer.place(np.array([3, 2]), 1, lambda g: True) is None
    assert sizer.place(np.array([8]), 1, lambda g: g != 4) is None


@pytest.mark.parametrize("free, queued, target, expected", [
    ([8], 1, 1, (0, 8)),        # one job waiting: the largest gang that fits (fastest plan)
    ([8], 0, 1, (0, 8)),
    ([3, 8], 1, 1, (1, 8)),     # the largest gang that fits a node
    ([3, 0], 1, 8, (0, 2)),     # powers of two: 3 free GPUs give a 2-GPU gang
    ([8], 2, 1, (0, 1)),        # more waiting: the target size under load
    ([8], 50, 2, (0, 2)),
    ([8, 8], 4, 8, (0, 8)),     # a job that scales keeps a whole node
    ([4, 2], 4, 8, (0, 4)),     # capped by a node's free GPUs
    ([8], 3, None, (0, 1)),     # no target: the smallest valid size
])
def test_elastic_gang_by_queue_and_target(free, queued, target, expected):
    sizer = GangSizer(8, 8, elastic=True)
    assert sizer.place(np.array(free), queued, lambda g: True, target) == expected


def efficiency_times(speedup):
    """Job time on ``g`` GPUs for a speed-up function (100 s on one GPU)."""
    return lambda g: 100.0 / speedup(g)


@pytest.mark.parametrize("speedup, bar, expected", [
    (lambda g: g, 0.8, 8),                   # linear: every size is 100 % efficient
    (lambda g: 1 + 0.97 * (g - 1), 0.8, 8),  # a video: 97.4 % on 8 GPUs
    (lambda g: 1 + 0.75 * (g - 1), 0.8, 4),  # 0.8125 on 4, 0.78 on 8
    (lambda g: 1 + 0.5 * (g - 1), 0.8, 1),   # an image: 0.75 on 2 GPUs
    (lambda g: 1 + 0.5 * (g - 1), 0.75, 2),  # the bar is inclusive
])
def test_elastic_target_is_the_largest_size_at_the_efficiency_bar(speedup, bar, expected):
    sizer = GangSizer(8, 8, elastic=True, efficiency=bar)
    assert sizer.target(efficiency_times(speedup)) == expected


def test_elastic_target_measures_efficiency_from_the_smallest_valid_size():
    sizer = GangSizer(8, 8, elastic=True)
    # no plan on 1 GPU: 2 GPUs is the reference; 4 GPUs at 0.9 of it qualifies, 8 does not
    times = {2: 100.0, 4: 100.0 / (2 * 0.9), 8: 100.0 / (4 * 0.7)}
    assert sizer.target(times.get) == 4
    assert sizer.target(lambda g: None) is None


def test_elastic_skips_sizes_without_a_valid_plan():
    sizer = GangSizer(8, 8, elastic=True)
    assert sizer.place(np.array([8]), 8, lambda g: g >= 4, 1) == (0, 4)  # smallest valid
    assert sizer.place(np.array([8]), 1, lambda g: g != 8) == (0, 4)
    assert sizer.need(lambda g: g >= 2) == 2 and sizer.need(lambda g: False) is None
