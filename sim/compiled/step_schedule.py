"""One replica's scheduler in compiled code: ``VllmScheduler.schedule`` and ``update``.

FCFS, chunked prefill, ``long_prefill_token_threshold``, recompute preemption of the most
recently admitted request, paged KV blocks (``PagedKVCache.allocate``/``allocate_all``/
``free``), in the order and with the arithmetic of the Python classes. ``q`` is the replica's
row of integer state (fields below); its waiting queue is a linked list through ``wnext``
(one entry per request: a request waits on one replica at a time).
"""

from __future__ import annotations

import math

from numba import njit

# fields of a replica's integer state row
FREE, NRUN, WHEAD, WTAIL, WCOUNT, PHASE, NB, QLEN, OUT, STARTED = range(10)
NUM_FIELDS = 10
WAITING, RUNNING, FINISHED, REJECTED = 1, 2, 3, 4  # sim.state's status codes


@njit(cache=True)
def wait_append(q, wnext, rid):
    """Queue ``rid`` at the back of the replica's waiting queue."""
    if q[WCOUNT]:
        wnext[q[WTAIL]] = rid
    else:
        q[WHEAD] = rid
    q[WTAIL] = rid
    q[WCOUNT] += 1


@njit(cache=True)
def _wait_appendleft(q, wnext, rid):
    if q[WCOUNT] == 0:
        q[WTAIL] = rid
    wnext[rid] = q[WHEAD]
    q[WHEAD] = rid
    q[WCOUNT] += 1


@njit(cache=True)
def _wait_popleft(q, wnext):
    rid = q[WHEAD]
    q[WCOUNT] -= 1
    if q[WCOUNT]:
        q[WHEAD] = wnext[rid]
    return rid


@njit(cache=True)
def _allocate(rid, n, computed, held, q, bs):
    """``PagedKVCache.allocate``: blocks for ``n`` more tokens; False when full."""
    need = (computed[rid] + n + bs - 1) // bs - held[rid]
    if need <= 0:
        return True
    if need > q[FREE]:
        return False
    held[rid] += need
    q[FREE] -= need
    return True


@njit(cache=True)
def _want(rid, num_tokens, computed, threshold):
    w = num_tokens[rid] - computed[rid]
    return min(w, threshold) if threshold > 0 else w


@njit(cache=True)
def schedule(now, t, run, q, wnext, cfg, bids, bnew, bctx, want, need):
    """``VllmScheduler.schedule`` (FCFS, recompute): the batch into ``bids``/``bnew``/
    ``bctx``; returns its size (0: nothing can run)."""
    num_tokens, computed, held, status = t[1], t[2], t[5], t[6]
    first_sched, preemptions = t[7], t[11]
    budget, max_seqs, threshold, chunked, bs = cfg[0], cfg[1], cfg[2], cfg[3], cfg[4]
    while True:
        bud = budget
        nb = 0
        preempted = False
        nrun = q[NRUN]
        if nrun:
            total = 0
            for j in range(nrun):
                want[j] = _want(run[j], num_tokens, computed, threshold)
                total += want[j]
            if total > bud:
                cum = 0
                k = 0
                while cum + want[k] <= bud:
                    cum += want[k]
                    k += 1
                want[k] = bud - cum
                for j in range(k + 1, nrun):
                    want[j] = 0
                total = bud
            blocks = 0
            for j in range(nrun):
                r = run[j]
                need[j] = max((computed[r] + want[j] + bs - 1) // bs - held[r], 0)
                blocks += need[j]
            if blocks <= q[FREE]:
                for j in range(nrun):
                    r = run[j]
                    held[r] += need[j]
                    if want[j] > 0:
                        bids[nb], bnew[nb], bctx[nb] = r, want[j], computed[r]
                        nb += 1
                q[FREE] -= blocks
            else:  # ``_schedule_running_with_preemption``: the last admitted goes first
                total = 0
                i = 0
                while i < nrun and bud - total > 0:
                    rid = run[i]
                    n = min(_want(rid, num_tokens, computed, threshold), bud - total)
                    victim_was_rid = False
                    while not _allocate(rid, n, computed, held, q, bs):
                        victim = run[nrun - 1]
                        nrun -= 1
                        q[FREE] += held[victim]
                        held[victim] = 0
                        computed[victim] = 0
                        preemptions[victim] += 1
                        status[victim] = WAITING
                        _wait_appendleft(q, wnext, victim)
                        preempted = True
                        if victim == rid:
                            victim_was_rid = True
                            break
                    if victim_was_rid:
                        break
                    bids[nb], bnew[nb], bctx[nb] = rid, n, computed[rid]
                    nb += 1
                    total += n
                    i += 1
                q[NRUN] = nrun
            bud -= total
        if not preempted:  # ``_admit_waiting``
            slots = max_seqs - q[NRUN]
            while q[WCOUNT] and slots > 0 and bud > 0:
                rid = q[WHEAD]
                n = _want(rid, num_tokens, computed, threshold)
                if n > bud and not chunked:
                    break
                n = min(n, bud)
                if not _allocate(rid, n, computed, held, q, bs):
                    break
                _wait_popleft(q, wnext)
                status[rid] = RUNNING
                if math.isnan(first_sched[rid]):
                    first_sched[rid] = now
                run[q[NRUN]] = rid
                q[NRUN] += 1
                bids[nb], bnew[nb], bctx[nb] = rid, n, computed[rid]
                nb += 1
                bud -= n
                slots -= 1
        if nb or not preempted:
            return nb


@njit(cache=True)
def _itl_add(values, n, counts, sums, low, log_ratio):
    """``LogHistogram.add`` of ``values[:n]``."""
    if n == 0:
        return
    first = values[0]
    lo = hi = first
    for j in range(1, n):
        lo = min(lo, values[j])
        hi = max(hi, values[j])
    nbins = len(counts)
    if lo == hi:
        b = min(max(math.floor(math.log(max(first, low) / low) / log_ratio), 0), nbins - 1)
        counts[b] += n
        sums[b] += first * n
        return
    for j in range(n):
        v = values[j]
        b = min(max(math.floor(math.log(max(v, low) / low) / log_ratio), 0), nbins - 1)
        counts[b] += 1
        sums[b] += v


@njit(cache=True)
def update(now, t, run, q, nb, bids, bnew, emit, gaps, itl):
    """``TokenBudgetScheduler.update``: the step's tokens land at ``now``; the ids of the
    requests that finished are in ``emit[:k]``, k returned."""
    num_tokens, computed, generated, max_output, held, status = t[1], t[2], t[3], t[4], t[5], t[6]
    first_token, last_token, completion = t[8], t[9], t[10]
    counts, sums, low, log_ratio = itl
    ne = 0
    for j in range(nb):
        r = bids[j]
        computed[r] += bnew[j]
        if computed[r] == num_tokens[r]:
            emit[ne] = r
            ne += 1
    if ne == 0:
        return 0
    ng = 0
    for j in range(ne):
        r = emit[j]
        generated[r] += 1
        num_tokens[r] += 1
        if generated[r] == 1:
            first_token[r] = now
        else:
            gaps[ng] = now - last_token[r]
            ng += 1
    _itl_add(gaps, ng, counts, sums, low, log_ratio)
    done = 0
    for j in range(ne):
        r = emit[j]
        last_token[r] = now
        if generated[r] >= max_output[r]:
            completion[r] = now
            status[r] = FINISHED
            q[FREE] += held[r]
            held[r] = 0
            emit[done] = r  # (emit[j] with j ≥ done is read before it is overwritten)
            done += 1
    if done:
        k = 0
        for j in range(q[NRUN]):
            if status[run[j]] != FINISHED:
                run[k] = run[j]
                k += 1
        q[NRUN] = k
    return done
