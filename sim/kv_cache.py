"""Paged KV-cache block accounting of one replica (vLLM's KVCacheManager, without prefix caching).

A request holding ``t`` tokens in the cache needs ``ceil(t / block_size)`` blocks. Only counts
are tracked: which physical block a request holds does not change any cost in this model.
As in vLLM's ``BlockPool``, one of the ``num_gpu_blocks`` is the reserved null block, so
``num_gpu_blocks − 1`` can hold tokens.

The per-request count ``held`` can be one array shared by every replica of a run
(``share_held``): a request is on one replica at a time, and a cluster of 64 replicas must
not keep 64 arrays the size of the request table.
"""

from __future__ import annotations

import numpy as np


class PagedKVCache:
    """Block accounting: allocate for new tokens, free a request, report usage."""

    def __init__(self, num_blocks: int, block_size: int, num_requests: int) -> None:
        """``num_blocks`` is vLLM's ``num_gpu_blocks`` (null block included)."""
        self.num_blocks = int(num_blocks) - 1  # usable: all but the null block
        self.block_size = int(block_size)
        self.free_blocks = self.num_blocks
        self.held = np.zeros(num_requests, np.int64)

    def share_held(self, held: np.ndarray) -> None:
        """Count blocks in ``held`` (one int64 per request, shared with other replicas of the
        run) instead of this cache's own array; only while this cache holds nothing."""
        if self.free_blocks != self.num_blocks:
            raise RuntimeError("share_held on a cache that holds blocks")
        self.held = held

    def blocks_for(self, num_tokens):
        """Blocks that hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    def fits_alone(self, num_tokens):
        """Whether a request of this many tokens (scalar or array) could ever fit in an empty
        cache."""
        return self.blocks_for(num_tokens) <= self.num_blocks

    def allocate(self, rid: int, num_computed: int, num_new: int) -> int | None:
        """Blocks for ``num_new`` more tokens of ``rid``: the count allocated, or None if full."""
        need = self.blocks_for(num_computed + num_new) - self.held[rid]
        if need <= 0:
            return 0
        if need > self.free_blocks:
            return None
        self.held[rid] += need
        self.free_blocks -= int(need)
        return int(need)

    def allocate_all(self, rids: np.ndarray, num_computed: np.ndarray, num_new: np.ndarray) -> bool:
        """All-or-nothing allocation for a batch; True if every request got its blocks."""
        need = self.blocks_for(num_computed + num_new) - self.held[rids]
        np.maximum(need, 0, out=need)
        total = int(need.sum())
        if total > self.free_blocks:
            return False
        self.held[rids] += need
        self.free_blocks -= total
        return True

    def free(self, rids) -> None:
        """Return every block of the given request(s)."""
        self.free_blocks += int(self.held[rids].sum())
        self.held[rids] = 0

    @property
    def used_blocks(self) -> int:
        """Blocks currently held by requests."""
        return self.num_blocks - self.free_blocks

    def usage(self) -> float:
        """Fraction of blocks in use."""
        return self.used_blocks / self.num_blocks if self.num_blocks else 0.0
