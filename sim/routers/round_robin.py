"""``round_robin``: replicas in turn, skipping those that are down (vLLM production-stack's
and most load balancers' default)."""

from __future__ import annotations

from sim.routers.base import Router


class RoundRobinRouter(Router):
    """Cycles over the pool's replicas."""

    name = "round_robin"

    _next = 0

    def choose(self, rid: int) -> int:
        """The next replica in turn that is up."""
        alive, n = self.view.alive, self.view.size
        for _ in range(n):
            r = self._next
            self._next = (r + 1) % n
            if alive[r]:
                return r
        raise RuntimeError("round_robin: no replica is up")
