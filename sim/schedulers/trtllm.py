"""TensorRT-LLM in-flight batching: capacity scheduler, then micro-batch scheduler.

Imitates ``tensorrt_llm/batch_manager`` (``capacityScheduler.cpp``,
``microBatchScheduler.cpp``; the "Scheduler" page of the TensorRT-LLM docs). The capacity
scheduler (``capacity_scheduler_policy``) decides which requests may hold KV memory:

- ``GUARANTEED_NO_EVICT`` (TensorRT-LLM's default, ``GuaranteedNoEvictScheduler``): requests in
  flight keep running, and the blocks each still needs to reach its maximum length (prompt +
  ``max_tokens``) are set aside; a new request is admitted, in arrival order, only if its own
  full-length blocks fit in what is left (the first that does not stops admission). Nothing is
  ever preempted.
- ``MAX_UTILIZATION`` (``MaxUtilizationScheduler``): requests are admitted if the blocks of
  their next step fit; when a running request's next token does not fit, the last started
  request is paused (its KV freed, recomputed later from the front of the queue) until it
  fits or the request itself was paused, and nothing new starts in that step. Pausing is the
  base class's ``_preempt``: with ``kv_cache.preemption=swap`` the paused request's blocks go
  to host memory while there is room there (the vLLM v0-style swap this simulator models; it
  is not a TensorRT-LLM option) and are swapped back in when it is admitted again, before
  its blocks are allocated, so it resumes where it was (copies add ``Batch.swap_s``).

A new request's prompt blocks are taken when it starts (``addSequence``). The micro-batch
scheduler then fills ``max_num_batched_tokens`` (``max_num_tokens``) with every generation
request's token first, then context chunks in arrival order (``FIRST_COME_FIRST_SERVED``
context chunking, ``enable_chunked_prefill`` = ``enable_chunked_context``); a chunk cut short
by the budget is rounded down to a multiple of the KV block size (the chunk unit; the whole
budget when that is smaller than a block, where TensorRT-LLM would never schedule it). Without
chunking a context that does not fit whole stops admission. ``max_num_seqs`` is
``max_batch_size``.

With ``kv_cache.prefix_caching`` (TensorRT-LLM's KV cache block reuse,
``enable_block_reuse``, on by default in recent versions) a new request starts from the cached
blocks of its prefix: it references them, its context is only the rest of its prompt, and
GUARANTEED_NO_EVICT reserves only the blocks it does not share (and its state blocks).
"""

from __future__ import annotations

import numpy as np

from sim.config import SchedulerConfig
from sim.kv.manager import PagedKVCache
from sim.records import LogHistogram
from sim.schedulers.base import Batch, TokenBudgetScheduler
from sim.state import RequestTable


class TrtllmScheduler(TokenBudgetScheduler):
    """Generation tokens first, then FCFS context chunks; KV by GUARANTEED_NO_EVICT or
    MAX_UTILIZATION."""

    name = "trtllm"
    settings = TokenBudgetScheduler.settings | {
        "max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill",
        "capacity_scheduler_policy"}
    # sim.compiled.step_schedule.schedule_trtllm is this class's loop (recompute pausing)
    compiled_prefix_cache = True
    fast_path = {"name": None, "max_model_len": None, "max_num_seqs": None,
                 "max_num_batched_tokens": None, "enable_chunked_prefill": None,
                 "capacity_scheduler_policy": None}

    def __init__(self, cfg: SchedulerConfig, table: RequestTable, kv: PagedKVCache,
                 itl: LogHistogram) -> None:
        super().__init__(table, kv, itl)
        self.max_num_seqs = cfg.max_num_seqs
        self.budget = cfg.max_num_batched_tokens
        self.chunked = cfg.enable_chunked_prefill
        self.no_evict = cfg.capacity_scheduler_policy == "GUARANTEED_NO_EVICT"

    def full_blocks(self, rids) -> np.ndarray:
        """Blocks that requests hold at their maximum length (the last token is never cached)."""
        t = self.table
        return self.kv.blocks_for(t.prompt[rids] + t.max_output[rids] - 1)

    def schedule(self, now: float) -> Batch | None:
        """Generation tokens, then chunks of contexts in flight, then new contexts."""
        t, kv = self.table, self.kv
        paused = False
        run = self.running
        want = t.num_tokens[run] - t.computed[run]
        gen = run[want == 1]
        if not kv.allocate_all(gen, t.computed[gen], np.ones(len(gen), np.int64)):
            if self.no_evict:
                raise AssertionError("GUARANTEED_NO_EVICT ran out of reserved KV blocks")
            paused = self._pause_until_generation_fits()
            run = self.running
            want = t.num_tokens[run] - t.computed[run]
            gen = run[want == 1]
        self.preempted_in_last_step = paused
        room = self.budget - len(gen)
        ids, new = [gen], [np.ones(len(gen), np.int64)]
        ctx_ids, ctx_want = run[want > 1], want[want > 1]
        if len(ctx_ids):
            chunks = []
            for n in ctx_want.tolist():
                chunks.append(self._chunk(n, room))
                room -= chunks[-1]
            chunks = np.array(chunks, np.int64)
            ids.append(ctx_ids[chunks > 0])
            new.append(chunks[chunks > 0])
        if not paused and self.waiting:
            admitted, chunks = self._admit_waiting(now, room)
            if admitted:
                adm = np.array(admitted, np.int64)
                self.running = np.concatenate([self.running, adm])
                ids.append(adm)
                new.append(np.array(chunks, np.int64))
        ids, new = np.concatenate(ids), np.concatenate(new)
        if not len(ids):
            return None  # a swap-out's copy time (if any) goes to the next batch
        return self._batch(ids, new, t.computed[ids])

    def _chunk(self, remaining: int, room: int) -> int:
        """Tokens of a context in this step: all of it if it fits, else (chunking on) what
        fits rounded down to whole blocks, else 0."""
        if remaining <= room:
            return remaining
        if not self.chunked:
            return 0
        # the chunk unit is a KV block; a budget smaller than one block is its own unit
        unit = min(self.kv.block_size, self.budget)
        return max(room, 0) // unit * unit

    def _reserve_left(self) -> int:
        """GUARANTEED_NO_EVICT: free blocks not set aside for running requests to finish."""
        run = self.running
        return self.kv.free_blocks - int((self.full_blocks(run) - self.kv.held[run]).sum())

    def _admit_waiting(self, now: float, room: int) -> tuple[list[int], list[int]]:
        t, kv = self.table, self.kv
        admitted, chunks = [], []
        slots = self.max_num_seqs - len(self.running)
        left = self._reserve_left() if self.no_evict else 0
        while self.waiting and slots > 0:
            rid = self.waiting[0]
            swapped = kv.is_swapped(rid)
            free = kv.free_blocks
            hit = 0 if swapped else self._match_prefix(rid)
            if hit is None:
                break
            taken = free - kv.free_blocks  # cached blocks (and state) the hit took from free
            # > 0 when its KV came from a prefill replica or the prefix cache, or it was
            # swapped out
            done = int(t.computed[rid])
            n = int(t.num_tokens[rid]) - done
            chunk = self._chunk(n, room)
            if self.no_evict and chunk:
                # its blocks still to come, those the hit took, and its state blocks if no
                # hit took them
                held = int(kv.held[rid])
                need = int(self.full_blocks(rid)) - held + taken + \
                    (int(kv.state_of(rid)) if not held else 0)
                chunk = chunk if need <= left else 0
            if chunk == 0:
                self._unmatch(rid, hit)
                break
            if self.no_evict:
                left -= need
            if swapped and not self._swap_in(rid, n):
                break
            if kv.allocate(rid, done, n) is None:  # the prompt's blocks, when it starts
                self._unmatch(rid, hit)
                break
            self.waiting.popleft()
            self._admit(rid, now, hit)
            admitted.append(rid)
            chunks.append(chunk)
            room -= chunk
            slots -= 1
        return admitted, chunks

    def _pause_until_generation_fits(self) -> bool:
        """MAX_UTILIZATION, in arrival order: a generation request whose next block does not
        fit pauses the last started request until it fits or it was the one paused; returns
        whether any request was paused."""
        t, kv = self.table, self.kv
        run = list(self.running)
        paused = False
        i = 0
        while i < len(run):
            rid = run[i]
            if t.num_tokens[rid] - t.computed[rid] == 1:
                while kv.allocate(rid, int(t.computed[rid]), 1) is None:
                    victim = run.pop()
                    self._preempt(victim)
                    self.waiting.appendleft(victim)
                    paused = True
                    if victim == rid:
                        break
                else:
                    i += 1
                    continue
                break
            i += 1
        self.running = np.array(run, np.int64)
        return paused
