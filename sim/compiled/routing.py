"""The compiled loop's routers' own state, and the routers that need more than the replica
rows: ``prefix_affinity`` (``sim.routers.prefix_affinity``: per replica an LRU index of the
trace ids it was sent, ``sim.compiled.lru_map``; the longest indexed prefix within the load
cap wins) and the random ones, ``power_of_two`` and ``uniform_random``, whose draws from the
routing stream are made before the run: one per routed request, as the Python router makes
them (the number of replicas up never changes where they run, so the draws do not depend on
the run).

``router`` is ``(meta, index, roff, rval, draws)``: ``meta`` = (kind, index capacity, load
cap, draws taken); ``roff``/``rval`` each request's trace ids (CSR); ``draws`` per routed
request the replica (``uniform_random``) or the two replicas (``power_of_two``) drawn.
"""

from __future__ import annotations

import numpy as np

from sim.compiled import lru_map as M
from sim.compiled.jit import compiled
from sim.compiled.replica_rows import ALIVE, OUT
from sim.routers.power_of_two import PowerOfTwoRouter
from sim.routers.prefix_affinity import PrefixAffinityRouter
from sim.routers.uniform_random import RandomRouter

(ROUND_ROBIN, LEAST_OUTSTANDING, JSQ_TOKENS, KV_AWARE, PREFIX_AFFINITY, POWER_OF_TWO,
 UNIFORM_RANDOM) = range(7)
KINDS = {"round_robin": ROUND_ROBIN, "least_outstanding": LEAST_OUTSTANDING,
         "jsq_tokens": JSQ_TOKENS, "kv_aware": KV_AWARE, "prefix_affinity": PREFIX_AFFINITY,
         "power_of_two": POWER_OF_TWO, "random": UNIFORM_RANDOM}
KIND, CAPACITY, LOAD_CAP, TAKEN = range(4)  # fields of ``meta``


def router_state(router, replicas: int, refusal: np.ndarray) -> tuple:
    """``router`` (the pool's Python router, of ``replicas`` replicas, all up) as the compiled
    loop's state; ``refusal``: per request its reason to be refused before routing (0: none)."""
    kind = KINDS.get(router.name, ROUND_ROBIN)
    meta = np.zeros(4, np.int64)
    meta[KIND] = kind
    ids = router.view.hash_ids if isinstance(router, PrefixAffinityRouter) else None
    if kind == PREFIX_AFFINITY and ids is None:  # nothing to index: its fallback decides
        meta[KIND] = LEAST_OUTSTANDING
    n = len(refusal) if ids is not None else 0  # (per-request arrays only for the index)
    counts = np.zeros(n, np.int64)
    if ids is not None:
        meta[CAPACITY], meta[LOAD_CAP] = router.capacity, router.load_cap
        counts[:] = [len(x) if x is not None else 0 for x in ids]
    roff = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=roff[1:])
    rval = np.fromiter((int(x) for each in (ids if ids is not None else ()) if each is not None
                        for x in each), np.int64, int(roff[-1]))
    index = M.lru_maps(replicas if ids is not None else 1,
                       int(meta[CAPACITY] + counts.max(initial=0)) if ids is not None else 1)
    routed = int(np.count_nonzero(refusal == 0)) if replicas > 1 else 0
    draws = np.zeros((0, 2), np.int64)
    if isinstance(router, PowerOfTwoRouter) and routed:  # ``PowerOfTwoRouter.choose``
        draws = router.rng.integers(0, np.tile([replicas, replicas - 1], (routed, 1)))
        draws[:, 1] += draws[:, 1] >= draws[:, 0]
    elif isinstance(router, RandomRouter) and routed:  # ``RandomRouter.choose``
        draws = np.repeat(router.rng.integers(replicas, size=routed)[:, None], 2, axis=1)
    return meta, index, roff, rval, draws.astype(np.int64)


@compiled
def drawn(router, rs):
    """The replica ``power_of_two`` or ``uniform_random`` sends the next request to."""
    meta, draws = router[0], router[4]
    a, b = draws[meta[TAKEN], 0], draws[meta[TAKEN], 1]
    meta[TAKEN] += 1
    return b if rs[b, OUT] < rs[a, OUT] else a


@compiled
def longest(rid, rs, router):
    """``PrefixAffinityRouter.choose`` up to its fallback: the replica up, within the load cap,
    whose index holds the longest prefix of ``rid``'s ids (ties: fewer outstanding, then the
    first), or −1 when they match nowhere or it has none."""
    meta, index, roff, ids = router[0], router[1], router[2], router[3]
    lo, hi = roff[rid], roff[rid + 1]
    if lo == hi:
        return -1
    n = rs.shape[0]
    limit = -1
    for r in range(n):
        if rs[r, ALIVE] and (limit < 0 or rs[r, OUT] < limit):
            limit = rs[r, OUT]
    limit += meta[LOAD_CAP]
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
def remember(rid, r, router):
    """``PrefixAffinityRouter._remember``: ``rid``'s ids are the newest of replica ``r``'s
    index, which keeps its most recent ``capacity`` ids."""
    meta, index, roff, ids = router[0], router[1], router[2], router[3]
    lo, hi = roff[rid], roff[rid + 1]
    for k in range(hi - 1, lo - 1, -1):  # the last block first: leaves are evicted first
        s = M.find(index, r, ids[k])
        if s < 0:
            s = M.add(index, r, ids[k])
        else:
            M.unlink(index, r, s)
        M.link(index, r, s)
    while index[2][r, M.SIZE] > meta[CAPACITY]:
        M.pop_oldest(index, r)
