"""Static (request-level) batching with padding: one batch at a time, run to completion.

Imitates the batching of engines before iteration-level scheduling — FasterTransformer and
Hugging Face ``generate`` behind a server that hands them a batch — the request-level
scheduling that the Orca paper (Yu et al., OSDI 2022) sets out to replace: requests are
grouped into a batch of up to ``max_num_seqs`` (the max batch size), the prompts are padded to
the longest one and prefilled in one step, and the batch decodes until its longest output is
done; a request that finishes early keeps its row (padding) and newly arrived requests wait
for the whole batch.

Here: a batch forms, in arrival order, when the previous one has finished; it takes requests
while the padded prefill (batch size × longest prompt) stays within
``max_num_batched_tokens`` and while the KV cache can reserve each request's prompt plus its
maximum output (blocks are allocated for the whole request at formation, so nothing is ever
preempted). The cost model prices the padded shape (``PaddedBatch.cost_shape``): every row of
the batch, each as long as the longest prompt plus the tokens generated so far. Records and
the timeline count only real tokens. Fast-forward is off for this policy (the replica's decode
window prices unpadded contexts). Like the engines it imitates, it has no prefix cache:
``kv_cache.prefix_caching`` is ignored (the run logs a warning). Nothing is ever preempted.
"""

from __future__ import annotations

import numpy as np

from sim.config import SchedulerConfig
from sim.kv.manager import PagedKVCache
from sim.records import LogHistogram
from sim.schedulers.base import Batch, TokenBudgetScheduler
from sim.state import RequestTable


class PaddedBatch(Batch):
    """A batch whose cost is that of ``rows`` sequences all of the same padded length."""

    __slots__ = ("rows", "pad_new", "pad_context")

    def __init__(self, ids: np.ndarray, new_tokens: np.ndarray, context_tokens: np.ndarray,
                 queue_length: int, rows: int, pad_new: int, pad_context: int) -> None:
        super().__init__(ids, new_tokens, context_tokens, queue_length)
        self.rows, self.pad_new, self.pad_context = rows, pad_new, pad_context

    def cost_shape(self) -> tuple[np.ndarray, np.ndarray]:
        """Every row of the static batch, finished or not, at the padded length."""
        return (np.full(self.rows, self.pad_new, np.int64),
                np.full(self.rows, self.pad_context, np.int64))


class StaticScheduler(TokenBudgetScheduler):
    """Forms a padded batch when the previous one has finished and runs it to completion."""

    name = "static"
    settings = TokenBudgetScheduler.settings | {"max_num_seqs", "max_num_batched_tokens"}
    whole_prompt = True

    uses_prefix_cache = False

    def __init__(self, cfg: SchedulerConfig, table: RequestTable, kv: PagedKVCache,
                 itl: LogHistogram) -> None:
        super().__init__(table, kv, itl)
        self.max_batch = cfg.max_num_seqs
        self.budget = cfg.max_num_batched_tokens
        self.rows = 0      # size of the batch in flight, finished rows included
        self.pad_len = 0   # its longest sequence when it started
        self.decode_steps = 0  # decode steps it has run

    def can_fast_forward(self, batch: Batch) -> bool:
        """Never: a decode window would be priced without the padding."""
        return False

    def candidates(self) -> list[int]:
        """The requests the next batch would take, in arrival order (no state changes)."""
        t, kv = self.table, self.kv
        free = kv.free_blocks
        chosen: list[int] = []
        widest = 0  # new tokens of the padded prefill row
        for rid in self.waiting:
            if len(chosen) == self.max_batch:
                break
            width = max(widest, int(t.num_tokens[rid] - t.computed[rid]))
            need = int(kv.blocks_for(t.prompt[rid] + t.max_output[rid] - 1) - kv.held[rid])
            if not kv.held[rid]:
                need += int(kv.state_of(rid))  # its state blocks come with its first ones
            if width * (len(chosen) + 1) > self.budget or need > free:
                break
            chosen.append(rid)
            widest, free = width, free - need
        return chosen

    def ready(self, chosen: list[int], now: float) -> bool:
        """Whether a batch of ``chosen`` starts now (static: as soon as there is one)."""
        return bool(chosen)

    def schedule(self, now: float) -> Batch | None:
        """A decode step of the batch in flight, or the prefill of a new batch, or None."""
        t = self.table
        run = self.running
        if len(run):
            self.decode_steps += 1
            return PaddedBatch(run, np.ones(len(run), np.int64), t.computed[run],
                               len(self.waiting), self.rows, 1,
                               self.pad_len + self.decode_steps - 1)
        if not self.waiting:
            return None
        chosen = self.candidates()
        if not self.ready(chosen, now):
            return None
        for rid in chosen:
            self.waiting.popleft()
            self._admit(rid, now)
            # reserve the whole request: prompt plus every output token but the last
            done = int(t.computed[rid])
            taken = self.kv.allocate(rid, done, int(t.prompt[rid] + t.max_output[rid] - 1) - done)
            assert taken is not None, "candidates() counted blocks the cache does not have"
        ids = np.array(chosen, np.int64)
        self.running = ids
        ctx = t.computed[ids].copy()
        new = t.num_tokens[ids] - ctx
        self.rows, self.pad_len, self.decode_steps = len(ids), int(t.num_tokens[ids].max()), 0
        return PaddedBatch(ids, new, ctx, len(self.waiting), self.rows, int(new.max()),
                           int(ctx.max()))
