"""The compiled event loop of one pool of vLLM-style replicas behind a router.

One call of ``run`` processes events in time order — an arrival (routed, queued, waking an
idle replica), the end of a replica's step (its tokens land, finished requests end, it
schedules its next batch at once) — until every request has ended, the timeline chunk is full,
``max_ended`` requests have ended in total, or a step needs a price row that
``sim.compiled.pricing.Prices`` has not filled yet (it then returns with that step scheduled
but not priced, and prices it first when called again). It does in compiled code what
``sim.replica.Replica._run`` with ``sim.schedulers.vllm.VllmScheduler`` (FCFS, recompute
preemption, no prefix cache; ``sim.compiled.step_schedule``), ``RooflineCostModel.step_cost``
(``sim.compiled.step_price``), the engine's ``_Arrivals`` (open-loop arrivals, closed-loop
clients' follow-ups) and the cluster's ``round_robin`` and ``least_outstanding`` routers do,
in the same order and with the same arithmetic;
``tests/sim/schedulers/test_compiled_core.py`` holds the two equal. Request state lives in the
run's ``RequestTable`` arrays, which it updates in place.

Events at one instant follow the SimPy engine's order (by creation): first those created
before it — steps ending then (two at once: the one begun first) and requests due then;
a replica whose step ends updates and schedules at once. A replica woken by an arrival, and a
client's follow-up sent with no think time, are created at the instant: they wait in a queue
of what is left to happen (``_now_queue``) and run in the order they were created, so a woken
replica's batch holds a follow-up only if it was sent before the replica woke, and a
follow-up of a request that ended at a step's end misses the batch the replica forms then
(the client learns of the completion only after the step).
"""

from __future__ import annotations

import math

from numba import njit

from sim.compiled import step_schedule as S
from sim.compiled.step_price import price_step

# ``run``'s return codes
DONE, CHUNK_FULL, ENOUGH_ENDED, NEED_TOKENS, NEED_SEQS, STALLED = range(6)
# entries of the run's integer state vector
CURSOR, ENDED, NEED, ROWS, HEAP, PENDING, QHEAD, QCOUNT, RR, TURN, STEPS = range(11)
NUM_STATE = 11
IDLE, WOKEN, PRICING, BUSY = range(4)  # a replica's phase
ROUND_ROBIN, LEAST_OUTSTANDING = range(2)  # routers


@njit(cache=True)
def _heap_push(heap_t, heap_r, st, time, rid):
    """Add (``time``, ``rid``) to the binary heap of pending follow-up releases."""
    i = st[HEAP]
    st[HEAP] += 1
    while i > 0:
        p = (i - 1) // 2
        if heap_t[p] < time or (heap_t[p] == time and heap_r[p] < rid):
            break
        heap_t[i], heap_r[i] = heap_t[p], heap_r[p]
        i = p
    heap_t[i], heap_r[i] = time, rid


@njit(cache=True)
def _heap_pop(heap_t, heap_r, st):
    """Remove the heap's smallest (time, rid)."""
    n = st[HEAP] - 1
    st[HEAP] = n
    time, rid = heap_t[n], heap_r[n]
    i = 0
    while 2 * i + 1 < n:
        c = 2 * i + 1
        if c + 1 < n and (heap_t[c + 1] < heap_t[c]
                          or (heap_t[c + 1] == heap_t[c] and heap_r[c + 1] < heap_r[c])):
            c += 1
        if heap_t[c] < time or (heap_t[c] == time and heap_r[c] < rid):
            heap_t[i], heap_r[i] = heap_t[c], heap_r[c]
            i = c
        else:
            break
    heap_t[i], heap_r[i] = time, rid


@njit(cache=True)
def _now_queue(instant, st, item):
    """Append ``item`` to the queue of what happens later at this instant: a replica ``r``
    that woke (``r``) or a client's follow-up ``rid`` due now (``R + rid``), in the order the
    SimPy engine's zero-delay events would run (the order they were created)."""
    instant[(st[QHEAD] + st[QCOUNT]) % len(instant)] = item
    st[QCOUNT] += 1


@njit(cache=True)
def _ended(rid, now, clients, instant, R, st):
    """``rid`` ended at ``now``: its client's next request is released its think time later
    (``_Arrivals.completed``); at once means after everything already due at this instant."""
    next_of, think, heap_t, heap_r = clients
    st[ENDED] += 1
    nxt = next_of[rid]
    if nxt >= 0:
        if think[nxt] > 0:
            _heap_push(heap_t, heap_r, st, now + think[nxt], nxt)
        else:
            _now_queue(instant, st, R + nxt)


@njit(cache=True)
def _next_arrival(t, order, clients, st):
    """When the next request reaches the pool (inf: none is known)."""
    a = t[0][order[st[CURSOR]]] if st[CURSOR] < len(order) else math.inf
    if st[HEAP]:
        a = min(a, clients[2][0])
    return a


@njit(cache=True)
def _route(rs, st, router):
    """The replica ``round_robin`` or ``least_outstanding`` sends the next request to."""
    n = rs.shape[0]
    if n == 1:
        return 0
    if router == ROUND_ROBIN:
        r = st[RR]
        st[RR] = (r + 1) % n
        return r
    low = rs[0, S.OUT]
    for r in range(1, n):
        low = min(low, rs[r, S.OUT])
    ties = 0
    for r in range(n):
        ties += rs[r, S.OUT] == low
    st[TURN] += 1
    k = st[TURN] % ties
    for r in range(n):
        if rs[r, S.OUT] == low:
            if k == 0:
                return r
            k -= 1
    return -1


@njit(cache=True)
def _arrive(rid, now, t, refusal, clients, router, pool, st):
    """``rid`` reaches the pool at ``now``: rejected with its reason, or routed and queued,
    waking its replica if idle (``_Arrivals.release``, ``Cluster.route``)."""
    rs, wnext, instant = pool[0], pool[6], pool[7]
    t[0][rid] = now
    if refusal[rid]:
        t[6][rid] = S.REJECTED
        t[10][rid] = now
        _ended(rid, now, clients, instant, rs.shape[0], st)
        return
    r = _route(rs, st, router)
    rs[r, S.OUT] += 1
    t[12][rid] = r
    t[6][rid] = S.WAITING
    S.wait_append(rs[r], wnext, rid)
    if rs[r, S.PHASE] == IDLE:
        rs[r, S.PHASE] = WOKEN
        _now_queue(instant, st, r)


@njit(cache=True)
def _release(until, t, order, refusal, clients, router, pool, st):
    """Every request due by ``until`` (open-loop arrivals, follow-ups after a think time)
    arrives, in time order."""
    arrival, heap_t, heap_r = t[0], clients[2], clients[3]
    while True:
        a = arrival[order[st[CURSOR]]] if st[CURSOR] < len(order) else math.inf
        if st[HEAP] and heap_t[0] < a:
            a = heap_t[0]
            if a > until:
                return
            rid = heap_r[0]
            _heap_pop(heap_t, heap_r, st)
        else:
            if a > until:
                return
            rid = order[st[CURSOR]]
            st[CURSOR] += 1
        _arrive(rid, a, t, refusal, clients, router, pool, st)


@njit(cache=True)
def _start(r, now, t, pool, st, cfg, want, need):
    """Replica ``r`` schedules its next batch at ``now``: left to be priced (``PENDING``), or
    idle until an arrival wakes it."""
    rs, rf, running, bids, bnew, bctx, wnext = pool[:7]
    nb = S.schedule(now, t, running[r], rs[r], wnext, cfg, bids[r], bnew[r], bctx[r], want,
                    need)
    if nb:
        rs[r, S.NB], rs[r, S.QLEN], rs[r, S.PHASE] = nb, rs[r, S.WCOUNT], PRICING
        rf[r, 0] = now
        st[PENDING] = r
        st[STEPS] += 1
        rs[r, S.STARTED] = st[STEPS]  # steps ending together end in the order they started
    else:
        rs[r, S.PHASE] = IDLE


@njit(cache=True)
def run(t, order, refusal, clients, router, pool, st, clock, cfg, prices, scratch, rows, itl,
        max_ended):
    """Advance the pool (module doc); returns a code of ``DONE`` … ``STALLED``."""
    tok, head_tok, head_seq, prm, etas = prices
    rs, rf, running, bids, bnew, bctx, wnext, instant = pool
    want, need, emit, gaps, x, cost = scratch
    n = len(t[0])
    R = rs.shape[0]
    while True:
        if st[ENDED] >= max_ended:
            return DONE if st[ENDED] == n else ENOUGH_ENDED
        p = st[PENDING]
        if p >= 0:  # price the step replica p scheduled, record it, start it
            nb = rs[p, S.NB]
            T = 0
            for j in range(nb):
                T += bnew[p, j]
            if math.isnan(tok[T, 0]):
                st[NEED] = T
                return NEED_TOKENS
            if math.isnan(head_seq[nb, 0, 0]):
                st[NEED] = nb
                return NEED_SEQS
            k = st[ROWS]
            if k == len(rows[0]):
                return CHUNK_FULL
            price_step(nb, bnew[p], bctx[p], tok, head_tok, head_seq, prm, etas, x, cost)
            prefill = 0
            for j in range(nb):
                if not (bnew[p, j] == 1 and bctx[p, j] > 0):
                    prefill += bnew[p, j]
            bound = 0
            for b in range(1, 4):
                if cost[1 + b] > cost[1 + bound]:
                    bound = b
            start = rf[p, 0]
            rows[0][k], rows[1][k] = start, cost[0]
            rows[2][k], rows[3][k], rows[4][k], rows[5][k] = nb, T, prefill, T - prefill
            rows[6][k], rows[7][k] = rs[p, S.QLEN], cfg[5] - rs[p, S.FREE]
            rows[8][k], rows[9][k], rows[10][k], rows[11][k] = cost[1], cost[2], cost[3], cost[4]
            rows[12][k], rows[13][k] = bound, p
            st[ROWS] = k + 1
            rf[p, 1] = start + cost[0]
            rs[p, S.PHASE] = BUSY
            st[PENDING] = -1
            continue
        now = clock[0]
        end, r = math.inf, -1  # the next step to end (of two at once, the one begun first)
        for j in range(R):
            if rs[j, S.PHASE] == BUSY and (rf[j, 1] < end or (
                    rf[j, 1] == end and rs[j, S.STARTED] < rs[r, S.STARTED])):
                end, r = rf[j, 1], j
        due = _next_arrival(t, order, clients, st)
        if st[QCOUNT] and min(end, due) > now:
            # what was left to happen at this instant, in order, once every step end and
            # arrival due now (events created before this instant) has happened
            item = instant[st[QHEAD]]
            st[QHEAD] = (st[QHEAD] + 1) % len(instant)
            st[QCOUNT] -= 1
            if item < R:
                _start(item, now, t, pool, st, cfg, want, need)
            else:
                _arrive(item - R, now, t, refusal, clients, router, pool, st)
        elif due < end:
            clock[0] = due
            _release(due, t, order, refusal, clients, router, pool, st)
        elif r >= 0:
            clock[0] = end
            done = S.update(end, t, running[r], rs[r], rs[r, S.NB], bids[r], bnew[r], emit,
                            gaps, itl)
            rs[r, S.OUT] -= done
            for j in range(done):
                _ended(emit[j], end, clients, instant, R, st)
            _start(r, end, t, pool, st, cfg, want, need)  # before anything else happens
        else:
            return DONE if st[ENDED] == n else STALLED
