"""``prefix_affinity``: send a request where the longest prefix of its prompt is likely
cached, unless that replica is too loaded (SGLang's cache-aware router, llm-d's
prefix-cache scorer).

Like those routers, it keeps an approximate index per replica instead of asking the
engines: an LRU of the prefix-block hashes (a trace's ``hash_ids``, chained so that one
hash names its whole prefix) of the requests it sent there, sized to what the replica's KV
cache holds (``cluster.prefix_index_blocks``, by default the cache's tokens over
``cluster.prefix_block_tokens``). Among the replicas that are up and have at most
``cluster.router_load_cap`` more outstanding requests than the least loaded one, the
longest matched prefix wins (ties: fewer outstanding); with no match anywhere the request
goes to the least loaded replica. Without ``hash_ids`` in the workload this router is
``least_outstanding``.
"""

from __future__ import annotations

from collections import OrderedDict

from sim.routers.base import PoolView, Router
from sim.routers.least_outstanding import LeastOutstandingRouter


class PrefixAffinityRouter(Router):
    """Longest cached prefix, within a load cap."""

    name = "prefix_affinity"

    def __init__(self, view: PoolView, rng, cfg) -> None:
        super().__init__(view, rng, cfg)
        self.fallback = LeastOutstandingRouter(view, rng, cfg)
        self.load_cap = int(cfg.router_load_cap)
        blocks = cfg.prefix_index_blocks
        if blocks is None:
            blocks = view.kv_tokens // int(cfg.prefix_block_tokens)
        self.capacity = max(1, int(blocks))
        self.index: list[OrderedDict] = [OrderedDict() for _ in range(view.size)]

    def choose(self, rid: int) -> int:
        """The replica with the longest indexed prefix of ``rid`` within the load cap."""
        v = self.view
        hashes = () if v.hash_ids is None else v.hash_ids[rid]
        if not hashes:
            return self.fallback.choose(rid)
        ids = v.alive_ids
        out = v.outstanding
        limit = out[ids].min() + self.load_cap
        best, best_len = -1, 0
        for r in ids:
            if out[r] > limit:
                continue
            n = self._matched(self.index[r], hashes)
            if n > best_len or (n == best_len and n and out[r] < out[best]):
                best, best_len = int(r), n
        if best < 0:
            best = self.fallback.choose(rid)
        self._remember(self.index[best], hashes)
        return best

    @staticmethod
    def _matched(index: OrderedDict, hashes: tuple) -> int:
        n = 0
        for h in hashes:
            if h not in index:
                break
            n += 1
        return n

    def _remember(self, index: OrderedDict, hashes: tuple) -> None:
        # touch the last block first so that, as in a radix tree, leaves are evicted first
        for h in reversed(hashes):
            index[h] = None
            index.move_to_end(h)
        while len(index) > self.capacity:
            index.popitem(last=False)

    def forget(self, r: int) -> None:
        """Replica ``r`` failed: its cache is empty."""
        self.index[r].clear()
