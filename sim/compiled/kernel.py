"""The compiled event loop of one pool of vLLM-style replicas behind a router.

One call of ``run`` processes events in time order — an arrival (routed to a replica that is
up, queued, waking an idle replica), the end of a replica's step (its tokens land, finished
requests end, it schedules its next batch at once) — until every request has ended, the
timeline chunk is full, ``max_ended`` requests have ended in total, a step needs a price row
that ``sim.compiled.pricing.Prices`` has not filled yet (it then returns with that step
scheduled but not priced, and prices it first when called again), or the caller's event at
``clock[1]`` is due (``DUE``: an autoscaler's, ``sim.compiled.scaling``; in the same time and
stamp order as the others). It does in compiled code what
``sim.engine.replica.Replica._run`` with ``sim.schedulers.vllm.VllmScheduler`` (FCFS or a
keyed order, recompute preemption, vLLM's prefix cache; ``sim.compiled.step_schedule``,
``sim.compiled.prefix_cache``) and the
other compiled policies, ``RooflineCostModel.step_cost`` with its host's scheduling and
eager kernel launches (``sim.compiled.step_price``; numba's cache does not see a change
there, so one here goes with it), the engine's ``_Arrivals`` (open-loop arrivals,
closed-loop clients' follow-ups) and the cluster's routers (``_route``,
``sim.compiled.routing``) do, in the same order and with the same arithmetic;
``tests/sim/schedulers/test_compiled_core.py`` holds the two equal. Request state lives in the
run's ``RequestTable`` arrays, which it updates in place.

Events at one instant follow the SimPy engine's order (by creation): first those created
before it — steps ending then (two at once: the one begun first) and requests due then;
a replica whose step ends updates and schedules at once. A replica woken by an arrival, and a
client's follow-up sent with no think time, are created at the instant: they wait in a queue
of what is left to happen (``_now_queue``) and run in the order they were created, so a woken
replica's batch holds a follow-up only if it was sent before the replica woke, and a
follow-up of a request that ended at a step's end misses the batch the replica forms then
(the client learns of the completion only after the step). An overlapping engine
(``backend.overlap_scheduler``) holds a request that reaches it mid-step until the step after
next, as ``Replica.accept`` does.
"""

from __future__ import annotations

import math

from sim.compiled import event_heap as H
from sim.compiled import routing as RT
from sim.compiled import step_schedule as S
from sim.compiled.jit import compiled
from sim.compiled.keyed_queue import queue
from sim.compiled.overlap import came_before
from sim.compiled.step_price import price_step

# ``run``'s return codes
DONE, CHUNK_FULL, ENOUGH_ENDED, NEED_TOKENS, NEED_SEQS, STALLED, DUE = range(7)
# entries of the run's integer state vector (DUE_STAMP: the stamp of the caller's event due at
# ``clock[1]``, at which ``run`` returns ``DUE``: an autoscaler's evaluation, a replica ready;
# LAST_STAMP: the stamp of the last event processed, ``LAST_NOW`` for one created at its
# instant)
(CURSOR, ENDED, NEED, ROWS, HEAP, PENDING, QHEAD, QCOUNT, RR, TURN, STAMP,
 OPEN_STAMP, STEPS, DUE_STAMP, LAST_STAMP) = range(15)
NUM_STATE = 15
LAST_NOW = 1 << 62  # (after every stamp of an event created before the instant)
IDLE, WOKEN, PRICING, BUSY = range(4)  # a replica's phase
ADMITTING = 0  # a replica's frontend clock that admits (1: its streaming process, if its own)


@compiled
def _stamp(st):
    """A new creation stamp: events due at one time run in the order they were created, as
    SimPy runs the events it schedules for one time (``sim.engine.run``, ``sim.engine.replica``)."""
    st[STAMP] += 1
    return st[STAMP]


@compiled
def _heap_push(heap, st, time, rid):
    """Add ``rid``'s release at ``time`` to the heap of follow-ups sent after a think time."""
    H.insert(heap, st, HEAP, time, _stamp(st), rid)


@compiled
def _heap_pop(heap, st):
    """Remove the heap's first release."""
    H.remove_first(heap, st, HEAP)


@compiled
def _now_queue(instant, st, item):
    """Append ``item`` to the queue of what happens later at this instant: a replica ``r``
    that woke (``r``), a client's follow-up ``rid`` due now (``R + rid``) or replica ``r``'s
    frontend admitting this instant's group (``R + n + r``), in the order the SimPy engine's
    zero-delay events would run (the order they were created)."""
    instant[(st[QHEAD] + st[QCOUNT]) % len(instant)] = item
    st[QCOUNT] += 1


@compiled
def _ended(rid, seen, now, clients, instant, R, st):
    """``rid`` ended at ``now`` and its client saw the end at ``seen`` (once the frontend
    streamed it): the client's next request is released its think time after that
    (``_Arrivals.completed``); at once means after everything already due at this instant."""
    next_of, think, heap = clients[0], clients[1], clients[2]
    st[ENDED] += 1
    nxt = next_of[rid]
    if nxt >= 0:
        delay = seen + think[nxt] - now
        if delay > 0:
            _heap_push(heap, st, now + delay, nxt)
        else:
            _now_queue(instant, st, R + nxt)


@compiled
def _load(r, kind, pool, t, cfg):
    """Replica ``r``'s load as ``jsq_tokens`` measures it (``PoolView.queued_tokens``: tokens
    its running and waiting requests have yet to put in its KV cache) or ``kv_aware`` (the
    KV blocks it uses plus those its waiting requests' tokens need:
    ``PoolView.projected_kv_usage`` times the blocks, one denominator for every replica). The
    waiting queue is FCFS (``sim.compiled.core`` declines keyed orders for these routers)."""
    rs, running, wnext = pool[0], pool[2], pool[6][0]
    total = 0
    if kind == RT.JSQ_TOKENS:
        for j in range(rs[r, S.NRUN]):
            q = running[r, j]
            total += t[1][q] - t[2][q]
    else:
        total = cfg[5] - rs[r, S.FREE]
    q = rs[r, S.WHEAD]
    for _ in range(rs[r, S.WCOUNT]):
        if kind == RT.JSQ_TOKENS:
            total += t[1][q] - t[2][q]
        else:
            total += -(-t[1][q] // cfg[4])
        q = wnext[q]
    return total


@compiled
def _route(rid, rs, st, router, pool, t, cfg):
    """The replica ``router`` (``sim.compiled.routing``) sends ``rid`` to (of those up)."""
    n = rs.shape[0]
    if n == 1:
        return 0
    kind = router[0][RT.KIND]
    if kind == RT.PREFIX_AFFINITY:  # else its fallback, ``least_outstanding``
        r = RT.longest(rid, rs, router)
        if r < 0:
            r = _least_outstanding(rs, st)
        RT.remember(rid, r, router)
        return r
    if kind == RT.POWER_OF_TWO or kind == RT.UNIFORM_RANDOM:
        return RT.drawn(router, rs)
    if kind == RT.JSQ_TOKENS or kind == RT.KV_AWARE:  # the least load, then the fewest
        best, low, out = -1, 0, 0  # outstanding, then the first (``first_min``)
        for r in range(n):
            if not rs[r, S.ALIVE]:
                continue
            load = _load(r, kind, pool, t, cfg)
            if best < 0 or load < low or (load == low and rs[r, S.OUT] < out):
                best, low, out = r, load, rs[r, S.OUT]
        return best
    if kind == RT.ROUND_ROBIN:  # the next replica in turn that is up
        for _ in range(n):
            r = st[RR]
            st[RR] = (r + 1) % n
            if rs[r, S.ALIVE]:
                return r
        return -1
    return _least_outstanding(rs, st)


@compiled
def _least_outstanding(rs, st):
    """The replica ``least_outstanding`` picks: the fewest outstanding of those up, ties in
    turn."""
    n = rs.shape[0]
    low, ties = -1, 0
    for r in range(n):  # the fewest outstanding of those up, and how many have it
        if not rs[r, S.ALIVE]:
            continue
        out = rs[r, S.OUT]
        if ties == 0 or out < low:
            low, ties = out, 1
        elif out == low:
            ties += 1
    st[TURN] += 1
    k = st[TURN] % ties
    for r in range(n):
        if rs[r, S.ALIVE] and rs[r, S.OUT] == low:
            if k == 0:
                return r
            k -= 1
    return -1


@compiled
def _arrive(rid, now, t, refusal, clients, router, pool, st, cfg):
    """``rid`` reaches the pool at ``now``: rejected with its reason, or routed and queued,
    waking its replica if idle (``_Arrivals.release``, ``Cluster.route``)."""
    rs, instant = pool[0], pool[7]
    t[0][rid] = now
    if refusal[rid]:
        t[6][rid] = S.REJECTED
        t[10][rid] = now
        _ended(rid, now, now, clients, instant, rs.shape[0], st)
        return
    r = _route(rid, rs, st, router, pool, t, cfg)
    rs[r, S.OUT] += 1
    t[12][rid] = r
    service, engine_arrival, free, fe, group, work, member_next = clients[3]
    if fe[2] and fe[3]:  # joins this instant's group (``FrontendServer.join``)
        if group[r, 0] < 0:  # it opens the group, admitted after this instant's arrivals
            group[r, 0] = rid
            _now_queue(instant, st, rs.shape[0] + len(t[0]) + r)
        else:
            member_next[group[r, 1]] = rid
        group[r, 1] = rid
        member_next[rid] = -1
        work[r] += service[rid]
        return
    if fe[2]:  # through replica r's frontend (``FrontendServer.admit``)
        done = max(now, free[r, ADMITTING]) + service[rid]
        free[r, ADMITTING] = done
        at = done + fe[1]
        engine_arrival[rid] = at
        if at != now:
            _heap_push(clients[2], st, now + (at - now), len(t[0]) + rid)
            return
    _enter(rid, r, now, pool, st, t, cfg)


@compiled
def _admit_group(r, now, t, clients, pool, st, cfg):
    """Replica ``r``'s frontend admits the group that arrived at ``now``: all of it reaches
    the engine once the server has done the group's admission work
    (``Replica._admit_group``, ``FrontendServer.admit_group``)."""
    service, engine_arrival, free, fe, group, work, member_next = clients[3]
    done = max(now, free[r, ADMITTING]) + work[r]
    free[r, ADMITTING] = done
    at = done + fe[1]
    rid = group[r, 0]
    group[r, 0], group[r, 1], work[r] = -1, -1, 0.0
    n = len(t[0])
    while rid >= 0:
        engine_arrival[rid] = at
        if at != now:
            _heap_push(clients[2], st, now + (at - now), n + rid)
        else:
            _enter(rid, r, now, pool, st, t, cfg)
        rid = member_next[rid]


@compiled
def _enter(rid, r, now, pool, st, t, cfg):
    """``rid`` reaches replica ``r``'s engine at ``now``: queued in its scheduler's order,
    waking the replica if idle, or (an overlapping engine in mid-step) held for the step after
    next (``Replica.accept``)."""
    rs = pool[0]
    held_next, held_at, held_ends, overlap = pool[9]
    if overlap[0] and rs[r, S.PHASE] >= PRICING:
        held_next[rid], held_at[rid] = -1, now
        if held_ends[r, 0] < 0:
            held_ends[r, 0] = rid
        else:
            held_next[held_ends[r, 1]] = rid
        held_ends[r, 1] = rid
        return
    _queue(rid, r, pool, st, t, cfg)


@compiled
def _release_held(r, before, pool, st, t, cfg):
    """Requests held for replica ``r`` that reached it before ``before`` join its scheduler
    (``Replica._release``)."""
    held_next, held_at, held_ends, _ = pool[9]
    rid = held_ends[r, 0]
    while rid >= 0 and came_before(held_at[rid], before):
        nxt = held_next[rid]
        _queue(rid, r, pool, st, t, cfg)
        rid = nxt
    held_ends[r, 0] = rid
    if rid < 0:
        held_ends[r, 1] = -1


@compiled
def _queue(rid, r, pool, st, t, cfg):
    """``rid`` joins replica ``r``'s scheduler: queued in its order, waking the replica if
    idle."""
    rs, waiting, instant = pool[0], pool[6], pool[7]
    t[6][rid] = S.WAITING
    queue(rs[r], waiting, rid, t[0], cfg)
    if rs[r, S.PHASE] == IDLE:
        rs[r, S.PHASE] = WOKEN
        _now_queue(instant, st, r)


@compiled
def _release_open(t, order, refusal, clients, router, pool, st, cfg):
    """The open-loop requests due now arrive, in order (``_Arrivals._open_loop`` releases
    those of one time in one go), then the wait for the next one begins."""
    arrival = t[0]
    now = arrival[order[st[CURSOR]]]
    while st[CURSOR] < len(order) and arrival[order[st[CURSOR]]] == now:
        rid = order[st[CURSOR]]
        st[CURSOR] += 1
        _arrive(rid, now, t, refusal, clients, router, pool, st, cfg)
    st[OPEN_STAMP] = _stamp(st)


@compiled
def _start_after_step(r, now, t, pool, st, cfg, want, need):
    """Replica ``r``'s step ended at ``now``: an overlapping engine first takes the requests
    held since before that step began, and all of them if it has nothing else to run
    (``Replica._run``); then it schedules (``_start``)."""
    held_ends = pool[9][2]
    if held_ends[r, 0] >= 0:
        _release_held(r, pool[1][r, 0], pool, st, t, cfg)
    _start(r, now, t, pool, st, cfg, want, need)
    if pool[0][r, S.PHASE] == IDLE and held_ends[r, 0] >= 0:
        pool[0][r, S.PHASE] = WOKEN  # it schedules now, not as an arrival's wake-up would
        _release_held(r, math.inf, pool, st, t, cfg)
        _start(r, now, t, pool, st, cfg, want, need)


@compiled
def _start(r, now, t, pool, st, cfg, want, need):
    """Replica ``r`` schedules its next batch at ``now``: left to be priced (``PENDING``), or
    idle until an arrival wakes it."""
    rs, rf, running, bids, bnew, bctx, waiting = pool[:7]
    nb = S.schedule(now, t, running[r], rs[r], rf[r], waiting, cfg, bids[r], bnew[r], bctx[r],
                    want, need)
    if nb:
        rs[r, S.NB], rs[r, S.QLEN], rs[r, S.PHASE] = nb, rs[r, S.WCOUNT], PRICING
        rf[r, 0] = now
        st[PENDING] = r
        rs[r, S.STARTED] = _stamp(st)  # its end is due from now on
    else:
        rs[r, S.PHASE] = IDLE


@compiled
def run(t, order, refusal, clients, router, pool, st, clock, cfg, prices, scratch, rows, itl,
        max_ended):
    """Advance the pool (module doc); returns a code of ``DONE`` … ``DUE``."""
    tok, head_tok, head_seq, prm, etas = prices
    rs, rf, running, bids, bnew, bctx, _, instant, ends, _ = pool
    want, need, emit, gaps, x, cost = scratch
    n = len(t[0])
    R = rs.shape[0]
    while True:
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
            H.insert(ends, st, STEPS, rf[p, 1], rs[p, S.STARTED], p)
            st[PENDING] = -1
            continue
        if st[ENDED] >= max_ended:  # (a step is recorded when it starts, as in SimPy)
            return DONE if st[ENDED] == n else ENOUGH_ENDED
        now = clock[0]
        # the next event created before now: a step's end, open-loop requests, a follow-up
        when, stamp, kind, r = math.inf, 0, -1, -1
        if st[STEPS]:  # the busy replicas' step ends, first first: O(log R) per event
            when, stamp, kind, r = ends[0][0], ends[1][0], 0, ends[2][0]
        if st[CURSOR] < len(order):
            a = t[0][order[st[CURSOR]]]
            if H.before(a, st[OPEN_STAMP], when, stamp):
                when, stamp, kind = a, st[OPEN_STAMP], 1
        heap = clients[2]
        if st[HEAP] and H.before(heap[0][0], heap[1][0], when, stamp):
            when, stamp, kind = heap[0][0], heap[1][0], 2
        if H.before(clock[1], st[DUE_STAMP], when, stamp):  # the caller's event
            when, stamp, kind = clock[1], st[DUE_STAMP], 3
        if st[QCOUNT] and when > now:
            # what was created at this instant, in order, once everything created before
            # and due now has happened
            st[LAST_STAMP] = LAST_NOW
            item = instant[st[QHEAD]]
            st[QHEAD] = (st[QHEAD] + 1) % len(instant)
            st[QCOUNT] -= 1
            if item < R:
                _start(item, now, t, pool, st, cfg, want, need)
            elif item < R + n:
                _arrive(item - R, now, t, refusal, clients, router, pool, st, cfg)
            else:  # a frontend's group of this instant's arrivals
                _admit_group(item - R - n, now, t, clients, pool, st, cfg)
            continue
        if kind < 0:
            return DONE if st[ENDED] == n else STALLED
        clock[0] = when
        if kind == 3:
            return DUE
        st[LAST_STAMP] = stamp
        if kind == 1:
            _release_open(t, order, refusal, clients, router, pool, st, cfg)
        elif kind == 2:
            rid = heap[2][0]
            _heap_pop(heap, st)
            if rid >= n:  # through its replica's frontend
                _enter(rid - n, t[12][rid - n], when, pool, st, t, cfg)
            else:
                _arrive(rid, when, t, refusal, clients, router, pool, st, cfg)
        else:
            H.remove_first(ends, st, STEPS)
            seen = when
            fe = clients[3]
            if fe[3][2]:  # the clients see the step's tokens once streamed (``stream``)
                sampled = 0
                for j in range(rs[r, S.NB]):
                    q = bids[r, j]
                    sampled += t[2][q] + bnew[r, j] == t[1][q]
                if sampled:  # by the admitting server, or a streaming process of its own
                    k = ADMITTING + int(fe[3][4])
                    seen = max(when, fe[2][r, k]) + fe[3][0] * sampled
                    fe[2][r, k] = seen
            done = S.update(seen, t, running[r], rs[r], rs[r, S.NB], bids[r], bnew[r], emit,
                            gaps, itl)
            rs[r, S.OUT] -= done
            if done and rs[r, S.OUT] == 0:
                rf[r, S.EMPTIED], rf[r, S.EMPTIED_STAMP] = when, stamp
            for j in range(done):
                _ended(emit[j], seen, when, clients, instant, R, st)
            _start_after_step(r, when, t, pool, st, cfg, want, need)  # before anything else
