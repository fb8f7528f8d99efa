"""SGLang's scheduler: prefill-first batches, longest-prefix-match order, reserved decode tokens.

Imitates ``python/sglang/srt/managers/scheduler.py`` (``get_next_batch_to_run``,
``get_new_batch_prefill``, ``update_running_batch``) and ``schedule_policy.py``
(``SchedulePolicy``, ``PrefillAdder``) with SGLang's defaults:

- A step is either a prefill batch or a decode batch, never both (no ``--enable-mixed-chunk``):
  whenever a request waits and can be admitted, the step prefills; running requests decode
  only in steps without a prefill.
- Waiting order: longest prefix match over the prefix cache (``--schedule-policy lpm``) when
  prefix caching is on, falling back to FCFS above 128 waiting requests, where matching every
  request each step would cost too much (``_determine_active_policy``); otherwise FCFS.
- Admission (``PrefillAdder``): the tokens left for new requests are the free and evictable
  cache minus, per running request, ``min(max_new − generated, 4096) × new_token_ratio``; a
  request is admitted if its uncached prompt plus ``min(max_new, 4096)`` is below that, and the
  step's prompt tokens stay within ``max_prefill_tokens`` (``scheduler.max_num_batched_tokens``)
  and ``chunked_prefill_size`` (``scheduler.chunk_size``); a prompt longer than what is left of
  the chunk is split, one chunked request at a time, continued first in the next prefill.
- ``new_token_ratio`` starts at 0.7 (``SGLANG_INIT_NEW_TOKEN_RATIO`` × conservativeness 1.0),
  decays by (0.7 − 0.098) / 600 per decode step down to 0.7 × 0.14 (``SGLANG_*_NEW_TOKEN_RATIO``
  defaults), and returns to 0.7 when the server is idle.
- A decode step without room for one token per request retracts requests
  (``ScheduleBatch.retract_decode``): the least progressed, then longest-prompt one first, until
  the rest fit or one is left; they go back to the waiting queue to be recomputed, and
  ``new_token_ratio`` becomes ``min(1, (Σ generated + 20 × remaining) / (Σ max_new + 1))``
  (``SGLANG_RETRACT_DECODE_STEPS`` = 20).

When the one request left decoding and the chunked prefill hold every block between them,
neither can go on: the run ends with one line naming ``kv_cache.num_gpu_blocks`` (SGLang stops
there too, ``retract_decode``'s "No space left for only one request"; its one-token pages
reach that state only in a fuller cache than blocks do).

Retraction is always by recompute (SGLang has no swap): ``kv_cache.preemption=swap`` is
ignored, and the run logs a warning saying so.

Not modelled: SGLang's in-batch prefix deprioritisation, the page size (one block is a page),
and retraction into the radix cache (a retracted request's committed blocks stay cached
here). A prefix hit's free cached blocks, which the hit locks, and a continued chunk's tokens
come out of the tokens left for new requests, as SGLang's ``PrefillAdder`` counts them. An
empty server admits the head request even if its reservation exceeds the cache, as the
cluster only routes requests that fit alone.
"""

from __future__ import annotations

import numpy as np

from sim.config import SchedulerConfig
from sim.errors import ConfigError
from sim.kv.manager import PagedKVCache
from sim.records import LogHistogram
from sim.schedulers.base import Batch, TokenBudgetScheduler
from sim.state import RequestTable

INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = INIT_NEW_TOKEN_RATIO * 0.14
NEW_TOKEN_RATIO_DECAY = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / 600
RETRACT_DECODE_STEPS = 20
CLIP_MAX_NEW_TOKENS = 4096
LPM_MAX_QUEUE = 128  # above this many waiting requests, FCFS
# SGLang stops in the same spot: ``retract_decode`` asserts "No space left for only one
# request", and a chunk it cannot place fails its prefill ("Prefill out of memory")
NO_ROOM = ("the KV cache is full and nothing can run: the one request left decoding and the "
           "chunked prefill hold every block, and neither has a block to grow into (SGLang "
           "stops here too: 'No space left for only one request'); give the replica more KV "
           "blocks or a smaller scheduler.chunk_size")


def no_room_error(num_gpu_blocks: int) -> ConfigError:
    """The error that ends a run whose SGLang replica has too few blocks to go on."""
    return ConfigError("kv_cache.num_gpu_blocks", int(num_gpu_blocks), NO_ROOM)


class SglangScheduler(TokenBudgetScheduler):
    """Prefill-first batching with decode-token reservation and retraction (SGLang)."""

    name = "sglang"
    settings = TokenBudgetScheduler.settings | {"max_num_seqs", "max_num_batched_tokens",
                                                "chunk_size"}
    chunk_fields = ("chunk_size",)
    # sim.compiled.step_schedule.schedule_sglang is this class's loop (FCFS: no prefix cache)
    fast_path = {"name": None, "max_model_len": None, "max_num_seqs": None,
                 "max_num_batched_tokens": None, "chunk_size": None}

    @classmethod
    def step_token_limit(cls, cfg) -> int:
        # a first prompt over max_prefill_tokens is admitted, up to a chunk
        return max(cfg.max_num_batched_tokens, cfg.chunk_size)

    swaps = False  # retraction is by recompute

    def __init__(self, cfg: SchedulerConfig, table: RequestTable, kv: PagedKVCache,
                 itl: LogHistogram) -> None:
        super().__init__(table, kv, itl)
        self.max_running = cfg.max_num_seqs
        self.max_prefill_tokens = cfg.max_num_batched_tokens
        self.chunk = cfg.chunk_size
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self.chunked = -1  # the request whose prompt is being prefilled in chunks, if any

    # ---- admission ----------------------------------------------------------------------
    def ordered_waiting(self) -> list[int] | None:
        """The waiting queue in the order admission tries it: longest cached prefix first
        (stable, so FCFS among equals); None for FCFS (queue order), used above 128 waiting
        requests or without a prefix cache."""
        kv = self.kv
        if kv.prefix is None or not 2 <= len(self.waiting) <= LPM_MAX_QUEUE:
            return None
        queue = list(self.waiting)
        t = self.table
        hits = [kv.prefix_hit_tokens(r, int(t.num_tokens[r])) if not t.computed[r] else 0
                for r in queue]
        order = np.argsort(-np.array(hits), kind="stable")
        return [queue[i] for i in order]

    def _reserved_tokens(self) -> float:
        """Decode tokens the running requests are expected to still need."""
        t, run = self.table, self.running
        if not len(run):
            return 0.0
        left = np.minimum(t.max_output[run] - t.generated[run], CLIP_MAX_NEW_TOKENS)
        return float(left.sum()) * self.new_token_ratio

    def _prefill_batch(self, now: float) -> Batch | None:
        t, kv = self.table, self.kv
        rem_total = kv.free_blocks * kv.block_size - self._reserved_tokens()
        rem_input, rem_chunk = self.max_prefill_tokens, self.chunk
        ids, new, ctx = [], [], []
        if self.chunked >= 0:  # the chunked request goes first, with what the chunk allows
            rid = self.chunked
            n = min(int(t.num_tokens[rid] - t.computed[rid]), rem_chunk)
            if kv.allocate(rid, int(t.computed[rid]), n) is None:
                return None
            ids.append(rid), new.append(n), ctx.append(int(t.computed[rid]))
            rem_total -= n  # as add_chunked_req's budget update: the chunk's tokens are taken
            rem_input -= n
            rem_chunk -= n
        admitted = []
        order = self.ordered_waiting()
        for i in range(len(self.waiting)):
            rid = order[i] if order is not None else self.waiting[0]
            if len(self.running) + len(admitted) >= self.max_running:
                break
            if rem_input <= 0 or rem_chunk <= 0:
                break
            free = kv.free_blocks
            hit = self._match_prefix(rid)
            if hit is None:
                break
            # free cached blocks the hit now holds are no longer evictable (SGLang's
            # inc_lock_ref shrinks the evictable size): they come out of rem_total too
            locked = (free - kv.free_blocks) * kv.block_size
            extend = int(t.num_tokens[rid] - t.computed[rid])
            max_new = min(int(t.max_output[rid] - t.generated[rid]), CLIP_MAX_NEW_TOKENS)
            # an empty server takes the head whatever its reservation (it fits alone, and
            # would otherwise wait forever)
            if extend + max_new + locked >= rem_total and (len(self.running) or ids):
                self._unmatch(rid, hit)
                break
            n = min(extend, rem_chunk)
            if n > rem_input and ids or kv.allocate(rid, int(t.computed[rid]), n) is None:
                self._unmatch(rid, hit)
                break
            if order is None:
                self.waiting.popleft()
            else:
                self.waiting.remove(rid)
            self._admit(rid, now, hit)
            admitted.append(rid)
            ids.append(rid), new.append(n), ctx.append(int(t.computed[rid]))
            rem_total -= extend + max_new + locked
            rem_input -= n
            rem_chunk -= n
            if n < extend:
                self.chunked = rid
                break
        if not ids:
            return None
        if admitted:
            self.running = np.concatenate([self.running, np.array(admitted, np.int64)])
        return self._batch(np.array(ids, np.int64), np.array(new, np.int64),
                           np.array(ctx, np.int64))

    # ---- decode -------------------------------------------------------------------------
    def _decode_batch(self) -> Batch | None:
        t, kv = self.table, self.kv
        run = self.running
        if self.chunked >= 0:
            run = run[run != self.chunked]
        if not len(run):
            return None
        ctx = t.computed[run]
        want = t.num_tokens[run] - ctx
        if kv.allocate_all(run, ctx, want):
            self.new_token_ratio = max(self.new_token_ratio - NEW_TOKEN_RATIO_DECAY,
                                       MIN_NEW_TOKEN_RATIO)
            self.preempted_in_last_step = False
            return Batch(run, want, ctx, len(self.waiting))
        run = self._retract(run)
        ctx = t.computed[run]
        want = t.num_tokens[run] - ctx
        if not kv.allocate_all(run, ctx, want):
            raise no_room_error(kv.num_blocks + 1)
        return Batch(run, want, ctx, len(self.waiting))

    def _retract(self, run: np.ndarray) -> np.ndarray:
        """Retract decode requests until the others fit (``retract_decode``); the rest."""
        t, kv = self.table, self.kv
        # victims from the end of (generated, −prompt) descending: least progressed first,
        # then the longest prompt
        ascending = run[np.lexsort((-t.prompt[run], t.generated[run]))]
        keep = ascending[::-1].tolist()  # keep[-1] is the next victim
        while len(keep) > 1:
            ids = np.array(keep, np.int64)
            need = kv.blocks_for(t.num_tokens[ids]) - kv.held[ids]
            if int(np.maximum(need, 0).sum()) <= kv.free_blocks:
                break
            victim = keep.pop()
            kv.free(victim)
            t.preempt(victim)
            self.waiting.append(victim)
        ids = np.array(keep, np.int64)
        self.running = self.running[np.isin(self.running, ids) | (self.running == self.chunked)]
        self.preempted_in_last_step = True
        ratio = (t.generated[ids].sum() + RETRACT_DECODE_STEPS * len(ids)) / \
            (t.max_output[ids].sum() + 1)
        self.new_token_ratio = min(1.0, float(ratio))
        return ids

    # ---- the step -----------------------------------------------------------------------
    def schedule(self, now: float) -> Batch | None:
        """A prefill batch if any request can be admitted (or a chunked prefill goes on),
        else a decode batch of every running request; None when nothing can run."""
        if not self.waiting and not len(self.running):
            self.new_token_ratio = INIT_NEW_TOKEN_RATIO  # idle: back to the initial estimate
            return None
        if self.waiting or self.chunked >= 0:
            batch = self._prefill_batch(now)
            if batch is not None:
                self.preempted_in_last_step = False
                return batch
        return self._decode_batch()

    def update(self, batch: Batch, now: float) -> np.ndarray:
        """As the base class; a chunked prompt whose last chunk ran is chunked no more."""
        done = super().update(batch, now)
        c = self.chunked
        if c >= 0 and self.table.computed[c] >= self.table.num_tokens[c] - 1:
            self.chunked = -1
        return done

    def can_fast_forward(self, batch: Batch) -> bool:
        """Only with nothing waiting: a waiting request may be admitted in any later step,
        as ``new_token_ratio`` decays step by step."""
        return not self.waiting and self.chunked < 0 and super().can_fast_forward(batch)

    def update_window(self, batch: Batch, ends: np.ndarray,
                      seen: np.ndarray | None = None) -> np.ndarray:
        """As the base class, plus the ratio decay of the window's steps after the first
        (whose ``schedule`` applied its own)."""
        self.new_token_ratio = max(
            self.new_token_ratio - (len(ends) - 1) * NEW_TOKEN_RATIO_DECAY, MIN_NEW_TOKEN_RATIO)
        return super().update_window(batch, ends, seen)
