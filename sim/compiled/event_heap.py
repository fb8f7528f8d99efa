"""The compiled loop's event queues: binary heaps over three arrays (times, creation stamps,
items), ordered by time and then stamp, as SimPy orders the events due at one time by when
they were created (``sim.compiled.kernel`` keeps the busy replicas' step ends and the clients'
follow-ups in them)."""

from __future__ import annotations

from sim.compiled.jit import compiled


@compiled
def before(t1, s1, t2, s2):
    """Whether the event (time ``t1``, stamp ``s1``) comes before (``t2``, ``s2``)."""
    return t1 < t2 or (t1 == t2 and s1 < s2)


@compiled
def insert(heap, st, size, time, stamp, item):
    """Add ``item`` due at (``time``, ``stamp``) to a binary heap of three arrays (times,
    stamps, items) whose length is ``st[size]``."""
    heap_t, heap_s, heap_r = heap
    i = st[size]
    st[size] += 1
    while i > 0:
        p = (i - 1) // 2
        if before(heap_t[p], heap_s[p], time, stamp):
            break
        heap_t[i], heap_s[i], heap_r[i] = heap_t[p], heap_s[p], heap_r[p]
        i = p
    heap_t[i], heap_s[i], heap_r[i] = time, stamp, item


@compiled
def remove_first(heap, st, size):
    """Remove the first entry (smallest time, then stamp) of a heap of ``insert``."""
    heap_t, heap_s, heap_r = heap
    n = st[size] - 1
    st[size] = n
    time, stamp, item = heap_t[n], heap_s[n], heap_r[n]
    i = 0
    while 2 * i + 1 < n:
        c = 2 * i + 1
        if c + 1 < n and before(heap_t[c + 1], heap_s[c + 1], heap_t[c], heap_s[c]):
            c += 1
        if not before(heap_t[c], heap_s[c], time, stamp):
            break
        heap_t[i], heap_s[i], heap_r[i] = heap_t[c], heap_s[c], heap_r[c]
        i = c
    heap_t[i], heap_s[i], heap_r[i] = time, stamp, item
