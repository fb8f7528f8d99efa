"""``TrtllmScheduler.schedule`` in compiled code (``sim.compiled.step_schedule`` runs it)."""

from __future__ import annotations

from sim.compiled import prefix_cache as PC
from sim.compiled.jit import compiled
from sim.compiled.replica_rows import (
    FREE,
    NO_EVICT,
    NRUN,
    WCOUNT,
    WHEAD,
    admit,
    allocate,
    allocate_decodes,
    fit_preempting_last,
    unmatch,
    wait_popleft,
)


@compiled
def _trt_chunk(remaining, room, chunked, bs, budget):
    """``TrtllmScheduler._chunk``: all of a context if it fits, else (chunking on) what fits
    in whole blocks (a budget smaller than a block is its own unit), else 0."""
    if remaining <= room:
        return remaining
    if not chunked:
        return 0
    unit = min(bs, budget)
    return max(room, 0) // unit * unit


@compiled
def _full_blocks(rid, prompt, max_output, bs):
    """``TrtllmScheduler.full_blocks``: blocks at its maximum length."""
    return (prompt[rid] + max_output[rid] - 1 + bs - 1) // bs


@compiled
def schedule_trtllm(now, t, run, q, wnext, cfg, bids, bnew, bctx):
    """``TrtllmScheduler.schedule`` (recompute): generation tokens, then chunks of contexts
    in flight, then new contexts, into ``bids``/``bnew``/``bctx``; returns the batch's size."""
    num_tokens, computed, max_output, held, prompt = t[1], t[2], t[4], t[5], t[13]
    budget, max_seqs, chunked, bs, no_evict = cfg[0], cfg[1], cfg[3], cfg[4], cfg[NO_EVICT]
    nrun = q[NRUN]
    paused = False
    if not allocate_decodes(run, nrun, t, q, bs):
        if no_evict:
            raise AssertionError("GUARANTEED_NO_EVICT ran out of reserved KV blocks")
        # ``_pause_until_generation_fits``: the last started is paused first
        i = 0
        while i < nrun:
            r = run[i]
            if num_tokens[r] - computed[r] == 1:
                fits, nrun = fit_preempting_last(r, 1, run, nrun, t, q, wnext, bs)
                if not fits:
                    break
            i += 1
        paused = nrun < q[NRUN]
        q[NRUN] = nrun
    nb = 0
    for j in range(nrun):  # the generation tokens, in running order
        r = run[j]
        if num_tokens[r] - computed[r] == 1:
            bids[nb], bnew[nb], bctx[nb] = r, 1, computed[r]
            nb += 1
    room = budget - nb
    for j in range(nrun):  # chunks of the contexts in flight, in running order
        r = run[j]
        rem = num_tokens[r] - computed[r]
        if rem > 1:
            c = _trt_chunk(rem, room, chunked, bs, budget)
            room -= c
            if c > 0:
                bids[nb], bnew[nb], bctx[nb] = r, c, computed[r]
                nb += 1
    if paused or q[WCOUNT] == 0:
        return nb
    slots = max_seqs - nrun  # ``_admit_waiting``
    left = 0
    if no_evict:  # free blocks not set aside for the running requests to finish
        left = q[FREE]
        for j in range(nrun):
            left -= _full_blocks(run[j], prompt, max_output, bs) - held[run[j]]
    while q[WCOUNT] and slots > 0:
        rid = q[WHEAD]
        free = q[FREE]
        hit = 0  # ``_match_prefix``
        if t[PC.PREFIX][0][0] and not computed[rid]:
            hit = computed[rid] = PC.match(t, q, rid, FREE, bs)
        taken = free - q[FREE]  # cached blocks the hit took from the free ones
        n = num_tokens[rid] - computed[rid]
        c = _trt_chunk(n, room, chunked, bs, budget)
        need = 0
        if no_evict and c:
            need = _full_blocks(rid, prompt, max_output, bs) - held[rid] + taken
            if need > left:
                c = 0
        if c == 0:
            unmatch(rid, hit, t, q)
            break
        left -= need
        if not allocate(rid, n, t, q, bs):  # the prompt's blocks, at start
            unmatch(rid, hit, t, q)
            break
        wait_popleft(q, wnext)
        admit(rid, now, t, hit)
        run[nrun] = rid
        nrun += 1
        q[NRUN] = nrun
        bids[nb], bnew[nb], bctx[nb] = rid, c, computed[rid]
        nb += 1
        room -= c
        slots -= 1
    return nb
