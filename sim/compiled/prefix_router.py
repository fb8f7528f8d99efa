"""``prefix_affinity`` (``sim.routers.prefix_affinity``) in compiled code: per replica an LRU
index of the trace ids it was sent (``sim.compiled.lru_map``), the longest indexed prefix
within the load cap wins."""

from __future__ import annotations

from sim.compiled import lru_map as M
from sim.compiled.jit import compiled
from sim.compiled.prefix_cache import PREFIX
from sim.compiled.replica_rows import ALIVE, OUT


@compiled
def longest(rid, rs, t):
    """``PrefixAffinityRouter.choose`` up to its fallback: the replica up, within the load cap,
    whose index holds the longest prefix of ``rid``'s ids (ties: fewer outstanding, then the
    first), or −1 when they match nowhere or it has none."""
    px = t[PREFIX]
    index, roff, ids = px[9], px[10], px[11]
    lo, hi = roff[rid], roff[rid + 1]
    if lo == hi:
        return -1
    n = rs.shape[0]
    limit = -1
    for r in range(n):
        if rs[r, ALIVE] and (limit < 0 or rs[r, OUT] < limit):
            limit = rs[r, OUT]
    limit += px[0][3]
    best, best_len = -1, 0
    for r in range(n):
        if not rs[r, ALIVE] or rs[r, OUT] > limit:
            continue
        k = lo
        while k < hi and M.find(index, r, ids[k]) >= 0:
            k += 1
        k -= lo
        if k > best_len or (k == best_len and k and rs[r, OUT] < rs[best, OUT]):
            best, best_len = r, k
    return best


@compiled
def remember(rid, r, t):
    """``PrefixAffinityRouter._remember``: ``rid``'s ids are the newest of replica ``r``'s
    index, which keeps its most recent ``capacity`` ids."""
    px = t[PREFIX]
    index, roff, ids = px[9], px[10], px[11]
    lo, hi = roff[rid], roff[rid + 1]
    for k in range(hi - 1, lo - 1, -1):  # the last block first: leaves are evicted first
        s = M.find(index, r, ids[k])
        if s < 0:
            s = M.add(index, r, ids[k])
        else:
            M.unlink(index, r, s)
        M.link(index, r, s)
    while index[5][r, M.SIZE] > px[0][2]:
        M.pop_oldest(index, r)
