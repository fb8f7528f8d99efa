"""Sets of int64 keys in compiled code, one per replica, each with an LRU order: what a Python
``dict`` and ``OrderedDict`` are to the prefix cache (``sim.kv.prefix.PrefixPool``) and to
``prefix_affinity``'s index, as fixed arrays the compiled loop can use without allocating.

A set holds at most ``slots`` keys. Each key has a slot (0 … slots − 1) found through an
open-addressing table (linear probing, twice the slots or more, deletion by backward shift),
and a slot can be linked into the set's LRU list (oldest at the head). ``m`` is
``(table, keys, prev, next, free, meta, shift)``: per set a row of each array.
"""

from __future__ import annotations

import numpy as np

from sim.compiled.jit import compiled

NFREE, HEAD, TAIL, NLRU, SIZE = range(5)  # fields of a set's meta row
_GOLD = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing's multiplier


def lru_maps(sets: int, slots: int) -> tuple:
    """``sets`` empty sets of at most ``slots`` keys each."""
    slots = max(int(slots), 1)
    bits = max(int(2 * slots - 1).bit_length(), 1)
    free = np.empty((sets, slots), np.int64)
    free[:] = np.arange(slots - 1, -1, -1)
    meta = np.zeros((sets, 5), np.int64)
    meta[:, NFREE] = slots
    meta[:, HEAD] = meta[:, TAIL] = -1
    return (np.zeros((sets, 1 << bits), np.int64), np.zeros((sets, slots), np.int64),
            np.full((sets, slots), -1, np.int64), np.full((sets, slots), -1, np.int64), free,
            meta, np.array([64 - bits], np.uint64))


@compiled
def _home(key, m):
    return np.int64((np.uint64(key) * _GOLD) >> m[6][0])


@compiled
def find(m, r, key):
    """The slot of ``key`` in set ``r``, or −1."""
    table, keys = m[0], m[1]
    mask = table.shape[1] - 1
    p = _home(key, m)
    while True:
        s = table[r, p] - 1
        if s < 0:
            return -1
        if keys[r, s] == key:
            return s
        p = (p + 1) & mask


@compiled
def add(m, r, key):
    """Put ``key`` (not in set ``r``) in a free slot, unlinked; its slot."""
    table, keys, free, meta = m[0], m[1], m[4], m[5]
    if meta[r, NFREE] == 0:
        raise AssertionError("an LRU map of the compiled loop is full")
    meta[r, NFREE] -= 1
    s = free[r, meta[r, NFREE]]
    keys[r, s] = key
    mask = table.shape[1] - 1
    p = _home(key, m)
    while table[r, p]:
        p = (p + 1) & mask
    table[r, p] = s + 1
    meta[r, SIZE] += 1
    return s


@compiled
def remove(m, r, s):
    """Take slot ``s``'s key (unlinked) out of set ``r``; the slot is free again."""
    table, keys, free, meta = m[0], m[1], m[4], m[5]
    mask = table.shape[1] - 1
    p = _home(keys[r, s], m)
    while table[r, p] - 1 != s:
        p = (p + 1) & mask
    table[r, p] = 0
    j = p
    while True:  # backward shift: close the gap for the keys probed past it
        j = (j + 1) & mask
        t = table[r, j] - 1
        if t < 0:
            break
        h = _home(keys[r, t], m)
        if (j > p and (h <= p or h > j)) or (j < p and h <= p and h > j):
            table[r, p] = t + 1
            table[r, j] = 0
            p = j
    free[r, meta[r, NFREE]] = s
    meta[r, NFREE] += 1
    meta[r, SIZE] -= 1


@compiled
def link(m, r, s):
    """Slot ``s`` becomes the newest of set ``r``'s LRU list."""
    prev, nxt, meta = m[2], m[3], m[5]
    tail = meta[r, TAIL]
    prev[r, s], nxt[r, s] = tail, -1
    if tail >= 0:
        nxt[r, tail] = s
    else:
        meta[r, HEAD] = s
    meta[r, TAIL] = s
    meta[r, NLRU] += 1


@compiled
def unlink(m, r, s):
    """Take slot ``s`` out of set ``r``'s LRU list."""
    prev, nxt, meta = m[2], m[3], m[5]
    a, b = prev[r, s], nxt[r, s]
    if a >= 0:
        nxt[r, a] = b
    else:
        meta[r, HEAD] = b
    if b >= 0:
        prev[r, b] = a
    else:
        meta[r, TAIL] = a
    meta[r, NLRU] -= 1


@compiled
def pop_oldest(m, r):
    """Remove the oldest key of set ``r``'s LRU list from the set; its slot (now free)."""
    s = m[5][r, HEAD]
    unlink(m, r, s)
    remove(m, r, s)
    return s


@compiled
def clear(m, r):
    """Empty set ``r``."""
    table, free, meta = m[0], m[4], m[5]
    table[r, :] = 0
    n = free.shape[1]
    for i in range(n):
        free[r, i] = n - 1 - i
    meta[r, NFREE], meta[r, HEAD], meta[r, TAIL], meta[r, NLRU], meta[r, SIZE] = n, -1, -1, 0, 0
