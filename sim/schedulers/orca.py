"""Orca: iteration-level scheduling without chunked prefill.

Imitates the scheduler of Orca (Yu et al., "Orca: A Distributed Serving System for
Transformer-Based Generative Models", OSDI 2022; its scheduling algorithm, Algorithm 1):
every iteration re-forms the batch from the running requests (one decode token each) plus new
requests taken in arrival order while the batch has fewer than ``max_num_seqs`` (Orca's
``max_bs``) requests; a new request's whole prompt runs in the iteration that admits it
(selective batching, no chunking). Orca reserves KV slots for a request's maximum length when
it first schedules it (``n_rsrv + max_tokens ≤ n_slots``), so it never runs out of memory and
never preempts: here the blocks of prompt plus maximum output are allocated at admission. The
whole prompts of one iteration must also fit in ``max_num_batched_tokens`` (FCFS: the first
that does not stops admission). Orca predates prefix caching: ``kv_cache.prefix_caching`` is
ignored (the run logs a warning).
"""

from __future__ import annotations

import numpy as np

from sim.config import SchedulerConfig
from sim.kv.manager import PagedKVCache
from sim.records import LogHistogram
from sim.schedulers.base import Batch, TokenBudgetScheduler
from sim.state import RequestTable


class OrcaScheduler(TokenBudgetScheduler):
    """Running requests decode; new requests join with their whole prompt, KV reserved."""

    name = "orca"
    settings = TokenBudgetScheduler.settings | {"max_num_seqs", "max_num_batched_tokens"}
    whole_prompt = True
    # sim.compiled.orca_step.schedule_orca is this class's loop
    fast_path = {"name": None, "max_model_len": None, "max_num_seqs": None,
                 "max_num_batched_tokens": None}

    uses_prefix_cache = False

    def __init__(self, cfg: SchedulerConfig, table: RequestTable, kv: PagedKVCache,
                 itl: LogHistogram) -> None:
        super().__init__(table, kv, itl)
        self.max_num_seqs = cfg.max_num_seqs
        self.budget = cfg.max_num_batched_tokens

    def schedule(self, now: float) -> Batch | None:
        """Every running request's next token, plus whole prompts of admitted newcomers."""
        t, kv = self.table, self.kv
        run = self.running
        budget = self.budget - len(run)
        admitted: list[int] = []
        while self.waiting and len(run) + len(admitted) < self.max_num_seqs:
            rid = self.waiting[0]
            done = int(t.computed[rid])  # > 0 when its KV came from a prefill replica
            n = int(t.num_tokens[rid]) - done
            if n > budget:
                break
            if kv.allocate(rid, done, int(t.prompt[rid] + t.max_output[rid] - 1) - done) is None:
                break
            self.waiting.popleft()
            self._admit(rid, now)
            admitted.append(rid)
            budget -= n
        if admitted:
            run = self.running = np.concatenate([run, np.array(admitted, np.int64)])
        if not len(run):
            return None
        ctx = t.computed[run]
        return Batch(run, t.num_tokens[run] - ctx, ctx, len(self.waiting))
