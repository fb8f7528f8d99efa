"""What a router sees of its pool of replicas, and the interface every routing policy has.

A router is a plain object (no clock): ``choose(rid)`` names the replica (an index into the
pool) that request ``rid`` goes to, among the replicas that are up. The pool's owner keeps
the view current: ``outstanding`` (requests routed to a replica and not finished there) and
which replicas are up; ``schedulers`` are the replicas' schedulers, whose queues and KV
caches load-aware policies read through the methods below.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from sim.state import RequestTable


class PoolView:
    """Load and liveness of the replicas of one pool, as a router may read them."""

    def __init__(self, schedulers: list, table: RequestTable,
                 hash_ids: np.ndarray | None = None, kv_tokens: int = 0,
                 used_blocks: Callable[[int], int] | None = None,
                 waiting_ids: Callable[[int], np.ndarray] | None = None) -> None:
        """``schedulers``: one per replica (the owner replaces an entry when a replica is
        rebuilt); ``hash_ids``: per request, a tuple of prefix-block hashes (or None);
        ``kv_tokens``: tokens one replica's KV cache holds; ``used_blocks(r)``: KV blocks
        replica ``r`` uses now and ``waiting_ids(r)``: the ids its scheduler has waiting
        (default: what its KV cache and scheduler say)."""
        n = len(schedulers)
        self.schedulers = schedulers
        self.used_blocks = used_blocks or (lambda r: self.schedulers[r].kv.used_blocks)
        self.waiting_ids = waiting_ids or (lambda r: queued_ids(self.schedulers[r]))
        self.table = table
        self.hash_ids = hash_ids
        self.kv_tokens = int(kv_tokens)
        self.outstanding = np.zeros(n, np.int64)
        self.alive = np.ones(n, bool)
        self.alive_ids = np.arange(n)

    @property
    def size(self) -> int:
        """Replicas in the pool, up or down."""
        return len(self.schedulers)

    def set_alive(self, r: int, up: bool) -> None:
        """Mark replica ``r`` up or down."""
        self.alive[r] = up
        self.alive_ids = np.flatnonzero(self.alive)

    def _queued(self, r: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids running, ids waiting) on replica ``r``."""
        return self.schedulers[r].running, self.waiting_ids(r)

    def queued_tokens(self, r: int) -> int:
        """Tokens replica ``r`` has yet to put in its KV cache for the requests it holds
        (unprefilled prompt and recompute tokens; 1 per request in decode)."""
        t = self.table
        running, waiting = self._queued(r)
        ids = np.concatenate([running, waiting]) if len(waiting) else running
        return int((t.num_tokens[ids] - t.computed[ids]).sum())

    def projected_kv_usage(self, r: int) -> float:
        """KV usage of replica ``r`` once its waiting requests are admitted: blocks in use
        plus the blocks their known tokens need, over the cache's blocks."""
        kv = self.schedulers[r].kv
        _, waiting = self._queued(r)
        t = self.table
        need = int(kv.blocks_for(t.num_tokens[waiting]).sum()) if len(waiting) else 0
        return (self.used_blocks(r) + need) / max(kv.num_blocks, 1)


def queued_ids(scheduler) -> np.ndarray:
    """The ids in ``scheduler``'s waiting queue, in its order."""
    return np.fromiter(scheduler.waiting, np.int64, len(scheduler.waiting))


def first_min(ids: np.ndarray, *keys: np.ndarray) -> int:
    """The replica of ``ids`` with the smallest first key, ties broken by the next keys,
    then by position in ``ids``."""
    order = np.lexsort(tuple(reversed(keys)))
    return int(ids[order[0]])


class Router:
    """Base of routing policies; ``choose`` is called only while some replica is up."""

    name = ""  # the option of cluster.router this class is (sim.routers.ROUTERS)

    def __init__(self, view: PoolView, rng: np.random.Generator, cfg) -> None:
        """``rng``: this pool's routing stream; ``cfg``: the cluster config (router options)."""
        self.view, self.rng, self.cfg = view, rng, cfg

    def choose(self, rid: int) -> int:
        """The replica (index into the pool) that request ``rid`` goes to."""
        raise NotImplementedError

    def forget(self, r: int) -> None:
        """Replica ``r`` lost its state (it failed); drop what the router believed of it."""
