"""``least_outstanding``: the replica with the fewest requests routed to it and not yet
finished (join-the-shortest-queue by request count; SGLang router's and vLLM
production-stack's "least loaded"). Ties go to the replicas in turn."""

from __future__ import annotations

from sim.routers.base import Router


class LeastOutstandingRouter(Router):
    """Join the replica with the fewest outstanding requests."""

    name = "least_outstanding"

    _turn = 0

    def choose(self, rid: int) -> int:
        """The least-loaded replica that is up."""
        ids = self.view.alive_ids
        out = self.view.outstanding[ids]
        best = ids[out == out.min()]
        self._turn += 1
        return int(best[self._turn % len(best)])
