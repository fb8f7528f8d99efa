"""``jsq_tokens``: join the shortest queue measured in tokens: the replica with the fewest
tokens still to put in its KV cache (unprefilled prompts and recomputes, one per decoding
request), ties broken by outstanding requests. Only prompt lengths are used, as a real
router knows them; output lengths are unknown until the requests end."""

from __future__ import annotations

import numpy as np

from sim.routers.base import Router, first_min


class JsqTokensRouter(Router):
    """Join the replica with the least queued prefill work."""

    name = "jsq_tokens"

    def choose(self, rid: int) -> int:
        """The replica that is up with the fewest queued tokens."""
        v = self.view
        ids = v.alive_ids
        if len(ids) == 1:
            return int(ids[0])
        tokens = np.array([v.queued_tokens(int(r)) for r in ids])
        return first_min(ids, tokens, v.outstanding[ids])
