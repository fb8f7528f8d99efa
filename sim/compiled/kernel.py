"""The compiled event loop of one vLLM-style replica: arrivals, scheduling, pricing, update.

One call of ``run`` advances the replica step by step until every request has ended, the
timeline chunk is full, ``max_ended`` requests have ended in total, or a step needs a price
row that ``sim.compiled.pricing.Prices`` has not filled yet (it then returns without having
changed anything of that step, and is called again once the row is filled). It does in
compiled code what ``sim.replica.Replica._run`` with ``sim.schedulers.vllm.VllmScheduler``
(FCFS, recompute preemption, no prefix cache), ``RooflineCostModel.step_cost`` and the
engine's ``_Arrivals`` (open-loop arrivals, closed-loop clients' follow-ups) do, in the
same order and with the same arithmetic; ``tests/sim/schedulers/test_compiled_core.py``
holds the two equal. Request state lives in the run's ``RequestTable`` arrays, which it
updates in place.
"""

from __future__ import annotations

import math

from numba import njit

from sim.compiled import pricing as P

# ``run``'s return codes
DONE, CHUNK_FULL, ENOUGH_ENDED, NEED_TOKENS, NEED_SEQS, STALLED = range(6)
# entries of the integer state vector
CURSOR, FREE, NRUN, WHEAD, WCOUNT, PHASE, ENDED, NB, QLEN, NEED, ROWS, HEAP = range(12)
WAITING, RUNNING, FINISHED, REJECTED = 1, 2, 3, 4  # sim.state's status codes


@njit(cache=True)
def _cell(x, knots, off, n):
    """(left knot, right knot, weight of the right one) of ``x`` among ``n`` log2 knots at
    ``knots[off:]``, clamped (``sim.cost.eta.scalar_cell``)."""
    last = n - 1
    lx = math.log2(x) if x > 0 else knots[off]
    if lx <= knots[off] or last == 0:
        return 0, min(1, last), 0.0
    if lx >= knots[off + last]:
        return last - 1, last, 1.0
    i = 0
    while knots[off + i + 1] <= lx:  # bisect_right − 1
        i += 1
    return i, i + 1, (lx - knots[off + i]) / (knots[off + i + 1] - knots[off + i])


@njit(cache=True)
def _eta(e, x, etas):
    """Efficiency ``e`` of the packed ``etas`` at the shape variables ``x`` (``AXES``)."""
    scale, first, last, axes, koff, klen, foff, fcols, knots, f = etas
    if first[e] == last[e]:
        return scale[e]
    log = 0.0
    for t in range(first[e], last[e]):
        i, i1, u = _cell(x[axes[t, 0]], knots, koff[t, 0], klen[t, 0])
        b = foff[t]
        if axes[t, 1] < 0:
            val = f[b + i] * (1 - u) + f[b + i1] * u
        else:
            j, j1, v = _cell(x[axes[t, 1]], knots, koff[t, 1], klen[t, 1])
            c = fcols[t]
            val = ((1 - u) * ((1 - v) * f[b + i * c + j] + v * f[b + i * c + j1])
                   + u * ((1 - v) * f[b + i1 * c + j] + v * f[b + i1 * c + j1]))
        log = log + val
    return scale[e] * math.exp(log)


@njit(cache=True)
def _attention(prefill, flops, nbytes, q, S, prm, etas, x):
    """(time, compute-bound?) of one attention kernel (``attention_point_time``)."""
    s = max(float(S), 1.0)
    kvh = max(prm[P.KV_HEADS], 1.0)
    hd = prm[P.HEAD_DIM]
    kv = max(nbytes / s, 1.0)
    x[0] = max(q, 1.0)
    x[1] = s
    x[2] = s * kvh
    x[3] = hd
    x[4] = kv
    x[5] = max(kv / (kvh * hd), 1.0)
    x[6] = max(flops / max(nbytes, 1.0), 1e-3)
    x[7] = 1.0
    e = 0 if prefill else 2
    t_compute = flops / (prm[P.PEAK_FLOPS] * _eta(e, x, etas))
    t_memory = nbytes / (prm[P.PEAK_BW] * _eta(e + 1, x, etas))
    k = P.PRE_LAUNCH if prefill else P.DEC_LAUNCH
    t = max(t_compute, t_memory) + prm[k]
    if prm[k + 1]:
        units = x[2] * math.ceil(x[0] / prm[k + 2])
        t = t + prm[k + 1] * units / prm[P.NUM_SMS]
    return t, t_compute >= t_memory


@njit(cache=True)
def _price(nb, bnew, bctx, tok, head_tok, head_seq, prm, etas, x, out):
    """(time, compute, memory, comm, host) of the batch into ``out`` (``step_cost``)."""
    heads, kvh, hd = prm[P.HEADS], prm[P.KV_HEADS], prm[P.HEAD_DIM]
    kvb, act = prm[P.KV_BYTES], prm[P.ACT]
    T = 0
    pf = pb = pq = 0.0
    npre = 0
    ctx_total = 0
    ndec = 0
    for j in range(nb):
        T += bnew[j]
        if bnew[j] == 1 and bctx[j] > 0:
            ctx_total += bctx[j]
            ndec += 1
        else:  # a prefill chunk (``prefill_attention_work``), summed as the model sums them
            qf, cf = float(bnew[j]), float(bctx[j])
            pf += 4.0 * heads * hd * (qf * (cf + (qf + 1) / 2.0))
            pb += (cf + qf) * 2.0 * kvh * hd * kvb + 2.0 * qf * heads * hd * act
            pq += qf
            npre += 1
    att0 = att1 = att2 = 0.0
    if npre:
        t, cb = _attention(True, pf, pb, pq / npre, npre, prm, etas, x)
        if cb:
            att0 += t
        else:
            att1 += t
    if ndec:  # ``decode_attention_work``
        keys = float(ctx_total) + ndec * 0.0 + ndec
        f = 4.0 * heads * hd * keys
        b = keys * 2.0 * kvh * hd * kvb + 2.0 * ndec * heads * hd * act
        t, cb = _attention(False, f, b, 1.0, ndec, prm, etas, x)
        if cb:
            att0 += t
        else:
            att1 += t
    L = prm[P.LAYERS]
    h0, h1, h2 = head_tok[T, 0], head_tok[T, 1], head_tok[T, 2]
    for j in range(P.MAX_SEQ_OPS):
        h0 += head_seq[nb, j, 0]
        h1 += head_seq[nb, j, 1]
        h2 += head_seq[nb, j, 2]
    compute = h0 + (tok[T, 0] + L * att0)
    memory = h1 + (tok[T, 1] + L * att1)
    comm = h2 + (tok[T, 2] + L * att2) + 0.0
    host = prm[P.HOST_S] + prm[P.HOST_PER_SEQ_S] * nb
    out[0] = compute + memory + comm + host
    out[1], out[2], out[3], out[4] = compute, memory, comm, host


@njit(cache=True)
def _allocate(rid, n, computed, held, st, bs):
    """``PagedKVCache.allocate``: blocks for ``n`` more tokens; False when full."""
    need = (computed[rid] + n + bs - 1) // bs - held[rid]
    if need <= 0:
        return True
    if need > st[FREE]:
        return False
    held[rid] += need
    st[FREE] -= need
    return True


@njit(cache=True)
def _want(rid, num_tokens, computed, threshold):
    w = num_tokens[rid] - computed[rid]
    return min(w, threshold) if threshold > 0 else w


@njit(cache=True)
def _schedule(now, t, run, wq, st, cfg, bids, bnew, bctx, want, need):
    """``VllmScheduler.schedule`` (FCFS, recompute): the batch into ``bids``/``bnew``/
    ``bctx``; returns its size (0: nothing can run)."""
    (arrival, num_tokens, computed, generated, max_output, held, status, first_sched,
     first_token, last_token, completion, preemptions, replica) = t
    budget, max_seqs, threshold, chunked, bs = cfg[0], cfg[1], cfg[2], cfg[3], cfg[4]
    while True:
        bud = budget
        nb = 0
        preempted = False
        nrun = st[NRUN]
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
            if blocks <= st[FREE]:
                for j in range(nrun):
                    r = run[j]
                    held[r] += need[j]
                    if want[j] > 0:
                        bids[nb], bnew[nb], bctx[nb] = r, want[j], computed[r]
                        nb += 1
                st[FREE] -= blocks
            else:  # ``_schedule_running_with_preemption``: the last admitted goes first
                total = 0
                i = 0
                while i < nrun and bud - total > 0:
                    rid = run[i]
                    n = min(_want(rid, num_tokens, computed, threshold), bud - total)
                    victim_was_rid = False
                    while not _allocate(rid, n, computed, held, st, bs):
                        victim = run[nrun - 1]
                        nrun -= 1
                        st[FREE] += held[victim]
                        held[victim] = 0
                        computed[victim] = 0
                        preemptions[victim] += 1
                        status[victim] = WAITING
                        st[WHEAD] = (st[WHEAD] - 1) % len(wq)
                        wq[st[WHEAD]] = victim
                        st[WCOUNT] += 1
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
                st[NRUN] = nrun
            bud -= total
        if not preempted:  # ``_admit_waiting``
            slots = max_seqs - st[NRUN]
            while st[WCOUNT] and slots > 0 and bud > 0:
                rid = wq[st[WHEAD]]
                n = _want(rid, num_tokens, computed, threshold)
                if n > bud and not chunked:
                    break
                n = min(n, bud)
                if not _allocate(rid, n, computed, held, st, bs):
                    break
                st[WHEAD] = (st[WHEAD] + 1) % len(wq)
                st[WCOUNT] -= 1
                status[rid] = RUNNING
                if math.isnan(first_sched[rid]):
                    first_sched[rid] = now
                run[st[NRUN]] = rid
                st[NRUN] += 1
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
def _update(now, t, run, st, nb, bids, bnew, emit, gaps, counts, sums, low, log_ratio,
            clients):
    """``TokenBudgetScheduler.update``: the step's tokens land at ``now``; the requests that
    finish end (``_ended``)."""
    (arrival, num_tokens, computed, generated, max_output, held, status, first_sched,
     first_token, last_token, completion, preemptions, replica) = t
    ne = 0
    for j in range(nb):
        r = bids[j]
        computed[r] += bnew[j]
        if computed[r] == num_tokens[r]:
            emit[ne] = r
            ne += 1
    if ne == 0:
        return
    ng = 0
    done = 0
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
    for j in range(ne):
        r = emit[j]
        last_token[r] = now
        if generated[r] >= max_output[r]:
            completion[r] = now
            status[r] = FINISHED
            st[FREE] += held[r]
            held[r] = 0
            done += 1
            _ended(r, now, clients, st)
    if done:
        k = 0
        for j in range(st[NRUN]):
            if status[run[j]] != FINISHED:
                run[k] = run[j]
                k += 1
        st[NRUN] = k


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
    """When the next request reaches the replica (inf: none is known)."""
    a = t[0][order[st[CURSOR]]] if st[CURSOR] < len(order) else math.inf
    if st[HEAP]:
        a = min(a, clients[2][0])
    return a


@njit(cache=True)
def _release(until, delayed_at_until, t, order, refusal, clients, wq, st):
    """Requests arriving by ``until`` reach the replica in time order: queued, or rejected
    with their reason (``_Arrivals.release``). A client's follow-up due exactly at ``until``
    waits unless ``delayed_at_until``: the client learns of a completion only after the step
    that ended at ``until``, so a follow-up without think time misses the batch formed then."""
    arrival, status, completion, replica = t[0], t[6], t[10], t[12]
    heap_t, heap_r = clients[2], clients[3]
    while True:
        a = t[0][order[st[CURSOR]]] if st[CURSOR] < len(order) else math.inf
        if st[HEAP] and heap_t[0] < a:
            a = heap_t[0]
            if a > until or (a == until and not delayed_at_until):
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
            status[rid] = REJECTED
            completion[rid] = a
            _ended(rid, a, clients, st)
        else:
            replica[rid] = 0
            status[rid] = WAITING
            wq[(st[WHEAD] + st[WCOUNT]) % len(wq)] = rid
            st[WCOUNT] += 1


@njit(cache=True)
def run(t, order, refusal, clients, run_ids, wq, st, clock, cfg, prices, bufs, rows, itl,
        max_ended):
    """Advance the replica (module doc); returns a code of ``DONE`` … ``STALLED``."""
    tok, head_tok, head_seq, prm, etas = prices
    bids, bnew, bctx, want, need, emit, gaps, x, cost = bufs
    counts, sums, low, log_ratio = itl
    n = len(t[0])
    while True:
        if st[ENDED] >= max_ended:
            return DONE if st[ENDED] == n else ENOUGH_ENDED
        now = clock[0]
        if st[PHASE] == 0:  # schedule
            nb = _schedule(now, t, run_ids, wq, st, cfg, bids, bnew, bctx, want, need)
            if nb == 0:  # sleep until the next arrival
                wake = _next_arrival(t, order, clients, st)
                if wake == math.inf:
                    return DONE if st[ENDED] == n else STALLED
                clock[0] = max(wake, now)
                _release(clock[0], True, t, order, refusal, clients, wq, st)
                continue
            st[NB], st[QLEN], st[PHASE] = nb, st[WCOUNT], 1
        nb = st[NB]
        T = 0
        for j in range(nb):
            T += bnew[j]
        if math.isnan(tok[T, 0]):
            st[NEED] = T
            return NEED_TOKENS
        if math.isnan(head_seq[nb, 0, 0]):
            st[NEED] = nb
            return NEED_SEQS
        r = st[ROWS]
        if r == len(rows[0]):
            return CHUNK_FULL
        _price(nb, bnew, bctx, tok, head_tok, head_seq, prm, etas, x, cost)
        prefill = 0
        for j in range(nb):
            if not (bnew[j] == 1 and bctx[j] > 0):
                prefill += bnew[j]
        c = cost
        bound = 0
        for k in range(1, 4):
            if c[1 + k] > c[1 + bound]:
                bound = k
        rows[0][r], rows[1][r] = now, c[0]
        rows[2][r], rows[3][r], rows[4][r], rows[5][r] = nb, T, prefill, T - prefill
        rows[6][r], rows[7][r] = st[QLEN], cfg[5] - st[FREE]
        rows[8][r], rows[9][r], rows[10][r], rows[11][r] = c[1], c[2], c[3], c[4]
        rows[12][r] = bound
        st[ROWS] = r + 1
        end = now + c[0]
        _release(end, False, t, order, refusal, clients, wq, st)
        clock[0] = end
        _update(end, t, run_ids, st, nb, bids, bnew, emit, gaps, counts, sums, low,
                log_ratio, clients)
        st[PHASE] = 0
