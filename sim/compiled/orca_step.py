"""``OrcaScheduler.schedule`` in compiled code (``sim.compiled.step_schedule`` runs it)."""

from __future__ import annotations

from sim.compiled.jit import compiled
from sim.compiled.replica_rows import NRUN, WCOUNT, WHEAD, admit, allocate, wait_popleft


@compiled
def schedule_orca(now, t, run, q, wnext, cfg, bids, bnew, bctx):
    """``OrcaScheduler.schedule``: every running request's next token, plus the whole
    prompts of newcomers admitted in arrival order with the blocks of their maximum length
    reserved, into ``bids``/``bnew``/``bctx``; returns the batch's size."""
    num_tokens, computed, max_output, prompt = t[1], t[2], t[4], t[13]
    max_seqs, bs = cfg[1], cfg[4]
    nrun = q[NRUN]
    budget = cfg[0] - nrun
    while q[WCOUNT] and nrun < max_seqs:
        rid = q[WHEAD]
        n = num_tokens[rid] - computed[rid]
        if n > budget:
            break
        if not allocate(rid, prompt[rid] + max_output[rid] - 1 - computed[rid], t, q, bs):
            break
        wait_popleft(q, wnext)
        admit(rid, now, t, 0)
        run[nrun] = rid
        nrun += 1
        budget -= n
    q[NRUN] = nrun
    for j in range(nrun):
        r = run[j]
        bids[j], bnew[j], bctx[j] = r, num_tokens[r] - computed[r], computed[r]
    return nrun
