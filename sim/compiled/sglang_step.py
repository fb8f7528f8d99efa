"""``SglangScheduler.schedule`` in compiled code (``sim.compiled.step_schedule`` runs it)."""

from __future__ import annotations

from sim.compiled.jit import compiled
from sim.compiled.replica_rows import (
    CHUNK,
    CHUNKED,
    FREE,
    NRUN,
    RATIO,
    RUNNING,
    WCOUNT,
    WHEAD,
    admit,
    allocate,
    release,
    wait_append,
    wait_popleft,
)

# numba freezes these at compile time; sim.compiled's cache stamp covers sim/schedulers/
from sim.schedulers.sglang import (
    CLIP_MAX_NEW_TOKENS,
    INIT_NEW_TOKEN_RATIO,
    MIN_NEW_TOKEN_RATIO,
    NEW_TOKEN_RATIO_DECAY,
    RETRACT_DECODE_STEPS,
)


@compiled
def _sglang_prefill(now, t, run, q, qf, wnext, cfg, bids, bnew, bctx):
    """``SglangScheduler._prefill_batch`` (FCFS): its size, 0 when nothing is prefilled."""
    num_tokens, computed, generated, max_output = t[1], t[2], t[3], t[4]
    max_running, bs = cfg[1], cfg[4]
    nrun = q[NRUN]
    reserved = 0
    for j in range(nrun):  # ``_reserved_tokens``
        r = run[j]
        reserved += min(max_output[r] - generated[r], CLIP_MAX_NEW_TOKENS)
    rem_total = q[FREE] * bs - (reserved * qf[RATIO] if nrun else 0.0)
    rem_input, rem_chunk = cfg[0], cfg[CHUNK]
    nb = 0
    c = q[CHUNKED]
    if c >= 0:  # the chunked request goes first, with what the chunk allows
        n = min(num_tokens[c] - computed[c], rem_chunk)
        if not allocate(c, n, t, q, bs):
            return 0
        bids[0], bnew[0], bctx[0] = c, n, computed[c]
        nb = 1
        rem_total -= n
        rem_input -= n
        rem_chunk -= n
    admitted = 0
    for _ in range(q[WCOUNT]):
        rid = q[WHEAD]
        if nrun + admitted >= max_running or rem_input <= 0 or rem_chunk <= 0:
            break
        extend = num_tokens[rid] - computed[rid]
        max_new = min(max_output[rid] - generated[rid], CLIP_MAX_NEW_TOKENS)
        if extend + max_new >= rem_total and (nrun or nb):
            break
        n = min(extend, rem_chunk)
        if n > rem_input and nb:
            break
        if not allocate(rid, n, t, q, bs):
            break
        wait_popleft(q, wnext)
        admit(rid, now, t, 0)
        run[nrun + admitted] = rid
        admitted += 1
        bids[nb], bnew[nb], bctx[nb] = rid, n, computed[rid]
        nb += 1
        rem_total -= extend + max_new
        rem_input -= n
        rem_chunk -= n
        if n < extend:
            q[CHUNKED] = rid
            break
    q[NRUN] = nrun + admitted
    return nb


@compiled
def _victims_last(keep, m, generated, prompt, buf):
    """``keep[:m]`` in ``SglangScheduler._retract``'s order, the next victim last:
    ``np.lexsort((-prompt, generated))`` reversed, i.e. (generated, −prompt) descending with
    ties in the reverse of their order. A stable merge sort of the reversed ids (the loop does
    not allocate; ``buf`` holds ``m`` ids)."""
    for j in range(m // 2):
        keep[j], keep[m - 1 - j] = keep[m - 1 - j], keep[j]
    width = 1
    while width < m:
        for lo in range(0, m, 2 * width):
            mid, hi = min(lo + width, m), min(lo + 2 * width, m)
            i, j = lo, mid
            for k in range(lo, hi):
                take_right = j < hi and (i == mid or (
                    generated[keep[j]], -prompt[keep[j]]) > (generated[keep[i]], -prompt[keep[i]]))
                if take_right:
                    buf[k] = keep[j]
                    j += 1
                else:
                    buf[k] = keep[i]
                    i += 1
        for k in range(m):
            keep[k] = buf[k]
        width *= 2


@compiled
def _sglang_retract(t, run, q, qf, wnext, bs, keep, buf):
    """``SglangScheduler._retract`` of the decode requests ``run[:nrun]`` except the chunked
    one: the kept, in ``keep[:k]`` (most progressed first), k returned; ``buf`` is scratch."""
    num_tokens, generated, max_output, held, status = t[1], t[3], t[4], t[5], t[6]
    prompt = t[13]
    nrun, c = q[NRUN], q[CHUNKED]
    m = 0
    for j in range(nrun):
        if run[j] != c:
            keep[m] = run[j]
            m += 1
    _victims_last(keep, m, generated, prompt, buf)
    k = m
    while k > 1:
        need = 0
        for j in range(k):
            r = keep[j]
            need += max((num_tokens[r] + bs - 1) // bs - held[r], 0)
        if need <= q[FREE]:
            break
        k -= 1
        release(keep[k], t, q)
        wait_append(q, wnext, keep[k])  # SGLang puts it at the back
    n = 0
    for j in range(nrun):  # the running list keeps its order
        r = run[j]
        if r == c or status[r] == RUNNING:
            run[n] = r
            n += 1
    q[NRUN] = n
    gen, mx = 0, 0
    for j in range(k):
        gen += generated[keep[j]]
        mx += max_output[keep[j]]
    qf[RATIO] = min(1.0, (gen + RETRACT_DECODE_STEPS * k) / (mx + 1))
    return k


@compiled
def schedule_sglang(now, t, run, q, qf, wnext, cfg, bids, bnew, bctx):
    """``SglangScheduler.schedule`` (FCFS, recompute retraction): a prefill batch if any
    request can be admitted (or a chunked prefill goes on), else a decode batch of every
    running request; returns its size (0: nothing can run)."""
    num_tokens, computed, held = t[1], t[2], t[5]
    bs = cfg[4]
    if q[WCOUNT] == 0 and q[NRUN] == 0:
        qf[RATIO] = INIT_NEW_TOKEN_RATIO  # idle: back to the initial estimate
        return 0
    if q[WCOUNT] or q[CHUNKED] >= 0:
        nb = _sglang_prefill(now, t, run, q, qf, wnext, cfg, bids, bnew, bctx)
        if nb:
            return nb
    c = q[CHUNKED]
    nb = 0
    blocks = 0
    for j in range(q[NRUN]):  # ``_decode_batch``: every running request but the chunked
        r = run[j]
        if r != c:
            bids[nb], bnew[nb], bctx[nb] = r, num_tokens[r] - computed[r], computed[r]
            blocks += max((num_tokens[r] + bs - 1) // bs - held[r], 0)
            nb += 1
    if nb == 0:
        return 0
    if blocks > q[FREE]:
        nb = _sglang_retract(t, run, q, qf, wnext, bs, bids, bnew)
        blocks = 0
        for j in range(nb):
            r = bids[j]
            bnew[j], bctx[j] = num_tokens[r] - computed[r], computed[r]
            blocks += max((num_tokens[r] + bs - 1) // bs - held[r], 0)
        if blocks > q[FREE]:
            raise AssertionError("one request cannot decode in an otherwise empty cache")
    else:
        qf[RATIO] = max(qf[RATIO] - NEW_TOKEN_RATIO_DECAY, MIN_NEW_TOKEN_RATIO)
    for j in range(nb):
        r = bids[j]
        held[r] = max(held[r], (num_tokens[r] + bs - 1) // bs)
    q[FREE] -= blocks
    return nb
