"""Waiting queues ordered by a per-request key instead of arrival order.

vLLM's ``PriorityRequestQueue`` (``vllm/v1/core/sched/request_queue.py``) is a heap of
requests ordered by ``(priority, arrival_time)``; a preempted request goes back into the heap
at its place rather than to the front. ``KeyedQueue`` is that heap over request ids, with the
same methods as the ``deque`` the FCFS policies use (``append``, ``appendleft``, ``popleft``,
``[0]``), so one scheduling loop serves both.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator


class KeyedQueue:
    """Request ids served smallest ``key(rid)`` first; the key is read when a request is
    queued (so a deadline computed from the arrival time is fixed by then)."""

    def __init__(self, key: Callable[[int], tuple]) -> None:
        self.key = key
        self._heap: list[tuple] = []

    def append(self, rid: int) -> None:
        """Queue ``rid`` at the place its key gives it."""
        heapq.heappush(self._heap, (*self.key(rid), int(rid)))

    # a preempted request is re-queued by key, as vLLM's priority queue does
    appendleft = append

    def popleft(self) -> int:
        """Remove and return the most urgent request."""
        return heapq.heappop(self._heap)[-1]

    def __getitem__(self, i: int) -> int:
        if i != 0:
            raise IndexError("only the head of a KeyedQueue can be read")
        return self._heap[0][-1]

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self) -> Iterator[int]:
        """Request ids in service order (a sorted copy; for tests and inspection)."""
        return (entry[-1] for entry in sorted(self._heap))
