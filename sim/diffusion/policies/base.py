"""What a diffusion queueing policy is, and the queue it orders.

A policy is a plain object: ``key(unit)`` orders the queue (smallest first) and, for a
preemptive policy, ``victims(unit, need, nodes)`` names the running gangs to pause so that
``unit`` can start. The pool (``sim.diffusion.pool``) owns time and GPUs; a policy never
touches the clock.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sim.diffusion.unit import Unit


@dataclass
class NodeView:
    """One node as a preemptive policy sees it: GPUs free now, GPUs that gangs already asked
    to pause will free at their next step boundary, and the gangs it could pause."""

    node: int
    free: int
    draining: int
    running: list = field(default_factory=list)  # Units that may be paused


class Policy:
    """Base of the policies: first come, first served order, never preempts."""

    name = "fcfs"
    preemptive = False

    def key(self, unit) -> tuple:
        """Sort key of a queued unit: smallest starts first."""
        return (unit.seq,)

    def victims(self, unit, need: int, nodes: list[NodeView]) -> list:
        """Running units to pause so that ``unit`` gets ``need`` GPUs of one node (empty:
        none, or it cannot be done)."""
        return []


class JobQueue:
    """Queued units in a policy's order: a heap with lazy removal (a unit merged into a
    batch, or failed while queued, is skipped when it reaches the top)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._heap: list[tuple] = []
        self._live: set[int] = set()  # ids (``Unit.uid``) of the units in the queue

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, unit) -> bool:
        return unit.uid in self._live

    def push(self, unit) -> None:
        """Queue ``unit`` (its key is taken now)."""
        self._live.add(unit.uid)
        heapq.heappush(self._heap, (self.policy.key(unit), unit.uid, unit))

    def remove(self, unit) -> None:
        """Take ``unit`` out of the queue (it stays in the heap until it reaches the top)."""
        self._live.discard(unit.uid)

    def peek(self) -> Unit | None:
        """The unit that would start next, or None."""
        heap = self._heap
        while heap and heap[0][1] not in self._live:
            heapq.heappop(heap)
        return heap[0][2] if heap else None

    def pop(self) -> Unit:
        """Remove and return the unit that starts next (the queue must not be empty)."""
        unit = self.peek()
        heapq.heappop(self._heap)
        self._live.discard(unit.uid)
        return unit

    def units(self) -> list:
        """Every queued unit, in no particular order."""
        return [u for _, uid, u in self._heap if uid in self._live]
