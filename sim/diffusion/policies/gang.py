"""How many GPUs a job gets, and on which node: fixed gangs, or elastic gangs sized by the
queue and the job's parallel efficiency.

- Fixed (``cluster.elastic=false``): every job takes ``cluster.gpus_per_job`` GPUs.
- Elastic: gang sizes are the powers of two up to ``hardware.gpus_per_node`` and the whole
  node; a size is valid when the cost model has a plan for the job's shape on it. With one
  job or fewer waiting, the job takes the largest valid gang that fits a node's free GPUs
  (its fastest plan: nothing else wants the GPUs). With more waiting, it takes the largest
  valid size whose parallel efficiency ``T(1) / (g × T(g))`` (its time on the smallest valid
  size over ``g`` times its time on ``g`` GPUs, from the cost model) is at least
  ``cluster.elastic_efficiency``, capped by the free GPUs of a node: a job that scales well
  (a video, ≈97 % on 8 GPUs) keeps a whole node, one that does not (an image) gets 1–2 GPUs
  and leaves the rest to the queue.

Either way the node is the best fit: the one with the fewest free GPUs that still holds the
gang (then the lowest id), so large holes stay open for large gangs; a gang never spans nodes.
"""

from __future__ import annotations

from collections.abc import Callable

DEFAULT_EFFICIENCY = 0.8


def node_sizes(gpus_per_node: int) -> list[int]:
    """Gang sizes a node splits into: powers of two up to the node, and the whole node."""
    return sorted({1 << i for i in range(gpus_per_node.bit_length())
                   if 1 << i <= gpus_per_node} | {gpus_per_node})


def best_fit(free, gpus: int) -> int:
    """The node with the fewest free GPUs that still holds ``gpus`` (−1: none); ``free`` is
    a sequence of free GPUs per node (a plain loop: pools have few nodes)."""
    best, node = None, -1
    for n, f in enumerate(free):
        if f >= gpus and (best is None or f < best):
            best, node = f, n
    return node


class GangSizer:
    """Chooses a queued job's gang size and node from the free GPUs and the queue."""

    def __init__(self, gpus_per_node: int, gpus_per_job: int, elastic: bool,
                 efficiency: float = DEFAULT_EFFICIENCY) -> None:
        self.elastic = bool(elastic)
        self.efficiency = float(efficiency)
        self.sizes = node_sizes(gpus_per_node) if elastic else [int(gpus_per_job)]

    def need(self, valid: Callable[[int], bool]) -> int | None:
        """The fewest GPUs the job can start on (None: no valid size)."""
        ok = [g for g in self.sizes if valid(g)]
        return ok[0] if ok else None

    def target(self, time_on: Callable[[int], float | None]) -> int | None:
        """The largest valid size whose parallel efficiency is at least ``efficiency``
        (``time_on(g)``: the job's time on ``g`` GPUs, None when no plan of ``g`` runs it);
        None when no size is valid."""
        times = [(g, t) for g in self.sizes if (t := time_on(g)) is not None]
        if not times:
            return None
        g0, t0 = times[0]
        ok = [g for g, t in times if t > 0 and g0 * t0 / (g * t) >= self.efficiency - 1e-12]
        return ok[-1] if ok else g0

    def place(self, free, queued: int, valid: Callable[[int], bool],
              target: int | None = None) -> tuple[int, int] | None:
        """``(node, gpus)`` for the job at the head of a queue of ``queued`` jobs, given each
        node's free GPUs (a sequence; 0 for a node that is down) and, when elastic, its
        ``target`` size under load (``target``; None: the smallest valid size); None when it
        cannot start now."""
        most = max(free, default=0)
        fitting = [g for g in self.sizes if g <= most and valid(g)]
        if not fitting:
            return None
        if not self.elastic:
            g = fitting[0]
        elif queued <= 1:
            g = fitting[-1]
        else:
            under = [g for g in fitting if g <= (target or fitting[0])]
            g = under[-1] if under else fitting[0]
        return best_fit(free, g), g
