"""``kv_aware``: the replica with the lowest KV-cache usage (AIBrix's ``least-kv-cache``,
llm-d's KV-utilization scorer), counting the blocks its waiting requests will need so
that a burst does not all land on the same replica; ties by outstanding requests."""

from __future__ import annotations

import numpy as np

from sim.routers.base import Router, first_min


class KvAwareRouter(Router):
    """Route to the replica with the most free KV cache."""

    name = "kv_aware"

    def choose(self, rid: int) -> int:
        """The replica that is up with the lowest projected KV usage."""
        v = self.view
        ids = v.alive_ids
        if len(ids) == 1:
            return int(ids[0])
        usage = np.array([v.projected_kv_usage(int(r)) for r in ids])
        return first_min(ids, usage, v.outstanding[ids])
