"""vLLM v1-style continuous batching with chunked prefill (the default scheduler).

Imitates ``vllm/v1/core/sched/scheduler.py`` (``Scheduler.schedule``, vLLM ≥ 0.8): one token
budget per step (``max_num_batched_tokens``); running requests are served first, in admission
order, each getting ``num_tokens − num_computed_tokens`` tokens capped by
``long_prefill_token_threshold`` and by the remaining budget (a prefill longer than the budget
runs in chunks); when the KV cache cannot hold a request's new tokens the most recently
admitted running request is preempted by recompute (its blocks freed, it goes back to the front
of the waiting queue) until it fits or the request itself was the victim; with
``kv_cache.preemption=swap`` the victim's blocks go to host memory instead while there is room
(vLLM v0's ``PreemptionMode.SWAP``) and come back before it runs again, the copies adding
``Batch.swap_s`` to the step. Waiting requests are
then admitted in FCFS order while there are budget, sequence slots (``max_num_seqs``) and KV
blocks — but not in a step that preempted.

``policy=priority`` is vLLM's ``--scheduling-policy priority``
(``SchedulingPolicy.PRIORITY``): the waiting queue is a heap ordered by ``(priority,
arrival_time)`` (lower value = more urgent; ``vllm/v1/core/sched/request_queue.py``), and the
preemption victim is ``max(running, key=(priority, arrival_time))`` — the least urgent, then
latest, running request, wherever it is in the running list; if it was already scheduled in
this step its tokens and blocks are given back. As in vLLM, a waiting request never preempts a
running one: priority orders admission and picks victims, nothing more.
"""

from __future__ import annotations

import numpy as np

from sim.config import SchedulerConfig
from sim.kv.manager import PagedKVCache
from sim.records import LogHistogram
from sim.schedulers.base import Batch, TokenBudgetScheduler
from sim.schedulers.queues import KeyedQueue
from sim.state import RequestTable


class VllmScheduler(TokenBudgetScheduler):
    """Running-first, token-budget, chunked-prefill scheduling with recompute preemption."""

    name = "vllm"
    settings = TokenBudgetScheduler.settings | {
        "max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill",
        "long_prefill_token_threshold", "policy"}
    # sim.compiled.step_schedule is this class's loop (sim.compiled.keyed_queue its keyed order)
    compiled_prefix_cache = True
    fast_path = {"name": None, "max_model_len": None, "max_num_seqs": None,
                 "max_num_batched_tokens": None, "enable_chunked_prefill": None,
                 "long_prefill_token_threshold": None, "policy": ("fcfs", "priority")}

    def __init__(self, cfg: SchedulerConfig, table: RequestTable, kv: PagedKVCache,
                 itl: LogHistogram) -> None:
        super().__init__(table, kv, itl)
        self.max_num_seqs = cfg.max_num_seqs
        self.budget = cfg.max_num_batched_tokens
        self.threshold = cfg.long_prefill_token_threshold
        self.chunked = cfg.enable_chunked_prefill
        if cfg.policy == "priority":
            self._order_by("priority",
                           lambda rid: (int(table.priority[rid]), float(table.arrival[rid])))

    def _order_by(self, order: str, key) -> None:
        """Serve waiting requests and pick preemption victims by ``key(rid)`` (smallest is
        most urgent; ``order`` names it) instead of by arrival and admission order."""
        self.waiting = KeyedQueue(key)
        self.waiting_order = order

    @property
    def by_key(self) -> bool:
        """Whether the waiting queue is ordered by a key, not by arrival."""
        return self.waiting_order != "arrival"

    def _victim(self, run: list[int]) -> int:
        """Index in ``run`` of the request to preempt: the last admitted (FCFS), or the one
        with the largest key (vLLM's ``max(self.running, key=...)``), ties broken by the
        larger id as the waiting queue breaks them. vLLM's keys end with the arrival time,
        which two requests never share; here requests can arrive at one instant, and two
        with equal keys each taken as the victim of the other would preempt each other
        forever (each preempted as its twin allocates, at the front of the running list)."""
        if not self.by_key:
            return len(run) - 1
        key = self.waiting.key
        return max(range(len(run)), key=lambda j: (*key(run[j]), run[j]))

    def can_fast_forward(self, batch: Batch) -> bool:
        """As the base class, except that under a keyed order a waiting queue that still
        has seats and budget to fill stops fast-forward: a request arriving later may
        outrank the head and fit where the head does not (a shorter prompt), whereas under
        FCFS it would queue behind it."""
        if (self.by_key and self.waiting and len(self.running) < self.max_num_seqs
                and self.budget > len(self.running)):
            return False
        return super().can_fast_forward(batch)

    def _want(self, rids):
        want = self.table.num_tokens[rids] - self.table.computed[rids]
        if self.threshold > 0:
            want = np.minimum(want, self.threshold)
        return want

    def schedule(self, now: float) -> Batch | None:
        """The next step's batch, or None when nothing can run."""
        t, kv = self.table, self.kv
        budget = self.budget
        run = self.running
        ids = new = ctx = run[:0]
        preempted = False
        if len(run):
            computed = t.computed[run]
            want = t.num_tokens[run] - computed
            if self.threshold > 0:
                np.minimum(want, self.threshold, out=want)
            total = int(want.sum())
            if total > budget:
                cum = np.cumsum(want)
                k = int(np.searchsorted(cum, budget, side="right"))
                want[k] = budget - (cum[k - 1] if k else 0)
                want[k + 1:] = 0
                total = budget
            if kv.allocate_all(run, computed, want):
                if total == len(run) or want.min() > 0:
                    ids, new, ctx = run, want, computed
                else:
                    sel = want > 0
                    ids, new, ctx = run[sel], want[sel], computed[sel]
            else:
                ids, new, preempted = self._schedule_running_with_preemption(budget)
                ctx = t.computed[ids]
                total = int(new.sum())
            budget -= total
        self.preempted_in_last_step = preempted
        if not preempted and self.waiting:
            ids, new, ctx = self._admit_waiting(now, budget, ids, new, ctx)
        if not len(ids):
            # Under a keyed order the first running request can be its own victim, leaving
            # an empty step; vLLM's engine loop then simply schedules again (the preemption
            # freed blocks), so do that rather than sleep until an arrival.
            return self.schedule(now) if preempted else None
        return self._batch(ids, new, ctx)

    def _schedule_running_with_preemption(self, budget: int):
        """The slow path of the running loop, taken only when the cache is short of blocks."""
        t, kv = self.table, self.kv
        run = list(self.running)
        ids, new = [], []
        preempted = False
        i = 0
        while i < len(run) and budget > 0:
            rid = run[i]
            n = min(int(self._want(rid)), budget)
            while kv.allocate(rid, int(t.computed[rid]), n) is None:
                j = self._victim(run)
                victim = run.pop(j)
                self._preempt(victim)
                self.waiting.appendleft(victim)
                preempted = True
                if victim == rid:
                    break
                if j < i:  # scheduled earlier in this step: give its tokens back
                    k = ids.index(victim)
                    ids.pop(k)
                    budget += new.pop(k)
                    i -= 1
            else:
                ids.append(rid)
                new.append(n)
                budget -= n
                i += 1
                continue
            break
        self.running = np.array(run, np.int64)
        return np.array(ids, np.int64), np.array(new, np.int64), preempted

    def _admit_waiting(self, now: float, budget: int, ids, new, ctx):
        t, kv = self.table, self.kv
        admitted, chunks, cached = [], [], []
        slots = self.max_num_seqs - len(self.running)
        while self.waiting and slots > 0 and budget > 0:
            rid = self.waiting[0]
            if kv.is_swapped(rid) and not self._swap_in(rid, min(int(self._want(rid)), budget)):
                break
            hit = self._match_prefix(rid)
            if hit is None:
                break
            n = int(self._want(rid))
            if n > budget and not self.chunked:
                self._unmatch(rid, hit)
                break
            n = min(n, budget)
            if kv.allocate(rid, int(t.computed[rid]), n) is None:
                self._unmatch(rid, hit)
                break
            self.waiting.popleft()
            self._admit(rid, now, hit)
            admitted.append(rid)
            chunks.append(n)
            cached.append(t.computed[rid])
            budget -= n
            slots -= 1
        if admitted:
            adm = np.array(admitted, np.int64)
            self.running = np.concatenate([self.running, adm])
            ids = np.concatenate([ids, adm])
            new = np.concatenate([new, np.array(chunks, np.int64)])
            ctx = np.concatenate([ctx, np.array(cached, np.int64)])
        return ids, new, ctx
