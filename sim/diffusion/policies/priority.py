"""Priority classes: the most urgent class first (the lowest ``priority`` value, as vLLM's
priority scheduling), arrival order within a class; with ``cluster.preemption`` a job that
cannot start pauses less urgent running jobs at their next step boundary."""

from __future__ import annotations

from sim.diffusion.policies.base import NodeView, Policy


class PriorityPolicy(Policy):
    """Priority order, with optional step-boundary preemption of less urgent gangs."""

    name = "priority"

    def __init__(self, preemption: bool = True) -> None:
        self.preemptive = bool(preemption)

    def key(self, unit) -> tuple:
        """Priority value (lower first), then arrival order."""
        return (unit.priority, unit.seq)

    def victims(self, unit, need: int, nodes: list[NodeView]) -> list:
        """On the node where it takes the fewest pauses, the least urgent running gangs
        (then the most recently started) whose GPUs, with the free and draining ones, make
        ``need``; only gangs strictly less urgent than ``unit``."""
        best: list = []
        for v in nodes:
            have = v.free + v.draining
            if have >= need:
                return []  # GPUs are already on their way: wait for them
            lower = sorted((u for u in v.running if u.priority > unit.priority),
                           key=lambda u: (-u.priority, -u.run_start))
            chosen = []
            for u in lower:
                chosen.append(u)
                have += u.gpus
                if have >= need:
                    break
            if have >= need and (not best or len(chosen) < len(best)):
                best = chosen
        return best
