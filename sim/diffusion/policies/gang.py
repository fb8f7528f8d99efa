"""How many GPUs a job gets, and on which node: fixed gangs, or elastic splitting of nodes.

- Fixed (``cluster.elastic=false``): every job takes ``cluster.gpus_per_job`` GPUs.
- Elastic: the free GPUs of the cluster are shared evenly among the queued jobs, in the
  gang sizes a node splits into (powers of two up to ``hardware.gpus_per_node``, and the
  whole node): a job gets the largest valid size at most ``free GPUs / queued jobs`` (at least
  one GPU) that fits on a node. An idle cluster with one job queued gives it a whole node (its
  fastest plan); two jobs on an idle node get 4 GPUs each; a long queue, 1 GPU each. A size
  is valid when the cost model has a plan for the job's shape on it.

Either way the node is the best fit: the one with the fewest free GPUs that still holds the
gang (then the lowest id), so large holes stay open for large gangs; a gang never spans nodes.
"""

from __future__ import annotations

from collections.abc import Callable


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

    def __init__(self, gpus_per_node: int, gpus_per_job: int, elastic: bool) -> None:
        self.elastic = bool(elastic)
        self.sizes = node_sizes(gpus_per_node) if elastic else [int(gpus_per_job)]

    def need(self, valid: Callable[[int], bool]) -> int | None:
        """The fewest GPUs the job can start on (None: no valid size)."""
        ok = [g for g in self.sizes if valid(g)]
        return ok[0] if ok else None

    def place(self, free, queued: int,
              valid: Callable[[int], bool]) -> tuple[int, int] | None:
        """``(node, gpus)`` for the job at the head of a queue of ``queued`` jobs, given each
        node's free GPUs (a sequence; 0 for a node that is down); None when it cannot start
        now."""
        most = max(free, default=0)
        fitting = [g for g in self.sizes if g <= most and valid(g)]
        if not fitting:
            return None
        if self.elastic:
            share = max(1, int(sum(free)) // max(1, queued))
            under = [g for g in fitting if g <= share]
            g = under[-1] if under else fitting[0]
        else:
            g = fitting[0]
        return best_fit(free, g), g
