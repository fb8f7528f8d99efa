"""Sarathi-Serve: stall-free batching with chunked prefills under a fixed token budget.

Imitates ``SarathiScheduler._schedule`` of microsoft/sarathi-serve
(``sarathi/core/scheduler/sarathi_scheduler.py``; Agrawal et al., "Taming Throughput-Latency
Tradeoff in LLM Inference with Sarathi-Serve", OSDI 2024): running requests are taken in
arrival order and every one whose prompt is done gets its decode token first — when the KV
cache cannot hold it, the latest-arrived running request not yet visited is preempted (itself
if none is left) — so decodes never stall behind a prefill. Preemption is the base class's
``_preempt``: by recompute, or with ``kv_cache.preemption=swap`` by swapping the victim's
blocks to host memory while there is room there; a swapped request is swapped back in when
it is admitted again, before its blocks are allocated, and resumes where it was (the copies
add ``Batch.swap_s`` to the step). Then prompts in
progress and then waiting requests (FCFS, front first) get prefill chunks that fill what is
left of ``chunk_size``, the step's whole token budget (decodes included). A waiting request is
admitted only if the cache can hold its whole prompt (for a swapped request: its swapped
blocks and the rest of its tokens), whose blocks it takes at admission
(Sarathi's block manager allocates the prompt up front), and only while fewer than
``max_num_seqs`` run. Unlike vLLM, admission goes on in a step that preempted. With
``kv_cache.prefix_caching`` a new request starts from the cached blocks of its prefix, as
vLLM's (Sarathi-Serve is built on vLLM): it references them, allocates the rest of its
prompt, and its prefill skips the cached tokens.
"""

from __future__ import annotations

import numpy as np

from sim.config import SchedulerConfig
from sim.errors import ConfigError
from sim.kv.manager import PagedKVCache
from sim.records import LogHistogram
from sim.schedulers.base import Batch, TokenBudgetScheduler
from sim.state import RequestTable


class SarathiScheduler(TokenBudgetScheduler):
    """Decodes first, then prefill chunks up to a fixed per-step token budget."""

    name = "sarathi"
    settings = TokenBudgetScheduler.settings | {"max_num_seqs", "chunk_size",
                                                "max_num_batched_tokens"}
    chunk_fields = ("chunk_size", "max_num_batched_tokens")
    # sim.compiled.step_schedule.schedule_sarathi is this class's loop (recompute preemption)
    compiled_prefix_cache = True
    fast_path = {"name": None, "max_model_len": None, "max_num_seqs": None,
                 "chunk_size": None, "max_num_batched_tokens": None}

    @classmethod
    def step_token_limit(cls, cfg) -> int:
        return cfg.chunk_size  # Sarathi-Serve's per-step budget

    @classmethod
    def check(cls, cfg) -> None:
        if cfg.chunk_size > cfg.max_num_batched_tokens:
            raise ConfigError("scheduler.chunk_size", cfg.chunk_size,
                              f"must be <= scheduler.max_num_batched_tokens="
                              f"{cfg.max_num_batched_tokens} (the step's token budget)")

    def __init__(self, cfg: SchedulerConfig, table: RequestTable, kv: PagedKVCache,
                 itl: LogHistogram) -> None:
        super().__init__(table, kv, itl)
        self.max_num_seqs = cfg.max_num_seqs
        self.chunk_size = cfg.chunk_size

    def schedule(self, now: float) -> Batch | None:
        """Decodes, then chunks of prompts in progress, then chunks of new prompts."""
        t, kv = self.table, self.kv
        preempted = False
        run = self.running
        want = t.num_tokens[run] - t.computed[run]
        decode = want == 1
        dec = run[decode]
        if not kv.allocate_all(dec, t.computed[dec], np.ones(len(dec), np.int64)):
            dec, preempted = self._decodes_with_preemption()
            run = self.running
            want = t.num_tokens[run] - t.computed[run]
            decode = want == 1
        room = self.chunk_size - len(dec)
        pre, rem = run[~decode], want[~decode]
        give = np.clip(room - (np.cumsum(rem) - rem), 0, rem)  # FCFS chunks of what is left
        self.preempted_in_last_step = preempted
        room -= int(give.sum())
        ids = [dec, pre[give > 0]]
        new = [np.ones(len(dec), np.int64), give[give > 0]]
        admitted, chunks = self._admit_waiting(now, room)
        if admitted:
            adm = np.array(admitted, np.int64)
            ids.append(adm)
            new.append(np.array(chunks, np.int64))
            run = np.concatenate([self.running, adm])
            self.running = run[np.argsort(t.arrival[run], kind="stable")]
        ids, new = np.concatenate(ids), np.concatenate(new)
        if not len(ids):
            return None  # a swap-out's copy time (if any) goes to the next batch
        return self._batch(ids, new, t.computed[ids])

    def _decodes_with_preemption(self) -> tuple[np.ndarray, bool]:
        """Sarathi's running loop, one request at a time, when the cache is short of blocks:
        returns the decodes that got their block and whether anyone was preempted."""
        t, kv = self.table, self.kv
        run = list(self.running)
        keep, dec = [], []
        preempted = False
        i = 0
        while i < len(run):
            rid = run[i]
            i += 1
            if t.num_tokens[rid] - t.computed[rid] > 1:  # prompt in progress: blocks held
                keep.append(rid)
                continue
            while kv.allocate(rid, int(t.computed[rid]), 1) is None:
                victim = run.pop() if i < len(run) else rid
                self._preempt(victim)
                self.waiting.appendleft(victim)
                preempted = True
                if victim == rid:
                    break
            else:
                keep.append(rid)
                dec.append(rid)
        self.running = np.array(keep, np.int64)
        return np.array(dec, np.int64), preempted

    def _admit_waiting(self, now: float, room: int) -> tuple[list[int], list[int]]:
        t, kv = self.table, self.kv
        admitted, chunks = [], []
        slots = self.max_num_seqs - len(self.running)
        while self.waiting and slots > 0 and room > 0:
            rid = self.waiting[0]
            swapped = kv.is_swapped(rid)
            hit = 0 if swapped else self._match_prefix(rid)
            if hit is None:
                break
            # > 0 when its KV came from a prefill replica or the prefix cache, or it was
            # swapped out
            done = int(t.computed[rid])
            n = int(t.num_tokens[rid]) - done
            if swapped and not self._swap_in(rid, n):
                break
            if kv.allocate(rid, done, n) is None:  # the whole prompt's blocks, up front
                self._unmatch(rid, hit)
                break
            self.waiting.popleft()
            self._admit(rid, now, hit)
            admitted.append(rid)
            chunks.append(min(n, room))
            room -= chunks[-1]
            slots -= 1
        return admitted, chunks
