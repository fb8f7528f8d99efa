"""``random``: a replica drawn uniformly among those that are up, from the run's routing
stream (its own child of the run's SeedSequence, so arrivals do not change with it)."""

from __future__ import annotations

from sim.routers.base import Router


class RandomRouter(Router):
    """Uniformly random routing: the baseline of load-aware policies."""

    name = "random"

    def choose(self, rid: int) -> int:
        """A random replica that is up."""
        ids = self.view.alive_ids
        return int(ids[self.rng.integers(len(ids))])
