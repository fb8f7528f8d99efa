"""First come, first served: the queue in arrival order; a running job is never paused."""

from __future__ import annotations

from sim.diffusion.policies.base import Policy


class FCFSPolicy(Policy):
    """Jobs start in the order they arrived (a paused or restarted job keeps its place)."""

    name = "fcfs"

    def key(self, unit) -> tuple:
        """Arrival order."""
        return (unit.seq,)
