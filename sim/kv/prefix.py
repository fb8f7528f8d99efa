"""Prefix caching: hash-identified full blocks, reference counts and LRU eviction.

As vLLM's ``BlockPool`` with ``enable_prefix_caching``: a full block is named by a hash
chained from its parent block, so two requests share a block exactly as far as their prefixes
agree. A block stays cached while a request references it; when the last reference goes it is
kept (still cached, but free to be reused) at the tail of an LRU queue, and an allocation that
finds no empty block evicts the least recently freed one. The pool works on hashes and counts
only: which physical block holds what does not change any cost in this model.

Every operation is O(blocks touched): a lookup walks the request's hashes until the first miss,
freeing touches the blocks the request referenced.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

# odd 64-bit multiplier that spreads a block's index into its chained hash (splitmix64's)
_MIX = np.int64(-7046029254386353131)


def block_hashes(hash_ids, num_tokens: int, trace_block: int, block_size: int) -> list[int]:
    """Chained hashes of the full engine blocks of a prompt named by ``hash_ids``.

    ``hash_ids[i]`` names the ``i``-th ``trace_block``-token block of the prompt (Mooncake:
    512). Engine block ``j`` (``block_size`` tokens) is named by the chain of trace ids up to
    the trace block holding its last token, and by ``j``: two prompts get the same hash for
    block ``j`` only if their ids agree up to there. Only blocks that lie wholly inside the
    first ``num_tokens`` tokens and inside the named blocks get a hash.
    """
    full = min(int(num_tokens), len(hash_ids) * trace_block) // block_size
    if full <= 0:
        return []
    j = np.arange(full, dtype=np.int64)
    last = ((j + 1) * block_size - 1) // trace_block
    return (id_chain(hash_ids)[last] ^ ((j + 1) * _MIX)).tolist()


def id_chain(hash_ids) -> np.ndarray:
    """The chain of ``hash_ids``: element ``i`` names ids 0 … i (``block_hashes``)."""
    chain = np.empty(len(hash_ids), np.int64)
    h = 0
    for i, hid in enumerate(hash_ids):
        h = hash((h, int(hid)))
        chain[i] = h
    return chain


def own_ids(rid: int) -> tuple[int]:
    """The one id naming the whole of a request whose content no other request shares:
    ``-2 - rid``, which no trace id (never negative) can be (not ``-1 - rid``: Python hashes
    -1 as -2)."""
    return (-2 - int(rid),)


class PrefixPool:
    """The cached blocks of one replica: reference counts and the LRU of free cached blocks.

    ``refs[h]`` is how many running requests reference the cached block ``h`` (0 when it is
    free but still cached, then it is also in ``lru``). The owner (``PagedKVCache``) counts
    empty blocks; a free cached block counts as free there too, and ``evict`` makes room.
    """

    def __init__(self) -> None:
        self.refs: dict[int, int] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self.refs)

    def match(self, hashes: list[int], max_blocks: int) -> int:
        """How many leading blocks of ``hashes`` (at most ``max_blocks``) are cached."""
        refs = self.refs
        n = 0
        for h in hashes[:max_blocks]:
            if h not in refs:
                break
            n += 1
        return n

    def touch(self, hashes: list[int]) -> int:
        """Reference every block of ``hashes`` (all cached); the count that were free (they
        leave the LRU and are in use again)."""
        refs, lru = self.refs, self.lru
        revived = 0
        for h in hashes:
            r = refs[h]
            if r == 0:
                del lru[h]
                revived += 1
            refs[h] = r + 1
        return revived

    def insert(self, h: int) -> bool:
        """A request computed the block ``h`` and references it. False if ``h`` was cached
        already (the request then references that copy and its own block is surplus)."""
        r = self.refs.get(h)
        if r is None:
            self.refs[h] = 1
            return True
        if r == 0:
            del self.lru[h]
        self.refs[h] = r + 1
        return False

    def insert_many(self, hashes: list[int]) -> int:
        """``insert`` each of ``hashes``; how many were cached already and referenced by
        another request too (then the caller's own copy is surplus)."""
        refs, lru = self.refs, self.lru
        surplus = 0
        for h in hashes:
            r = refs.get(h)
            if r is None:
                refs[h] = 1
                continue
            if r == 0:
                del lru[h]
            else:
                surplus += 1
            refs[h] = r + 1
        return surplus

    def release(self, hashes: list[int]) -> int:
        """Drop one reference to each of ``hashes``; the count that became free. The last
        block of a prefix is queued first, so a prefix is evicted from its tail inwards."""
        refs, lru = self.refs, self.lru
        freed = 0
        for h in reversed(hashes):
            r = refs[h] - 1
            refs[h] = r
            if r == 0:
                lru[h] = None
                freed += 1
        return freed

    def evict(self, n: int) -> list[int]:
        """Forget the ``n`` least recently freed cached blocks (caller checked there are
        ``n``); their hashes, oldest first."""
        out = []
        lru, refs = self.lru, self.refs
        for _ in range(n):
            h, _ = lru.popitem(last=False)
            del refs[h]
            out.append(h)
        return out
