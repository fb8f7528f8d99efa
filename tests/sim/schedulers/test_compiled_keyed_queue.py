"""The compiled keyed waiting queue (``sim.compiled.keyed_queue``) serves requests in
``KeyedQueue``'s order under any sequence of pushes and pops, ties included."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.compiled import keyed_queue as Q
from sim.compiled.replica_rows import NUM_FIELDS, WCOUNT, WHEAD
from sim.schedulers.queues import KeyedQueue


@settings(max_examples=200, deadline=None)
@given(bases=st.lists(st.sampled_from([0.0, 1.0, 2.0, np.inf]), min_size=1, max_size=60),
       arrivals=st.lists(st.sampled_from([0.0, 0.5, 1.0, 1.5]), min_size=60, max_size=60),
       ops=st.lists(st.booleans(), max_size=200),
       order=st.sampled_from([Q.PRIORITY, Q.DEADLINE]))
def test_pops_come_in_keyed_queue_order(bases, arrivals, ops, order):
    n = len(bases)
    base, arrival = np.array(bases), np.array(arrivals[:n])
    waiting = (np.zeros(n, np.int64), np.full(n, -1, np.int64), np.zeros(n), np.zeros(n), base)
    q = np.zeros(NUM_FIELDS, np.int64)
    offset = arrival if order == Q.DEADLINE else np.zeros(n)
    ref = KeyedQueue(lambda rid: (float(base[rid] + offset[rid]), float(arrival[rid])))
    outside = list(range(n))  # ids not queued, pushed in this order (each back at the end)
    for push in ops:
        if push and outside:
            rid = outside.pop(0)
            Q.wait_push(q, waiting, rid, arrival, order)
            ref.append(rid)
        elif ref:
            assert q[WHEAD] == ref[0]
            rid = Q.wait_pop_keyed(q, waiting)
            assert rid == ref.popleft()
            outside.append(rid)
        assert q[WCOUNT] == len(ref)
    while ref:
        assert Q.wait_pop_keyed(q, waiting) == ref.popleft()


def test_the_victim_is_the_least_urgent_by_key_then_id():
    k1, k2 = np.array([1.0, 2.0, 2.0, 0.0]), np.array([0.0, 0.5, 0.5, 9.0])
    waiting = (np.zeros(4, np.int64), np.zeros(4, np.int64), k1, k2, np.zeros(4))
    run = np.array([3, 2, 1, 0], np.int64)
    assert Q.latest_key(run, 4, waiting) == 1  # 1 and 2 tie: the larger id, wherever it runs
    assert Q.latest_key(np.array([3, 1, 2, 0], np.int64), 4, waiting) == 2
    assert Q.latest_key(run, 1, waiting) == 0
