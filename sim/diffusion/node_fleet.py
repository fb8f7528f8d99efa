"""The diffusion nodes of ``cluster=diffusion`` as the autoscaler (``sim.engine.autoscaler``)
sees and moves them: a node takes gangs or not, holds its running gangs, reports its
completed jobs' latencies, comes up empty and goes off once drained.

The policies' metrics over the ready nodes: ``queue``, the jobs waiting in the pool's queue
(one queue for the pool: each ready node's share summed is the queue); ``running``, the gangs
running on them. A new node reads the weights of every pipeline the workload names on each of
its GPUs (``sim.diffusion.memory.pipeline_bytes``; none under ``job_cost=constant``, which
has no pipeline).
"""

from __future__ import annotations

import numpy as np

from sim.diffusion.memory import pipeline_bytes


class NodeFleet:
    """The nodes of ``pool`` (a ``NodePool``) for an ``Autoscaler``."""

    def __init__(self, pool) -> None:
        self.pool = pool
        self.size = pool.n
        self.gpus_per_unit = pool.G
        pipeline = getattr(pool.cost, "pipeline", None)  # the roofline cost model's
        models = sorted({shape.model for shape in pool.shapes})
        self.weight_bytes_per_gpu = (sum(pipeline_bytes(pipeline(m)) for m in models)
                                     if pipeline is not None else 0.0)

    def attach(self, scaler) -> None:
        """Report completed jobs and gangs that left a node to ``scaler``."""
        self.pool.autoscaler = scaler

    def routable(self, r: int, on: bool) -> None:
        self.pool.accepting[r] = on

    def outstanding(self, r: int) -> int:
        return len(self.pool.running[r])

    def waiting(self, ready: np.ndarray) -> int:
        """Jobs queued or in an open batch (the pool's one queue)."""
        p = self.pool
        return sum(len(u.ids) for u in p.queue.units()) + sum(
            len(u.ids) for u in p.batcher.forming.values())

    def metric(self, policy: str, ready: np.ndarray) -> float:
        """The policy's metric summed over the ``ready`` nodes."""
        if policy == "queue":
            return float(self.waiting(ready))
        return float(sum(len(self.pool.running[int(r)]) for r in ready))

    def bring_up(self, r: int) -> None:
        self.pool.bring_up(r)

    def shut_down(self, r: int) -> None:
        self.pool.shut_down(r)
