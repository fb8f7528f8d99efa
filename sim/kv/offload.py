"""Host-memory tier of the prefix cache (vLLM's ``--kv-offloading-size`` / LMCache's CPU tier).

Cached blocks evicted from the GPU are kept in host memory, least recently used dropped first
when the tier is full; a later prefix hit on them copies them back over PCIe instead of
recomputing their tokens. The tier holds hashes only, like ``sim.kv.prefix.PrefixPool``.
"""

from __future__ import annotations

from collections import OrderedDict


class HostTier:
    """A bounded LRU of block hashes held in host memory."""

    def __init__(self, num_blocks: int) -> None:
        """``num_blocks``: how many blocks the host tier holds."""
        self.num_blocks = int(num_blocks)
        self.blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self.blocks)

    def put(self, hashes: list[int]) -> None:
        """Keep blocks evicted from the GPU (most recent last), dropping the oldest beyond
        the capacity."""
        blocks = self.blocks
        for h in hashes:
            blocks[h] = None
            blocks.move_to_end(h)
        while len(blocks) > self.num_blocks:
            blocks.popitem(last=False)

    def match(self, hashes: list[int]) -> int:
        """How many leading blocks of ``hashes`` the tier holds; they become most recent."""
        n = 0
        for h in hashes:
            if h not in self.blocks:
                break
            self.blocks.move_to_end(h)
            n += 1
        return n
