"""Paged KV-cache block accounting of one replica (vLLM's ``KVCacheManager``).

A request holding ``t`` tokens in the cache needs ``ceil(t / block_size)`` blocks, plus, while
it holds any, its state blocks (``state_of``): ``state_blocks`` fixed ones for hybrid
linear-attention models (their recurrent state), and for sliding-window layers paged by
window the blocks of its tokens up to the window, ``window`` = ``(layers, block_layers, cap)``:
``ceil(layers × min(ceil(n / block_size), cap) / block_layers)`` for a request of ``n``
tokens, its prompt and output (budgeted by ``sim.kv.budget``). vLLM's sliding-window group
grows with the request up to the window and frees what falls out of it; the request is
charged for its longest from the start here (it briefly holds a whole prompt's blocks in vLLM
before the out-of-window ones are freed, and a prefill chunk's on top of the window). Only
counts are tracked: which physical block a request holds does not change any cost in this
model. As in vLLM's
``BlockPool``, one of the ``num_gpu_blocks`` is the reserved null block, so
``num_gpu_blocks − 1`` can hold tokens.

With prefix caching (``sim.kv.prefix``) the full blocks a request's ``hash_ids`` name are
named by chained hashes (``set_prefix_source``); ``match_prefix`` lets a request start from
the cached blocks of its prompt, ``commit`` caches the blocks a step has filled, and a freed
cached block stays cached until an allocation evicts it (LRU). ``free_blocks`` counts empty
and free cached blocks alike: both can be handed out. Blocks of generated tokens are cached
too, as far as the ids name them (vLLM v1 and SGLang hash them as well): a multi-turn
session's ids name each turn's prompt and output, so the next turn, which repeats both, hits
them; a trace's ids (Mooncake) name the prompt only, so its hits stay within prompts. A request
without ids has content no other request shares (a synthetic or random prompt): its blocks get
hashes of their own, so nothing else hits them but it can find them again itself — a request
preempted by recompute restarts from whatever of its blocks are still cached, as in vLLM, whose
preempted request's freed blocks stay in the free queue, hashed, until evicted.

The per-request count ``held`` can be one array shared by every replica of a run
(``share_held``): a request is on one replica at a time, and a cluster of 64 replicas must
not keep 64 arrays the size of the request table.
"""

from __future__ import annotations

import numpy as np

from sim.kv.offload import HostTier
from sim.kv.prefix import PrefixPool, block_hashes, own_ids
from sim.kv.swap import SwapSpace

MOONCAKE_BLOCK = 512  # tokens named by one id of a trace's ``hash_ids``


def state_blocks_for(num_tokens, block_size: int, fixed: int,
                     window: tuple[int, int, int] | None):
    """Blocks a request of ``num_tokens`` tokens (scalar or array) holds besides its KV:
    ``fixed`` ones, and with ``window`` = ``(layers, block_layers, cap)`` its sliding-window
    layers' blocks, ``ceil(layers × min(ceil(num_tokens / block_size), cap) / block_layers)``
    (module doc)."""
    if window is None:
        return fixed
    layers, block_layers, cap = window
    held = np.minimum(-(-num_tokens // block_size), cap)
    return fixed - (-layers * held // block_layers)


class PagedKVCache:
    """Block accounting: allocate for new tokens, free a request, report usage."""

    def __init__(self, num_blocks: int, block_size: int, num_requests: int,
                 state_blocks: int = 0, prefix_caching: bool = False,
                 window: tuple[int, int, int] | None = None) -> None:
        """``num_blocks`` is vLLM's ``num_gpu_blocks`` (null block included);
        ``state_blocks``: fixed blocks each request holds while it holds any; ``window``:
        its sliding-window layers' blocks (module doc; needs ``set_lengths``)."""
        self.num_blocks = int(num_blocks) - 1  # usable: all but the null block
        self.block_size = int(block_size)
        self.state_blocks = int(state_blocks)
        self.window = window
        self._prompt = self._output = None  # per request: prompt and most output tokens
        self.free_blocks = self.num_blocks
        self.held = np.zeros(num_requests, np.int64)
        self.prefix = PrefixPool() if prefix_caching else None
        self._hash_ids = None
        self._trace_block = MOONCAKE_BLOCK
        self._lengths = None  # per request: the tokens it can ever hold (its own blocks)
        self._hashes: dict[int, list[int]] = {}  # rid → its block hashes (while it holds blocks)
        self._ref: dict[int, int] = {}  # rid → leading blocks it references in the prefix pool
        self._pending: set[int] = set()  # rids with computed blocks not yet cached
        self.swap: SwapSpace | None = None  # host space of preemption by swap
        self.host: HostTier | None = None  # host tier of evicted cached blocks
        self.host_copy_time = 0.0  # seconds to copy one block from the host tier
        self.copy_s = 0.0  # host-to-GPU copies of prefix hits not yet charged to a step

    def enable_offload(self, tier: HostTier, block_copy_s: float) -> None:
        """Keep evicted cached blocks in ``tier``; a hit there costs ``block_copy_s`` each."""
        self.host, self.host_copy_time = tier, float(block_copy_s)

    def enable_swap(self, swap: SwapSpace) -> None:
        """Preempt by swapping to ``swap`` (host memory) rather than by recompute."""
        self.swap = swap

    def share_held(self, held: np.ndarray) -> None:
        """Count blocks in ``held`` (one int64 per request, shared with other replicas of the
        run) instead of this cache's own array; only while this cache holds nothing."""
        if self.free_blocks != self.num_blocks:
            raise RuntimeError("share_held on a cache that holds blocks")
        self.held = held

    def set_prefix_source(self, hash_ids, trace_block: int = MOONCAKE_BLOCK,
                          lengths: np.ndarray | None = None) -> None:
        """Name prompt blocks by ``hash_ids[rid]`` (ids of ``trace_block``-token blocks, or
        None for a request without); ``lengths[rid]``: the most tokens ``rid`` can hold
        (prompt and output), whose blocks are its own when it has no ids. With neither, no
        block is ever cached."""
        self._hash_ids, self._trace_block = hash_ids, int(trace_block)
        self._lengths = lengths

    def block_names(self, rid: int) -> tuple | None:
        """What names ``rid``'s blocks (``set_prefix_source``): ``(ids, tokens each id names,
        tokens they name)`` — its trace ids, or, without ids, the one id of its own over its
        prompt and output (``own_ids``) — or None when nothing names them."""
        ids = self._hash_ids[rid] if self._hash_ids is not None else None
        if ids is not None and len(ids):
            return ids, self._trace_block, len(ids) * self._trace_block
        if self._lengths is not None:
            tokens = int(self._lengths[rid])
            return own_ids(rid), max(tokens, 1), tokens
        return None

    def set_lengths(self, prompt: np.ndarray, max_output: np.ndarray) -> None:
        """Each request's prompt and most output tokens (the request table's columns, shared
        with it, not copied; a disaggregated prefill pool's table ends at the first token):
        how long it can grow, which sizes its sliding-window blocks."""
        self._prompt, self._output = prompt, max_output

    def blocks_for(self, num_tokens):
        """Blocks that hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    def state_for_tokens(self, num_tokens):
        """Blocks a request of ``num_tokens`` tokens (scalar or array) holds besides its KV
        while it holds any: its fixed state and its sliding-window layers' (module doc)."""
        return state_blocks_for(num_tokens, self.block_size, self.state_blocks, self.window)

    def state_of(self, rids):
        """``state_for_tokens`` of request(s) ``rids``: of the most tokens each ever caches,
        its prompt and output but the last token (as ``fits_alone`` is asked)."""
        if self.window is None:
            return self.state_blocks
        if self._prompt is None:
            raise RuntimeError("a cache paging sliding-window layers needs set_lengths")
        return self.state_for_tokens(self._prompt[rids] + self._output[rids] - 1)

    @property
    def holds_state(self) -> bool:
        """Whether requests hold blocks besides their growing KV."""
        return bool(self.state_blocks or self.window)

    def fits_alone(self, num_tokens):
        """Whether a request of this many tokens (scalar or array) could ever fit in an empty
        cache."""
        return self.blocks_for(num_tokens) + self.state_for_tokens(num_tokens) <= \
            self.num_blocks

    def _take(self, n: int) -> None:
        """Hand out ``n`` free blocks (caller checked ``n <= free_blocks``), evicting the
        least recently freed cached blocks when there are too few empty ones."""
        if self.prefix is not None:
            short = n - self.empty_blocks
            if short > 0:
                evicted = self.prefix.evict(short)
                if self.host is not None:
                    self.host.put(evicted)
        self.free_blocks -= n

    def allocate(self, rid: int, num_computed: int, num_new: int) -> int | None:
        """Blocks for ``num_new`` more tokens of ``rid``: the count allocated, or None if full."""
        held = int(self.held[rid])
        need = self.blocks_for(num_computed + num_new) - held
        if need <= 0:
            return 0
        state = int(self.state_of(rid)) if held == 0 else 0
        if need + state > self.free_blocks:
            return None
        self.held[rid] += need
        self._take(need + state)
        return int(need + state)

    def allocate_all(self, rids: np.ndarray, num_computed: np.ndarray, num_new: np.ndarray) -> bool:
        """All-or-nothing allocation for a batch; True if every request got its blocks."""
        held = self.held[rids]
        need = self.blocks_for(num_computed + num_new) - held
        np.maximum(need, 0, out=need)
        total = int(need.sum())
        if self.holds_state:
            total += int((self.state_of(rids) * ((held == 0) & (need > 0))).sum())
        if total > self.free_blocks:
            return False
        self.held[rids] += need
        self._take(total)
        return True

    def free(self, rids) -> None:
        """Return every block of the given request(s); cached blocks stay cached."""
        held = self.held[rids]
        n = int(held.sum())
        if self.holds_state:
            n += int((self.state_of(rids) * (held > 0)).sum())
        if self._ref or self._hashes:
            for rid in np.atleast_1d(rids).tolist():
                n += self._release(rid)
        self.free_blocks += n
        self.held[rids] = 0

    # ---- preemption by swap --------------------------------------------------------------
    def swap_out(self, rid: int) -> float | None:
        """Move every block of ``rid`` (its KV and state blocks) to the host: the copy's
        seconds, or None when the host space cannot hold them (then nothing moved)."""
        held = int(self.held[rid])
        n = held + (int(self.state_of(rid)) if held else 0)
        if self.swap is None or not self.swap.store(rid, n):
            return None
        self.free(rid)
        return self.swap.copy_time(n)

    def swap_in(self, rid: int, num_computed: int, num_new: int = 0) -> float | None:
        """Bring ``rid``'s blocks (``num_computed`` tokens and its state) back from the host:
        the copy's seconds, or None when the GPU has too few free blocks for them and
        ``num_new`` more tokens."""
        kv_blocks = self.blocks_for(num_computed)
        n = kv_blocks + (int(self.state_of(rid)) if kv_blocks else 0)
        if self.blocks_for(num_computed + num_new) - kv_blocks + n > self.free_blocks:
            return None
        self.swap.release(rid)
        self.held[rid] = kv_blocks
        self._take(n)
        return self.swap.copy_time(n)

    def is_swapped(self, rid: int) -> bool:
        """Whether ``rid``'s blocks are on the host."""
        return self.swap is not None and rid in self.swap.held

    # ---- prefix caching ------------------------------------------------------------------
    def _release(self, rid: int) -> int:
        """Forget ``rid``'s hashes and references; how many of its held blocks must not be
        returned as empty (shared ones still referenced) net of cached ones now free."""
        hashes = self._hashes.pop(rid, None)
        self._pending.discard(rid)
        ref = self._ref.pop(rid, 0)
        if not ref:
            return 0
        freed = self.prefix.release(hashes[:ref])
        return freed - ref  # its ref blocks are cached, not empty; the freed ones count free

    def match_prefix(self, rid: int, num_tokens: int) -> int | None:
        """Start ``rid`` (holding nothing) from the cached blocks of its prompt: the number of
        tokens served from the cache (whole blocks; never the last token, as vLLM's
        ``get_computed_blocks``), 0 when nothing hits. Its state blocks are taken with the
        hit. None when a hit's state blocks do not fit beside the cached blocks it revives:
        the request waits with its hit (vLLM's ``allocate_slots`` counts those revived
        blocks and returns None; no engine drops a hit to start over without it)."""
        if self.held[rid]:
            return 0
        hashes = self._block_hashes(rid)
        if hashes is None:
            return 0
        most = (int(num_tokens) - 1) // self.block_size
        hit = self.prefix.match(hashes, most)
        state = int(self.state_of(rid))
        if hit and state > self.free_blocks - self._revivals(hashes[:hit]):
            return None
        if len(hashes):
            self._pending.add(rid)
        if state > self.free_blocks:
            return 0
        self.free_blocks -= self.prefix.touch(hashes[:hit])
        hit += self._load_from_host(hashes[hit:most], state)
        if not hit:
            return 0
        self._take(state)
        self.held[rid] = hit
        self._ref[rid] = hit
        if hit == len(hashes):
            self._pending.discard(rid)
        return hit * self.block_size

    def prefix_hit_tokens(self, rid: int, num_tokens: int) -> int:
        """Tokens ``match_prefix`` would serve from the cache now, touching nothing."""
        hashes = self._block_hashes(rid)
        if hashes is None:
            return 0
        return self.prefix.match(hashes, (int(num_tokens) - 1) // self.block_size) * \
            self.block_size

    def _block_hashes(self, rid: int) -> list[int] | None:
        """The chained hashes of every full block ``rid``'s ids name (computed once), or
        of its own blocks when it has no ids (``set_prefix_source``'s ``lengths``), or None
        when prefix caching is off or nothing names them. Past the prompt they name its
        generated tokens; a hit never covers the last token (``match_prefix``)."""
        if self.prefix is None:
            return None
        hashes = self._hashes.get(rid)
        if hashes is not None:
            return hashes
        names = self.block_names(rid)
        if names is None:
            return None
        ids, span, tokens = names
        hashes = self._hashes[rid] = block_hashes(ids, tokens, span, self.block_size)
        return hashes

    def _load_from_host(self, hashes: list[int], state: int) -> int:
        """Copy the leading blocks of ``hashes`` that the host tier holds into free GPU blocks,
        leaving ``state`` free for the request's state, and cache them (the caller references
        them); how many."""
        if self.host is None or not hashes:
            return 0
        n = min(self.host.match(hashes), self.free_blocks - state)
        if n > 0:
            self._take(n)
            for h in hashes[:n]:
                if not self.prefix.insert(h):  # cached after all: our copy is surplus
                    self.free_blocks += 1 if self.prefix.refs[h] > 1 else 0
            self.copy_s += n * self.host_copy_time
        return n

    def take_copy_time(self) -> float:
        """Seconds of host-tier copies since the last call (charged to the step that asks)."""
        dt, self.copy_s = self.copy_s, 0.0
        return dt

    def _revivals(self, hashes: list[int]) -> int:
        refs = self.prefix.refs
        return sum(1 for h in hashes if refs[h] == 0)

    def commit(self, computed: np.ndarray, rids=None) -> None:
        """Cache the full named blocks that requests of this cache have computed by now
        (``computed``: the request table's column), as vLLM caches blocks as they fill;
        ``rids``: only these requests (those whose ``computed`` crossed a block boundary)."""
        pending = self._pending
        if not pending:
            return
        rids = np.fromiter(pending, np.int64, len(pending)) if rids is None else \
            np.atleast_1d(rids)
        filled = np.minimum(computed[rids] // self.block_size, self.held[rids])
        pool, all_hashes, refs = self.prefix, self._hashes, self._ref
        for rid, n in zip(rids.tolist(), filled.tolist(), strict=True):
            if rid not in pending:
                continue
            hashes = all_hashes[rid]
            n = min(n, len(hashes))
            ref = refs.get(rid, 0)
            if n > ref:
                # a block computed twice at once: keep the cached copy, free our own
                self.free_blocks += pool.insert_many(hashes[ref:n])
                refs[rid] = n
            if n == len(hashes):
                pending.discard(rid)

    def window_steps(self, rids: np.ndarray, context: np.ndarray, k: int,
                     head: int = -1) -> int:
        """How many of the next ``k`` decode steps of ``rids`` (one token each a step, from
        ``context`` computed tokens) a decode window may take at once: up to and including
        the first step that fills a named block already cached, or fills one a second time
        in these steps (its commit frees a block, which stepping reuses at once instead of
        evicting one), or fills one that request ``head`` (≥ 0: the head of the waiting
        queue) names (its hit would grow). ``k`` without prefix caching."""
        pending = self._pending
        if self.prefix is None or not pending:
            return k
        refs, bs = self.prefix.refs, self.block_size
        named = set(self._block_hashes(head) or ()) if head >= 0 else set()
        filled: dict[int, int] = {}  # hash -> the step (counted from 1) that fills it
        for rid, c in zip(rids.tolist(), context.tolist(), strict=True):
            if rid not in pending:
                continue
            hashes = self._hashes[rid]
            for b in range(c // bs, min(len(hashes), (c + k) // bs)):
                h, step = hashes[b], (b + 1) * bs - c
                if h in refs or h in named:
                    k = step
                    break
                if h in filled:  # the later of its two fills frees a block
                    k = min(k, max(step, filled[h]))
                    break
                filled[h] = step
        return k

    def audit(self, rids: np.ndarray) -> str:
        """What is wrong with the block accounting ("" when nothing is), given ``rids``:
        every request that holds blocks of this cache. Their own KV and state blocks plus,
        once each, the cached prefix blocks they reference must be the blocks in use, and
        the prefix pool's references must be theirs (``check_invariants``)."""
        if not 0 <= self.free_blocks <= self.num_blocks:
            return f"{self.free_blocks} free blocks, outside [0, {self.num_blocks}]"
        held = self.held[rids]
        n = int(held.sum()) + int((np.asarray(self.state_of(rids)) * (held > 0)).sum())
        if self.prefix is not None:
            refs, ref = self.prefix.refs, self._ref
            theirs = [ref.get(r, 0) for r in rids.tolist()]
            if sum(theirs) != sum(refs.values()) or len(ref) != np.count_nonzero(theirs):
                return (f"the prefix pool counts {sum(refs.values())} references, the requests "
                        f"holding blocks {sum(theirs)} (and {len(ref)} requests reference it)")
            free_cached = sum(1 for c in refs.values() if c == 0)
            if free_cached != len(self.prefix.lru) or min(refs.values(), default=0) < 0:
                return (f"{free_cached} cached blocks have no reference but the LRU of free "
                        f"cached blocks has {len(self.prefix.lru)}")
            n += len(refs) - free_cached - sum(theirs)  # a shared block counts once
        if n != self.used_blocks:
            return (f"{self.used_blocks} blocks in use ({self.free_blocks} free of "
                    f"{self.num_blocks}) but the requests holding blocks account for {n}")
        if self.swap is not None:
            sw = self.swap
            if sum(sw.held.values()) != sw.used_blocks or not 0 <= sw.free_blocks <= \
                    sw.num_blocks:
                return (f"host swap space: {sw.used_blocks} blocks in use of {sw.num_blocks}, "
                        f"swapped requests hold {sum(sw.held.values())}")
        return ""

    @property
    def cached_blocks(self) -> int:
        """Blocks that hold a cached prefix block (referenced or free)."""
        return len(self.prefix) if self.prefix is not None else 0

    @property
    def empty_blocks(self) -> int:
        """Free blocks that hold no cached block: taking them evicts nothing."""
        return self.free_blocks - (len(self.prefix.lru) if self.prefix is not None else 0)

    @property
    def used_blocks(self) -> int:
        """Blocks currently held by requests."""
        return self.num_blocks - self.free_blocks

    def usage(self) -> float:
        """Fraction of blocks in use."""
        return self.used_blocks / self.num_blocks if self.num_blocks else 0.0
