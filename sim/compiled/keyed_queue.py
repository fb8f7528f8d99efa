"""A compiled replica's waiting queue ordered by a key: ``sim.schedulers.queues.KeyedQueue``.

Under vLLM's ``policy=priority`` and ``scheduler=edf`` a replica serves its waiting requests
smallest ``(k1, k2, id)`` first, ``k1`` the priority or the deadline (arrival + TTFT SLO),
``k2`` the arrival. Each replica's queue is a pairing heap whose links are per-request arrays
(a request waits on one replica at a time, so one set serves every replica): ``waiting`` is
``(wnext, child, k1, k2, base)`` — a node's next sibling (under FCFS, the next in line),
its first child, its key, and per request the key's base (its priority, or its TTFT SLO);
the replica's ``WHEAD`` is the root, the most urgent request. The keys being distinct, pops
come in the same order as from ``KeyedQueue``'s binary heap.
"""

from __future__ import annotations

from sim.compiled.jit import compiled
from sim.compiled.replica_rows import ORDER, WCOUNT, WHEAD, wait_append

FCFS, PRIORITY, DEADLINE = 0, 1, 2  # the waiting orders (cfg[ORDER])


@compiled
def urgent(a, b, k1, k2):
    """Whether request ``a`` is served before ``b``: by ``(k1, k2, id)``."""
    if k1[a] != k1[b]:
        return k1[a] < k1[b]
    if k2[a] != k2[b]:
        return k2[a] < k2[b]
    return a < b


@compiled
def _meld(a, b, waiting):
    """The root of the two heaps rooted at ``a`` and ``b``: the more urgent, the other its
    first child."""
    wnext, child, k1, k2 = waiting[0], waiting[1], waiting[2], waiting[3]
    if urgent(b, a, k1, k2):
        a, b = b, a
    wnext[b] = child[a]
    child[a] = b
    return a


@compiled
def wait_push(q, waiting, rid, arrival, order):
    """Queue ``rid`` at the place its key gives it (``KeyedQueue.append``; also how a
    preempted request goes back)."""
    wnext, child, k1, k2, base = waiting
    k1[rid] = base[rid] + arrival[rid] if order == DEADLINE else base[rid]
    k2[rid] = arrival[rid]
    child[rid] = -1
    wnext[rid] = -1
    q[WHEAD] = _meld(q[WHEAD], rid, waiting) if q[WCOUNT] else rid
    q[WCOUNT] += 1


@compiled
def wait_pop_keyed(q, waiting):
    """Remove and return the most urgent request (``KeyedQueue.popleft``): its children
    melded in pairs left to right, then the pairs from the last to the first."""
    wnext, child = waiting[0], waiting[1]
    root = q[WHEAD]
    q[WCOUNT] -= 1
    if q[WCOUNT] == 0:
        return root
    pairs = -1  # the melded pairs, last first, linked through wnext
    c = child[root]
    while c >= 0:
        b = wnext[c]
        if b < 0:
            nxt, m = -1, c
        else:
            nxt = wnext[b]
            m = _meld(c, b, waiting)
        wnext[m] = pairs
        pairs = m
        c = nxt
    m = pairs
    p = wnext[m]
    while p >= 0:
        nxt = wnext[p]
        m = _meld(m, p, waiting)
        p = nxt
    q[WHEAD] = m
    return root


@compiled
def queue(q, waiting, rid, arrival, cfg):
    """Queue ``rid`` on the replica's waiting queue in its order (``cfg[ORDER]``)."""
    if cfg[ORDER] == FCFS:
        wait_append(q, waiting[0], rid)
    else:
        wait_push(q, waiting, rid, arrival, cfg[ORDER])


@compiled
def latest_key(run, nrun, waiting):
    """Index in ``run[:nrun]`` of the request least urgent by ``(k1, k2, id)``: the
    preemption victim under a keyed order (``VllmScheduler._victim``)."""
    k1, k2 = waiting[2], waiting[3]
    j = 0
    for i in range(1, nrun):
        if urgent(run[j], run[i], k1, k2):
            j = i
    return j
