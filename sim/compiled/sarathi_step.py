"""``SarathiScheduler.schedule`` in compiled code (``sim.compiled.step_schedule`` runs it)."""

from __future__ import annotations

from sim.compiled import prefix_cache as PC
from sim.compiled.jit import compiled
from sim.compiled.replica_rows import (
    CHUNK,
    FREE,
    NRUN,
    WCOUNT,
    WHEAD,
    admit,
    allocate,
    allocate_decodes,
    preempt,
    unmatch,
    wait_popleft,
)


@compiled
def schedule_sarathi(now, t, run, q, wnext, cfg, bids, bnew, bctx, want):
    """``SarathiScheduler.schedule`` (recompute): decodes, then chunks of prompts in
    progress, then chunks of new prompts, into ``bids``/``bnew``/``bctx``; returns the
    batch's size. ``run`` stays in arrival order."""
    arrival, num_tokens, computed = t[0], t[1], t[2]
    room, max_seqs, bs = cfg[CHUNK], cfg[1], cfg[4]
    nrun = q[NRUN]
    if not allocate_decodes(run, nrun, t, q, bs):
        # ``_decodes_with_preemption``: the latest-arrived not yet visited goes first
        keep = 0
        i = 0
        while i < nrun:
            r = run[i]
            i += 1
            if num_tokens[r] - computed[r] > 1:  # prompt in progress: its blocks are held
                run[keep] = r
                keep += 1
                continue
            while not allocate(r, 1, t, q, bs):
                if i < nrun:
                    victim = run[nrun - 1]
                    nrun -= 1
                else:
                    victim = r
                preempt(victim, t, q, wnext)
                if victim == r:
                    break
            else:
                run[keep] = r
                keep += 1
        nrun = keep
        q[NRUN] = nrun
    nb = 0
    for j in range(nrun):  # the decodes, in running order
        r = run[j]
        if num_tokens[r] - computed[r] == 1:
            bids[nb], bnew[nb], bctx[nb] = r, 1, computed[r]
            nb += 1
    room -= nb
    for j in range(nrun):  # FCFS chunks of the prompts in progress
        r = run[j]
        rem = num_tokens[r] - computed[r]
        if rem > 1:
            give = min(max(room, 0), rem)
            if give > 0:
                bids[nb], bnew[nb], bctx[nb] = r, give, computed[r]
                nb += 1
                room -= give
    slots = max_seqs - nrun
    while q[WCOUNT] and slots > 0 and room > 0:  # ``_admit_waiting``
        rid = q[WHEAD]
        hit = 0  # ``_match_prefix``
        if t[PC.PREFIX][0][0] and not computed[rid]:
            hit = computed[rid] = PC.match(t, q, rid, FREE, bs)
        n = num_tokens[rid] - computed[rid]
        if not allocate(rid, n, t, q, bs):  # the whole prompt, up front
            unmatch(rid, hit, t, q)
            break
        wait_popleft(q, wnext)
        admit(rid, now, t, hit)
        k = nrun  # into the running list by arrival, after any that arrived no later
        while k > 0 and arrival[run[k - 1]] > arrival[rid]:
            run[k] = run[k - 1]
            k -= 1
        run[k] = rid
        nrun += 1
        q[NRUN] = nrun
        bids[nb], bnew[nb], bctx[nb] = rid, min(n, room), computed[rid]
        room -= bnew[nb]
        nb += 1
        slots -= 1
    return nb
