"""``power_of_two``: two distinct replicas drawn at random, the one with fewer outstanding
requests wins (Mitzenmacher's power of two choices); draws come from the routing stream."""

from __future__ import annotations

from sim.routers.base import Router


class PowerOfTwoRouter(Router):
    """The less loaded of two random replicas."""

    name = "power_of_two"

    def choose(self, rid: int) -> int:
        """The less loaded of two distinct random replicas that are up."""
        ids = self.view.alive_ids
        n = len(ids)
        if n == 1:
            return int(ids[0])
        i, j = self.rng.integers(0, (n, n - 1))
        j += j >= i  # distinct from i
        a, b = int(ids[i]), int(ids[j])
        out = self.view.outstanding
        return b if out[b] < out[a] else a
