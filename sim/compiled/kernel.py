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

Events at one instant: every arrival due then is released before the replicas it woke
schedule (in the order they were woken), as the SimPy engine's arrival process releases
them all before the woken replicas run; a replica whose step ends schedules before anything
else happens, so a client's follow-up with no think time misses the batch formed then (the
client learns of the completion only after that step).
"""

from __future__ import annotations

import math

from numba import njit

from sim.compiled import step_schedule as S
from sim.compiled.step_price import price_step

# ``run``'s return codes
DONE, CHUNK_FULL, ENOUGH_ENDED, NEED_TOKENS, NEED_SEQS, STALLED = range(6)
# entries of the run's integer state vector
CURSOR, ENDED, NEED, ROWS, HEAP, PENDING, NWAKE, RR, TURN = range(9)
NUM_STATE = 9
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
def _ended(rid, now, clients, st):
    """``rid`` ended at ``now``: its client's next request is released its think time later
    (``_Arrivals.completed``)."""
    next_of, think, heap_t, heap_r = clients
    st[ENDED] += 1
    nxt = next_of[rid]
    if nxt >= 0:
        _heap_push(heap_t, heap_r, st, now + think[nxt], nxt)


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
def _release(until, t, order, refusal, clients, router, rs, wnext, wake, st):
    """Every request due by ``until`` reaches the pool in time order: rejected with its
    reason, or routed and queued, waking its replica if idle (``_Arrivals.release``)."""
    arrival, status, completion, replica = t[0], t[6], t[10], t[12]
    heap_t, heap_r = clients[2], clients[3]
    while True:
        a = arrival[order[st[CURSOR]]] if st[CURSOR] < len(order) else math.inf
        if st[HEAP] and heap_t[0] < a:
            a = heap_t[0]
            if a > until:
                return
            rid = heap_r[0]
            _heap_pop(heap_t, heap_r, st)
            arrival[rid] = a
        else:
            if a > until:
                return
            rid = order[st[CURSOR]]
            st[CURSOR] += 1
        if refusal[rid]:
            status[rid] = S.REJECTED
            completion[rid] = a
            _ended(rid, a, clients, st)
            continue
        r = _route(rs, st, router)
        rs[r, S.OUT] += 1
        replica[rid] = r
        status[rid] = S.WAITING
        S.wait_append(rs[r], wnext, rid)
        if rs[r, S.PHASE] == IDLE:
            rs[r, S.PHASE] = WOKEN
            wake[st[NWAKE]] = r
            st[NWAKE] += 1


@njit(cache=True)
def run(t, order, refusal, clients, router, pool, st, clock, cfg, prices, scratch, rows, itl,
        max_ended):
    """Advance the pool (module doc); returns a code of ``DONE`` … ``STALLED``."""
    tok, head_tok, head_seq, prm, etas = prices
    rs, rf, running, bids, bnew, bctx, wnext, wake = pool
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
        if st[NWAKE]:  # the first replica woken at this instant schedules
            r = wake[0]
            st[NWAKE] -= 1
            for j in range(st[NWAKE]):
                wake[j] = wake[j + 1]
            nb = S.schedule(now, t, running[r], rs[r], wnext, cfg, bids[r], bnew[r], bctx[r],
                            want, need)
            if nb:
                rs[r, S.NB], rs[r, S.QLEN], rs[r, S.PHASE] = nb, rs[r, S.WCOUNT], PRICING
                rf[r, 0] = now
                st[PENDING] = r
            else:
                rs[r, S.PHASE] = IDLE
            continue
        end, r = math.inf, -1  # the next step to end
        for j in range(R):
            if rs[j, S.PHASE] == BUSY and rf[j, 1] < end:
                end, r = rf[j, 1], j
        due = _next_arrival(t, order, clients, st)
        if due < end:
            clock[0] = due
            _release(due, t, order, refusal, clients, router, rs, wnext, wake, st)
        elif r >= 0:
            clock[0] = end
            done = S.update(end, t, running[r], rs[r], rs[r, S.NB], bids[r], bnew[r], emit,
                            gaps, itl)
            rs[r, S.OUT] -= done
            for j in range(done):
                _ended(emit[j], end, clients, st)
            rs[r, S.PHASE] = WOKEN
            wake[st[NWAKE]] = r
            st[NWAKE] += 1
        else:
            return DONE if st[ENDED] == n else STALLED
