"""vLLM's prefix cache in compiled code: ``PagedKVCache``'s prefix operations and
``PrefixPool`` (``sim.kv.manager``, ``sim.kv.prefix``) over arrays, for the compiled loop.

A request's block hashes are those ``PagedKVCache._block_hashes`` gives (``block_hashes`` of
what ``block_names`` says names them), computed when needed from its chain of ids
(``id_chain``); a run keeps one int64 per id, not one per block.
Each replica's cached blocks are a set of ``sim.compiled.lru_map`` with reference counts
``refs``; a cached block whose count falls to 0 joins the set's LRU list, and a block
allocation that finds too few empty blocks evicts the oldest of it (``PagedKVCache._take``).
``px`` (the table's ``PREFIX`` entry) is ``(on and block size, per request, chain, cache)``:
per request its chain's offset, how many tokens each of its ids names, how many full blocks
they name, the leading blocks it references and whether it has computed blocks not yet
cached; the cache's slots carry a reference count. With ``on == 0`` nothing here runs and
blocks are only counted.
"""

from __future__ import annotations

import numpy as np

from sim.compiled import lru_map as M
from sim.compiled.jit import compiled
from sim.kv.prefix import _MIX, id_chain

PREFIX = 14  # the prefix state's index in the compiled table (``sim.compiled.core``)
CHAIN, SPAN, BLOCKS, REF, PENDING = range(5)  # a request's fields
REFS = M.FREE + 1  # a cached block's slot: how many running requests reference it
CACHED = 15  # the table's ``cached_tokens`` column
INDEX = 12  # the request table's column of each request's replica (``RequestTable.replica``)


def prefix_state(kv, table, replicas: int) -> tuple:
    """``px`` of ``replicas`` replicas of cache ``kv`` (a ``PagedKVCache`` as built: every
    replica's is alike); without prefix caching, the empty state."""
    on = kv.prefix is not None
    n = table.size if on else 0  # (off: no per-request arrays, a million requests or not)
    req = np.zeros((n, 5), np.int64)
    chains = []
    if on:
        bs = kv.block_size
        offset = 0
        for rid in range(n):
            ids, span, tokens = kv.block_names(rid) or ((), 1, 0)
            chains.append(id_chain(ids))
            req[rid, CHAIN], req[rid, SPAN] = offset, span
            req[rid, BLOCKS] = min(tokens, len(ids) * span) // bs
            offset += len(ids)
    chain = np.concatenate(chains) if chains else np.zeros(0, np.int64)
    return (np.array([int(on), kv.block_size], np.int64), req, chain,
            M.lru_maps(replicas if on else 1, kv.num_blocks if on else 1, columns=1))


@compiled
def num_hashes(px, rid):
    """How many full blocks ``rid``'s hashes name."""
    return px[1][rid, BLOCKS]


@compiled
def hash_at(px, rid, j):
    """The hash of ``rid``'s block ``j`` (``block_hashes``: the chain up to the id naming its
    last token, mixed with ``j``)."""
    req = px[1]
    return px[2][req[rid, CHAIN] + ((j + 1) * px[0][1] - 1) // req[rid, SPAN]] ^ \
        ((j + 1) * _MIX)


@compiled
def take(t, q, r, n, free):
    """``PagedKVCache._take``: hand out ``n`` of replica ``r``'s free blocks (``q[free]``),
    evicting its least recently freed cached blocks when too few are empty."""
    px = t[PREFIX]
    if px[0][0]:
        cache = px[3]
        short = n - (q[free] - cache[2][r, M.NLRU])
        for _ in range(short):
            M.pop_oldest(cache, r)
    q[free] -= n


@compiled
def release(t, rid):
    """``PagedKVCache._release``: forget ``rid``'s references; its held blocks that must not
    count as empty, net of the cached ones now free (to add to the blocks it returns)."""
    px = t[PREFIX]
    if not px[0][0]:
        return 0
    req = px[1]
    req[rid, PENDING] = 0
    k = req[rid, REF]
    if not k:
        return 0
    req[rid, REF] = 0
    r = t[INDEX][rid]
    cache = px[3]
    slots = cache[1]
    freed = 0
    for j in range(k - 1, -1, -1):  # the prefix's last block is queued first
        s = M.find(cache, r, hash_at(px, rid, j))
        slots[r, s, REFS] -= 1
        if slots[r, s, REFS] == 0:
            M.link(cache, r, s)
            freed += 1
    return freed - k


@compiled
def match(t, q, rid, free, bs):
    """``PagedKVCache.match_prefix`` (no state blocks, no host tier): start ``rid`` (holding
    nothing) from its cached blocks; the tokens served from the cache."""
    px = t[PREFIX]
    held = t[5]
    if held[rid]:
        return 0
    n = num_hashes(px, rid)
    if n == 0:
        return 0
    r = t[INDEX][rid]
    req, cache = px[1], px[3]
    slots = cache[1]
    most = min((t[1][rid] - 1) // bs, n)
    req[rid, PENDING] = 1
    hit = 0
    while hit < most:  # the cached leading blocks, each touched (``PrefixPool.touch``)
        s = M.find(cache, r, hash_at(px, rid, hit))
        if s < 0:
            break
        if slots[r, s, REFS] == 0:
            M.unlink(cache, r, s)
            q[free] -= 1
        slots[r, s, REFS] += 1
        hit += 1
    if not hit:
        return 0
    held[rid] = hit
    req[rid, REF] = hit
    if hit == n:
        req[rid, PENDING] = 0
    return hit * bs


@compiled
def commit(t, q, rid, free, bs):
    """``PagedKVCache.commit`` of one request: cache the full named blocks it has computed
    (a block cached already is referenced instead, and its own copy is free)."""
    px = t[PREFIX]
    req = px[1]
    if not req[rid, PENDING]:
        return
    n = min(t[2][rid] // bs, t[5][rid], num_hashes(px, rid))
    k = req[rid, REF]
    if n > k:
        r = t[INDEX][rid]
        cache = px[3]
        slots = cache[1]
        for j in range(k, n):  # ``PrefixPool.insert_many``
            h = hash_at(px, rid, j)
            s = M.find(cache, r, h)
            if s < 0:
                s = M.add(cache, r, h)
                slots[r, s, REFS] = 1
                continue
            if slots[r, s, REFS] == 0:
                M.unlink(cache, r, s)
            else:
                q[free] += 1
            slots[r, s, REFS] += 1
        req[rid, REF] = n
    if n == num_hashes(px, rid):
        req[rid, PENDING] = 0
