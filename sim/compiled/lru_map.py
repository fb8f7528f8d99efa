"""Sets of int64 keys in compiled code, one per replica, each with an LRU order: what a Python
``dict`` and ``OrderedDict`` are to the prefix cache (``sim.kv.prefix.PrefixPool``) and to
``prefix_affinity``'s index, as fixed arrays the compiled loop can use without allocating.

A set holds at most ``slots`` keys. Each key has a slot (0 … slots − 1) found through an
open-addressing table (linear probing, twice the slots or more, deletion by backward shift),
and a slot can be linked into the set's LRU list (oldest at the head). ``m`` is
``(table, slots, meta)``: per set a row of the table (slot + 1, 0: empty), of the slots'
fields (``KEY``, ``PREV``, ``NEXT``, ``FREE`` — the stack of free slots — and the owner's
own columns after them) and of its meta fields. Three arrays, not one per field: the loop
passes its state to every call, and each array it passes costs (``sim.compiled.core``).
"""

from __future__ import annotations

import numpy as np

from sim.compiled.jit import compiled

KEY, PREV, NEXT, FREE = range(4)  # a slot's fields; an owner's own columns follow
NFREE, HEAD, TAIL, NLRU, SIZE, SHIFT = range(6)  # a set's meta fields
_GOLD = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing's multiplier


def lru_maps(sets: int, slots: int, columns: int = 0) -> tuple:
    """``sets`` empty sets of at most ``slots`` keys each, with ``columns`` more int64 fields
    per slot for their owner."""
    slots = max(int(slots), 1)
    bits = max(int(2 * slots - 1).bit_length(), 1)
    fields = np.zeros((sets, slots, 4 + columns), np.int64)
    fields[:, :, PREV] = fields[:, :, NEXT] = -1
    fields[:, :, FREE] = np.arange(slots - 1, -1, -1)
    meta = np.zeros((sets, 6), np.int64)
    meta[:, NFREE] = slots
    meta[:, HEAD] = meta[:, TAIL] = -1
    meta[:, SHIFT] = 64 - bits
    return np.zeros((sets, 1 << bits), np.int64), fields, meta


@compiled
def _home(key, m, r):
    return np.int64((np.uint64(key) * _GOLD) >> np.uint64(m[2][r, SHIFT]))


@compiled
def find(m, r, key):
    """The slot of ``key`` in set ``r``, or −1."""
    table, f = m[0], m[1]
    mask = table.shape[1] - 1
    p = _home(key, m, r)
    while True:
        s = table[r, p] - 1
        if s < 0:
            return -1
        if f[r, s, KEY] == key:
            return s
        p = (p + 1) & mask


@compiled
def add(m, r, key):
    """Put ``key`` (not in set ``r``) in a free slot, unlinked; its slot."""
    table, f, meta = m
    if meta[r, NFREE] == 0:
        raise AssertionError("an LRU map of the compiled loop is full")
    meta[r, NFREE] -= 1
    s = f[r, meta[r, NFREE], FREE]
    f[r, s, KEY] = key
    mask = table.shape[1] - 1
    p = _home(key, m, r)
    while table[r, p]:
        p = (p + 1) & mask
    table[r, p] = s + 1
    meta[r, SIZE] += 1
    return s


@compiled
def remove(m, r, s):
    """Take slot ``s``'s key (unlinked) out of set ``r``; the slot is free again."""
    table, f, meta = m
    mask = table.shape[1] - 1
    p = _home(f[r, s, KEY], m, r)
    while table[r, p] - 1 != s:
        p = (p + 1) & mask
    table[r, p] = 0
    j = p
    while True:  # backward shift: close the gap for the keys probed past it
        j = (j + 1) & mask
        t = table[r, j] - 1
        if t < 0:
            break
        h = _home(f[r, t, KEY], m, r)
        if (j > p and (h <= p or h > j)) or (j < p and h <= p and h > j):
            table[r, p] = t + 1
            table[r, j] = 0
            p = j
    f[r, meta[r, NFREE], FREE] = s
    meta[r, NFREE] += 1
    meta[r, SIZE] -= 1


@compiled
def link(m, r, s):
    """Slot ``s`` becomes the newest of set ``r``'s LRU list."""
    f, meta = m[1], m[2]
    tail = meta[r, TAIL]
    f[r, s, PREV], f[r, s, NEXT] = tail, -1
    if tail >= 0:
        f[r, tail, NEXT] = s
    else:
        meta[r, HEAD] = s
    meta[r, TAIL] = s
    meta[r, NLRU] += 1


@compiled
def unlink(m, r, s):
    """Take slot ``s`` out of set ``r``'s LRU list."""
    f, meta = m[1], m[2]
    a, b = f[r, s, PREV], f[r, s, NEXT]
    if a >= 0:
        f[r, a, NEXT] = b
    else:
        meta[r, HEAD] = b
    if b >= 0:
        f[r, b, PREV] = a
    else:
        meta[r, TAIL] = a
    meta[r, NLRU] -= 1


@compiled
def pop_oldest(m, r):
    """Remove the oldest key of set ``r``'s LRU list from the set; its slot (now free)."""
    s = m[2][r, HEAD]
    unlink(m, r, s)
    remove(m, r, s)
    return s
