"""vLLM's prefix cache in compiled code: ``PagedKVCache``'s prefix operations and
``PrefixPool`` (``sim.kv.manager``, ``sim.kv.prefix``) over arrays, for the compiled loop.

A request's block hashes are those ``PagedKVCache._block_hashes`` gives (``block_hashes``),
computed when needed from its chain of ids (``id_chain``: a trace's ids, or ``own_ids`` for a
request without); a run keeps one int64 per id, not one per block.
Each replica's cached blocks are a set of ``sim.compiled.lru_map`` with reference counts
``refs``; a cached block whose count falls to 0 joins the set's LRU list, and a block
allocation that finds too few empty blocks evicts the oldest of it (``PagedKVCache._take``).
``px`` (the table's ``PREFIX`` entry) is ``((on, block size), chain_off, chain, span,
blocks, ref, pending, cache, refs)``: per request the offset of its chain of ids, how many
tokens each id names, how many full blocks it names, the leading blocks it references and
whether it has computed blocks not yet cached. With ``on == 0`` nothing here runs and blocks
are only counted.
"""

from __future__ import annotations

import numpy as np

from sim.compiled import lru_map as M
from sim.compiled.jit import compiled
from sim.kv.prefix import _MIX, id_chain, own_ids

PREFIX = 14  # the prefix state's index in the compiled table (``sim.compiled.core``)
CACHED = 15  # the table's ``cached_tokens`` column
INDEX = 12  # the request table's column of each request's replica (``RequestTable.replica``)


def prefix_state(kv, table, replicas: int) -> tuple:
    """``px`` of ``replicas`` replicas of cache ``kv`` (a ``PagedKVCache`` as built: every
    replica's is alike); without prefix caching, the empty state."""
    on = kv.prefix is not None
    n = table.size if on else 0  # (off: no per-request arrays, a million requests or not)
    span = np.ones(n, np.int64)  # tokens each id of a request's chain names
    blocks = np.zeros(n, np.int64)
    chains = []
    if on:
        hash_ids, g, lengths = kv.prefix_source
        bs = kv.block_size
        for rid in range(n):  # as ``PagedKVCache._block_hashes`` names them
            ids = hash_ids[rid] if hash_ids is not None else None
            if ids is not None and len(ids):
                span[rid], tokens = g, len(ids) * g
            elif lengths is not None:
                ids = own_ids(rid)
                tokens = int(lengths[rid])
                span[rid] = max(tokens, 1)
            else:
                ids, tokens = (), 0
            chains.append(id_chain(ids))
            blocks[rid] = min(tokens, len(ids) * int(span[rid])) // bs
    chain_off = np.zeros(n + 1, np.int64)
    if on:
        np.cumsum([len(c) for c in chains], out=chain_off[1:])
    chain = np.concatenate(chains) if chains else np.zeros(0, np.int64)
    sets = replicas if on else 1
    slots = kv.num_blocks if on else 1
    return (np.array([int(on), kv.block_size], np.int64), chain_off, chain, span, blocks,
            np.zeros(n, np.int64), np.zeros(n, np.int64), M.lru_maps(sets, slots),
            np.zeros((sets, slots), np.int64))


@compiled
def num_hashes(px, rid):
    """How many full blocks ``rid``'s hashes name."""
    return px[4][rid]


@compiled
def hash_at(px, rid, j):
    """The hash of ``rid``'s block ``j`` (``block_hashes``: the chain up to the id naming its
    last token, mixed with ``j``)."""
    bs = px[0][1]
    return px[2][px[1][rid] + ((j + 1) * bs - 1) // px[3][rid]] ^ ((j + 1) * _MIX)


@compiled
def take(t, q, r, n, free):
    """``PagedKVCache._take``: hand out ``n`` of replica ``r``'s free blocks (``q[free]``),
    evicting its least recently freed cached blocks when too few are empty."""
    px = t[PREFIX]
    if px[0][0]:
        cache = px[7]
        short = n - (q[free] - cache[5][r, M.NLRU])
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
    ref, pending = px[5], px[6]
    pending[rid] = 0
    k = ref[rid]
    if not k:
        return 0
    ref[rid] = 0
    r = t[INDEX][rid]
    cache, refs = px[7], px[8]
    freed = 0
    for j in range(k - 1, -1, -1):  # the prefix's last block is queued first
        s = M.find(cache, r, hash_at(px, rid, j))
        refs[r, s] -= 1
        if refs[r, s] == 0:
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
    cache, refs = px[7], px[8]
    most = min((t[1][rid] - 1) // bs, n)
    px[6][rid] = 1
    hit = 0
    while hit < most:  # the cached leading blocks, each touched (``PrefixPool.touch``)
        s = M.find(cache, r, hash_at(px, rid, hit))
        if s < 0:
            break
        if refs[r, s] == 0:
            M.unlink(cache, r, s)
            q[free] -= 1
        refs[r, s] += 1
        hit += 1
    if not hit:
        return 0
    held[rid] = hit
    px[5][rid] = hit
    if hit == n:
        px[6][rid] = 0
    return hit * bs


@compiled
def commit(t, q, rid, free, bs):
    """``PagedKVCache.commit`` of one request: cache the full named blocks it has computed
    (a block cached already is referenced instead, and its own copy is free)."""
    px = t[PREFIX]
    pending, ref = px[6], px[5]
    if not pending[rid]:
        return
    n = min(t[2][rid] // bs, t[5][rid], num_hashes(px, rid))
    k = ref[rid]
    if n > k:
        r = t[INDEX][rid]
        cache, refs = px[7], px[8]
        for j in range(k, n):  # ``PrefixPool.insert_many``
            h = hash_at(px, rid, j)
            s = M.find(cache, r, h)
            if s < 0:
                s = M.add(cache, r, h)
                refs[r, s] = 1
                continue
            if refs[r, s] == 0:
                M.unlink(cache, r, s)
            else:
                q[free] += 1
            refs[r, s] += 1
        ref[rid] = n
    if n == num_hashes(px, rid):
        pending[rid] = 0
