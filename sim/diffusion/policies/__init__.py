"""Queueing policies of the diffusion node pool, selected by ``cluster.policy``."""

from sim.diffusion.policies.base import JobQueue, NodeView, Policy
from sim.diffusion.policies.fcfs import FCFSPolicy
from sim.diffusion.policies.priority import PriorityPolicy
from sim.diffusion.policies.sjf import SJFPolicy

POLICIES = {"fcfs": FCFSPolicy, "sjf": SJFPolicy, "priority": PriorityPolicy}


def build_policy(name: str, preemption: bool = True) -> Policy:
    """The policy ``cluster.policy`` names (``preemption`` only matters to ``priority``)."""
    return PriorityPolicy(preemption) if name == "priority" else POLICIES[name]()


__all__ = ["POLICIES", "FCFSPolicy", "JobQueue", "NodeView", "Policy", "PriorityPolicy",
           "SJFPolicy", "build_policy"]
