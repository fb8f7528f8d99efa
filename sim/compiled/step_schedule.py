"""One replica's scheduler in compiled code: ``schedule`` runs the replica's policy
(``cfg[POLICY]``), ``update`` is ``TokenBudgetScheduler.update``.

vLLM (here): chunked prefill, ``long_prefill_token_threshold``, recompute preemption; FCFS
(the most recently admitted request is the victim) or a keyed order — ``policy=priority``,
``scheduler=edf`` — whose heap is ``sim.compiled.keyed_queue`` (the victim is the running
request with the largest key). Sarathi-Serve (``sim.compiled.sarathi_step``),
TensorRT-LLM (``trtllm_step``), SGLang in FCFS order (``sglang_step``) and Orca
(``orca_step``) each in their own module. All on paged KV blocks
(``sim.compiled.replica_rows``), in the order and with the arithmetic of the Python classes.
"""

from __future__ import annotations

import math

from sim.compiled import prefix_cache as PC
from sim.compiled.jit import compiled
from sim.compiled.keyed_queue import FCFS, latest_key, wait_pop_keyed, wait_push
from sim.compiled.orca_step import schedule_orca
from sim.compiled.replica_rows import (  # noqa: F401  (the rows' fields, for kernel and core)
    ALIVE,
    CHUNK,
    CHUNKED,
    EMPTIED,
    EMPTIED_STAMP,
    END,
    FINISHED,
    FREE,
    NB,
    NO_EVICT,
    NRUN,
    NUM_FIELDS,
    NUM_FLOATS,
    ORCA,
    ORDER,
    OUT,
    PHASE,
    POLICY,
    QLEN,
    RATIO,
    REJECTED,
    RUNNING,
    SARATHI,
    SGLANG,
    START,
    STARTED,
    TRTLLM,
    VLLM,
    WAITING,
    WCOUNT,
    WHEAD,
    WTAIL,
    admit,
    allocate,
    fit_preempting_last,
    free,
    release,
    unmatch,
    wait_append,
    wait_popleft,
    want_of,
)
from sim.compiled.sarathi_step import schedule_sarathi
from sim.compiled.sglang_step import INIT_NEW_TOKEN_RATIO, schedule_sglang  # noqa: F401
from sim.compiled.trtllm_step import schedule_trtllm


@compiled
def schedule(now, t, run, q, qf, waiting, cfg, bids, bnew, bctx, want, need):
    """The batch of the replica's policy (``cfg[POLICY]``); returns its size. ``waiting`` is
    the waiting queues' links (``sim.compiled.keyed_queue``); only vLLM's loop reads keys."""
    wnext = waiting[0]
    if cfg[POLICY] == SGLANG:
        return schedule_sglang(now, t, run, q, qf, wnext, cfg, bids, bnew, bctx)
    if cfg[POLICY] == SARATHI:
        return schedule_sarathi(now, t, run, q, wnext, cfg, bids, bnew, bctx, want)
    if cfg[POLICY] == TRTLLM:
        return schedule_trtllm(now, t, run, q, wnext, cfg, bids, bnew, bctx)
    if cfg[POLICY] == ORCA:
        return schedule_orca(now, t, run, q, wnext, cfg, bids, bnew, bctx)
    return schedule_vllm(now, t, run, q, waiting, cfg, bids, bnew, bctx, want, need)


@compiled
def schedule_vllm(now, t, run, q, waiting, cfg, bids, bnew, bctx, want, need):
    """``VllmScheduler.schedule`` (recompute; FCFS, or the keyed order ``cfg[ORDER]``): the
    batch into ``bids``/``bnew``/``bctx``; returns its size (0: nothing can run)."""
    wnext, order = waiting[0], cfg[ORDER]
    num_tokens, computed, held = t[1], t[2], t[5]
    prefix = t[PC.PREFIX][0][0]
    budget, max_seqs, threshold, chunked, bs = cfg[0], cfg[1], cfg[2], cfg[3], cfg[4]
    while True:
        bud = budget
        nb = 0
        preempted = False
        nrun = q[NRUN]
        if nrun:
            total = 0
            for j in range(nrun):
                want[j] = want_of(run[j], num_tokens, computed, threshold)
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
                PC.take(t, q, t[PC.INDEX][run[0]], blocks, FREE)
            else:  # ``_schedule_running_with_preemption``: the last admitted goes first
                total = 0
                i = 0
                while i < nrun and bud - total > 0:
                    rid = run[i]
                    n = min(want_of(rid, num_tokens, computed, threshold), bud - total)
                    if order == FCFS:
                        fits, nrun = fit_preempting_last(rid, n, run, nrun, t, q, wnext, bs)
                        preempted |= nrun < q[NRUN]
                    else:
                        fits = True
                        while not allocate(rid, n, t, q, bs):
                            j = latest_key(run, nrun, waiting)
                            victim = run[j]
                            nrun -= 1
                            for k in range(j, nrun):
                                run[k] = run[k + 1]
                            release(victim, t, q)
                            wait_push(q, waiting, victim, t[0], order)
                            preempted = True
                            if victim == rid:
                                fits = False
                                break
                            if j < i:  # scheduled earlier in this step (bids[j]): give back
                                total -= bnew[j]
                                nb -= 1
                                for k in range(j, nb):
                                    bids[k], bnew[k] = bids[k + 1], bnew[k + 1]
                                    bctx[k] = bctx[k + 1]
                                i -= 1
                    if not fits:
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
                hit = 0  # ``_match_prefix``
                if prefix and not computed[rid]:
                    hit = computed[rid] = PC.match(t, q, rid, FREE, bs)
                n = want_of(rid, num_tokens, computed, threshold)
                if (n > bud and not chunked) or not allocate(rid, min(n, bud), t, q, bs):
                    unmatch(rid, hit, t, q)
                    break
                n = min(n, bud)
                if order == FCFS:
                    wait_popleft(q, wnext)
                else:
                    wait_pop_keyed(q, waiting)
                admit(rid, now, t, hit)
                run[q[NRUN]] = rid
                q[NRUN] += 1
                bids[nb], bnew[nb], bctx[nb] = rid, n, computed[rid]
                nb += 1
                bud -= n
                slots -= 1
        if nb or not preempted:
            return nb


@compiled
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


@compiled
def update(now, t, run, q, nb, bids, bnew, emit, gaps, itl):
    """``TokenBudgetScheduler.update``: the step's tokens land at ``now``; the ids of the
    requests that finished are in ``emit[:k]``, k returned."""
    num_tokens, computed, generated, max_output, status = t[1], t[2], t[3], t[4], t[6]
    first_token, last_token, completion = t[8], t[9], t[10]
    counts, sums, low, log_ratio = itl
    ne = 0
    for j in range(nb):
        r = bids[j]
        computed[r] += bnew[j]
        if computed[r] == num_tokens[r]:
            emit[ne] = r
            ne += 1
    if t[PC.PREFIX][0][0]:  # ``_commit``: the blocks filled by requests that crossed one
        bs = t[PC.PREFIX][0][1]
        for j in range(nb):
            r = bids[j]
            if computed[r] // bs > (computed[r] - bnew[j]) // bs:
                PC.commit(t, q, r, FREE, bs)
    c = q[CHUNKED]  # ``SglangScheduler.update``: its last chunk ran
    if c >= 0 and computed[c] + 1 >= num_tokens[c]:
        q[CHUNKED] = -1
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
            free(r, t, q)
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
