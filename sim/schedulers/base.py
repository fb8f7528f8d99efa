"""What every batching policy shares: the batch it hands out, and how a step's output lands.

A scheduler is a plain object (no clock, no SimPy): ``schedule(now)`` picks the next step's
batch, ``update(batch, now)`` applies its result — the split of vLLM's ``schedule()`` and
``update_from_output()``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from sim.kv_cache import PagedKVCache
from sim.records import LogHistogram
from sim.state import FINISHED, RUNNING, WAITING, RequestTable


@dataclass(frozen=True)
class Batch:
    """One step's work: per scheduled request, its new tokens and tokens already cached."""

    ids: np.ndarray
    new_tokens: np.ndarray
    context_tokens: np.ndarray
    queue_length: int

    @property
    def num_prefill_tokens(self) -> int:
        """Tokens of the step that are not single decode tokens."""
        decode = (self.new_tokens == 1) & (self.context_tokens > 0)
        return int(self.new_tokens[~decode].sum())


class TokenBudgetScheduler:
    """Base of schedulers that give each request some new tokens per step.

    Holds the waiting queue (FIFO of request ids), the running list (admission order) and
    the shared ``update`` logic; subclasses implement ``schedule``.
    """

    def __init__(self, table: RequestTable, kv: PagedKVCache, itl: LogHistogram) -> None:
        self.table, self.kv, self.itl = table, kv, itl
        self.waiting: deque[int] = deque()
        self.running = np.empty(0, np.int64)

    def add_request(self, rid: int) -> None:
        """A request has arrived at this replica."""
        self.table.status[rid] = WAITING
        self.waiting.append(rid)

    def has_work(self) -> bool:
        """Whether any request is waiting or running."""
        return bool(self.waiting) or len(self.running) > 0

    def update(self, batch: Batch, now: float) -> np.ndarray:
        """Apply a finished step at ``now``; returns the ids of requests that completed."""
        t, ids = self.table, batch.ids
        t.computed[ids] += batch.new_tokens
        emit = ids[t.computed[ids] == t.num_tokens[ids]]
        if not len(emit):
            return emit
        gen = t.generated[emit] + 1
        t.generated[emit] = gen
        t.num_tokens[emit] += 1
        first = gen == 1
        if first.all():
            t.first_token[emit] = now
        else:
            t.first_token[emit[first]] = now
            later = emit[~first]
            self.itl.add(now - t.last_token[later])
        t.last_token[emit] = now
        done = emit[gen >= t.max_output[emit]]
        if len(done):
            t.completion[done] = now
            t.status[done] = FINISHED
            self.kv.free(done)
            self.running = self.running[~np.isin(self.running, done)]
        return done

    def _admit(self, rid: int, now: float) -> None:
        t = self.table
        t.status[rid] = RUNNING
        if np.isnan(t.first_scheduled[rid]):
            t.first_scheduled[rid] = now
