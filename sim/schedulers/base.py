"""What every batching policy shares: the batch it hands out, and how a step's output lands.

A scheduler is a plain object (no clock, no SimPy): ``schedule(now)`` picks the next step's
batch, ``update(batch, now)`` applies its result — the split of vLLM's ``schedule()`` and
``update_from_output()``.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from sim.kv.manager import PagedKVCache
from sim.records import LogHistogram
from sim.state import FINISHED, RUNNING, WAITING, RequestTable


class Batch:
    """One step's work: per scheduled request, its new tokens and tokens already cached."""

    __slots__ = ("ids", "new_tokens", "context_tokens", "queue_length", "num_tokens",
                 "_prefill", "growth", "swap_s")

    def __init__(self, ids: np.ndarray, new_tokens: np.ndarray, context_tokens: np.ndarray,
                 queue_length: int) -> None:
        self.ids, self.new_tokens, self.context_tokens = ids, new_tokens, context_tokens
        self.queue_length = queue_length
        self.num_tokens = int(new_tokens.sum())
        self._prefill: int | None = None
        self.growth: np.ndarray | None = None  # cached block_growth of a decode window
        self.swap_s = 0.0  # KV copies to and from host memory this step adds to its time

    def cost_shape(self) -> tuple[np.ndarray, np.ndarray]:
        """(new_tokens, context_tokens) the cost model prices: the scheduled sequences, plus
        any padding a policy computes for nothing (static batching)."""
        return self.new_tokens, self.context_tokens

    def tokens_sampled(self, table) -> int:
        """How many of the step's requests sample a token when it ends (those whose new
        tokens reach all they know, as ``TokenBudgetScheduler.update`` finds them)."""
        ids = self.ids
        return int((table.computed[ids] + self.new_tokens == table.num_tokens[ids]).sum())

    @property
    def num_prefill_tokens(self) -> int:
        """Tokens of the step that are not single decode tokens."""
        if self._prefill is None:
            if self.num_tokens == len(self.ids) and self.context_tokens.min() > 0:
                self._prefill = 0
            else:
                decode = (self.new_tokens == 1) & (self.context_tokens > 0)
                self._prefill = int(self.new_tokens[~decode].sum())
        return self._prefill


class TokenBudgetScheduler:
    """Base of schedulers that give each request some new tokens per step.

    Holds the waiting queue (FIFO of request ids), the running list (admission order) and
    the shared ``update`` logic; subclasses implement ``schedule``. ``uses_prefix_cache`` and
    ``swaps`` say whether the policy reuses cached prefix blocks (``kv_cache.prefix_caching``)
    and whether its preemptions go through ``_preempt`` (so swap with
    ``kv_cache.preemption=swap``); where not, the run logs that the setting is ignored
    (``sim.builders.ignored_settings``) and the cache is built without it.
    """

    # What a policy declares about itself; the registry (sim.schedulers.SCHEDULERS), the
    # config checks, the invariant checker, capacity's chunk search and the compiled loop's
    # eligibility all read these, never the policy's name.
    # the option of scheduler.name this class is
    name = ""
    # the scheduler.* fields a policy reads (cli.unused_settings warns about the others);
    # its conf/scheduler YAML lists exactly these
    settings = frozenset({"name", "max_model_len"})
    # prefills whole prompts: every prompt must fit one step's token budget
    whole_prompt = False
    # the scheduler.* fields that set a step's prefill chunk (capacity.config_search.chunk)
    chunk_fields: tuple[str, ...] = ("max_num_batched_tokens",)
    # the compiled loop (sim.compiled) runs this policy: setting -> the values it handles
    # (None: any); every setting is listed. None: the reference engine always runs it.
    fast_path: dict[str, tuple | None] | None = None
    # the compiled loop matches and caches prefixes as this policy does
    # (sim.compiled.prefix_cache); False: its runs with prefix caching take the reference engine
    compiled_prefix_cache = False

    @classmethod
    def prefill_chunk(cls, cfg) -> int:
        """One step's prefill chunk under ``cfg``: the first of ``chunk_fields`` (what
        SGLang's memory rule reads as ``chunked_prefill_size``)."""
        return int(getattr(cfg, cls.chunk_fields[0]))

    @classmethod
    def step_token_limit(cls, cfg) -> int:
        """Most tokens one step of this policy schedules under ``cfg`` (``scheduler.*``)."""
        return cfg.max_num_batched_tokens

    @classmethod
    def prefills_whole_prompts(cls, cfg) -> bool:
        """Whether, under ``cfg``, every prompt must fit one step's token budget."""
        return cls.whole_prompt or ("enable_chunked_prefill" in cls.settings
                                    and not cfg.enable_chunked_prefill)

    @classmethod
    def check(cls, cfg) -> None:
        """This policy's own checks of ``cfg`` beyond the shared ones (``ConfigError``)."""

    uses_prefix_cache = True
    swaps = True

    def __init__(self, table: RequestTable, kv: PagedKVCache, itl: LogHistogram) -> None:
        self.table, self.kv, self.itl = table, kv, itl
        self.waiting: deque[int] = deque()
        # what orders the waiting queue: "arrival" (this deque), or the key of a
        # KeyedQueue (sim.schedulers.queues): "priority" or "deadline"
        self.waiting_order = "arrival"
        self.running = np.empty(0, np.int64)
        self.preempted_in_last_step = False
        self.swap_s = 0.0  # KV copy time of the step being scheduled (Batch.swap_s)

    def add_request(self, rid: int) -> None:
        """A request has arrived at this replica."""
        self.table.status[rid] = WAITING
        self.waiting.append(rid)

    def next_wakeup(self, now: float) -> float:
        """When ``schedule`` may return a batch without a new arrival (inf: only an arrival
        can change its answer). Timer-driven policies (a max queue delay) override it."""
        return float("inf")

    def has_work(self) -> bool:
        """Whether any request is waiting or running."""
        return bool(self.waiting) or len(self.running) > 0

    def update(self, batch: Batch, now: float) -> np.ndarray:
        """Apply a finished step at ``now``; returns the ids of requests that completed."""
        t, ids = self.table, batch.ids
        t.computed[ids] += batch.new_tokens
        self._commit(ids, batch.new_tokens)
        emit = ids[t.computed[ids] == t.num_tokens[ids]]
        if not len(emit):
            return emit
        gen = t.generated[emit] + 1
        t.generated[emit] = gen
        t.num_tokens[emit] += 1
        first = gen == 1
        if first.all():
            t.first_token[emit] = now
            t.last_token[emit] = now
        else:
            t.first_token[emit[first]] = now
            later = emit[~first]
            last = t.last_token[later]
            # a retried request's earlier tokens may still be streaming from the API server of
            # the replica that failed (sim.engine.cluster): its client sees this one after them
            seen = np.maximum(last, now)
            self.itl.add(seen - last)
            t.last_token[emit[first]] = now
            t.last_token[later] = seen
        return self._finish(emit[gen >= t.max_output[emit]], now)

    def _commit(self, ids: np.ndarray, new) -> None:
        """Cache the blocks that the last ``new`` tokens of ``ids`` (now computed) filled:
        only requests whose ``computed`` crossed a block boundary can have filled one."""
        kv = self.kv
        if kv.prefix is None:
            return
        computed = self.table.computed
        c = computed[ids]
        bs = kv.block_size
        crossed = ids[c // bs > (c - new) // bs]
        if len(crossed):
            kv.commit(computed, crossed)

    def _finish(self, done: np.ndarray, now: float) -> np.ndarray:
        if len(done):
            t = self.table
            t.completion[done] = np.maximum(t.last_token[done], now)  # (update: a retry's)
            t.status[done] = FINISHED
            self.kv.free(done)
            self.running = self.running[t.status[self.running] != FINISHED]
        return done

    # ---- fast-forward of decode-only steps --------------------------------------------
    def can_fast_forward(self, batch: Batch) -> bool:
        """Whether the batch is every running request in decode and no one was preempted.

        Then, until a request completes, the cache runs short or a new request arrives to an
        empty queue, every following step schedules the same requests one token each: a
        waiting request that could not be admitted now cannot be admitted later either
        (sequence slots and token budget stay the same, free blocks only shrink), except
        under prefix caching: there a step's commits can free a block (one filled twice) or
        lengthen the waiting head's hit, which ``decode_window_limit`` keeps out of a
        window, and each failed admission of a request with state blocks takes and returns
        them (evicting cached blocks), as one served from the host tier copies its blocks
        back: no window while a request waits then.
        """
        if (self.preempted_in_last_step or len(batch.ids) != len(self.running)
                or batch.swap_s):
            return False
        kv = self.kv
        if (self.waiting and kv.prefix is not None
                and (kv.holds_state or kv.host is not None)):
            return False
        if batch.num_prefill_tokens:
            return False
        t, ids = self.table, batch.ids
        # every sequence is one token short of all it knows (so each step samples a token),
        # and has sampled before (a prompt's 1-token last chunk would be its first token)
        return bool((t.num_tokens[ids] - batch.context_tokens == 1).all()
                    and t.generated[ids].min() > 0)

    def block_growth(self, batch: Batch, k: int) -> np.ndarray:
        """Extra KV blocks held after each of ``k`` decode steps (0 for the first, which
        ``schedule`` already allocated)."""
        if batch.growth is not None and len(batch.growth) >= k:
            return batch.growth[:k]
        bs = self.kv.block_size
        first_need = self.kv.held[batch.ids] * bs - batch.context_tokens
        starts = first_need[first_need < k]
        if not len(starts):
            return np.zeros(k, np.int64)
        rows = -(-k // bs)
        per_step = np.bincount(starts, minlength=rows * bs).reshape(rows, bs)
        return np.cumsum(per_step.cumsum(axis=0).ravel()[:k])

    def decode_window_limit(self, batch: Batch) -> int:
        """Most decode steps (≥ 1) this batch can run unchanged: up to and including the
        first step in which a request completes, before a step that would run out of KV
        blocks, and under prefix caching up to a step whose commit frees a block or grows
        the waiting head's hit (``PagedKVCache.window_steps``): a window allocates its
        steps' blocks together and caches what they filled at its end."""
        t, ids, kv = self.table, batch.ids, self.kv
        k = int((t.max_output[ids] - t.generated[ids]).min())
        if k <= 1:
            return 1
        growth = batch.growth = self.block_growth(batch, k)
        k = min(k, int(np.searchsorted(growth, kv.free_blocks, side="right")))
        head = self.waiting[0] if self.waiting else -1
        return max(1, kv.window_steps(ids, batch.context_tokens, k, head))

    def update_window(self, batch: Batch, ends: np.ndarray,
                      seen: np.ndarray | None = None) -> np.ndarray:
        """Apply ``len(ends)`` decode steps of ``batch`` ending at the times ``ends``, whose
        tokens the clients saw at ``seen`` (through a frontend; None: at ``ends``).

        Same state, timestamps and ITL samples as ``len(ends)`` calls of ``update``.
        """
        t, ids, k = self.table, batch.ids, len(ends)
        seen = ends if seen is None else seen
        last = t.last_token[ids]
        if (last > seen[0]).any():
            # a retried request's earlier tokens still streaming from the failed replica's API
            # server (``update``): its client sees each token after them, step by step
            for s in seen.tolist():
                now = np.maximum(last, s)
                self.itl.add(now - last)
                last = now
        else:
            self.itl.add(seen[0] - last)
            if k > 1:
                self.itl.add_repeated(np.diff(seen), len(ids))
            last = seen[-1]
        if not self.kv.allocate_all(ids, batch.context_tokens, np.full(len(ids), k)):
            raise AssertionError("decode window overran the KV cache")
        t.computed[ids] += k
        self._commit(ids, k)  # the blocks filled in the window, as ``update`` caches them
        t.num_tokens[ids] += k
        gen = t.generated[ids] + k
        t.generated[ids] = gen
        t.last_token[ids] = last
        return self._finish(ids[gen >= t.max_output[ids]], float(seen[-1]))

    def _batch(self, ids, new, ctx) -> Batch:
        """This step's batch; it carries the copy time of swaps (and host-tier prefix hits)
        made since the last batch, so the replica spends it before the step."""
        batch = Batch(ids, new, ctx, len(self.waiting))
        batch.swap_s, self.swap_s = self.swap_s, 0.0
        return batch

    def _admit(self, rid: int, now: float, cached: int = 0) -> None:
        t = self.table
        t.status[rid] = RUNNING
        if np.isnan(t.first_scheduled[rid]):
            t.first_scheduled[rid] = now
            t.cached_tokens[rid] = cached  # prompt tokens served from the prefix cache

    def _preempt(self, rid: int) -> None:
        """Preempt a running request: swap its blocks to the host when the cache preempts by
        swap and the host has room (it resumes where it was), else recompute.

        Every policy that preempts goes through here (vllm, edf, sarathi, trtllm's
        MAX_UTILIZATION), so ``kv_cache.preemption=swap`` means the same for each; the
        caller puts the victim back in its waiting queue, and its admission path swaps it
        back in (``_swap_in``) before allocating. sglang's retraction does not: SGLang
        retracts by recompute, so it recomputes whatever ``kv_cache.preemption`` says."""
        t = self.table
        dt = self.kv.swap_out(rid) if self.kv.swap is not None else None
        if dt is None:
            self.kv.free(rid)
            t.preempt(rid)
            return
        self.swap_s += dt
        t.swaps[rid] += 1
        t.preemptions[rid] += 1
        t.status[rid] = WAITING

    def _swap_in(self, rid: int, num_new: int) -> bool:
        """Bring a swapped-out request's blocks back; False when the GPU has no room for
        them and ``num_new`` more tokens."""
        dt = self.kv.swap_in(rid, int(self.table.computed[rid]), num_new)
        if dt is None:
            return False
        self.swap_s += dt
        return True

    def _match_prefix(self, rid: int) -> int | None:
        """Start a request that holds no KV from its cached prefix blocks (vLLM's
        ``get_computed_blocks`` at admission): its ``computed`` becomes the hit length.
        None when the hit cannot be taken now (``PagedKVCache.match_prefix``): the request
        is not admitted in this step."""
        t = self.table
        if self.kv.prefix is None or t.computed[rid]:
            return 0
        hit = self.kv.match_prefix(rid, int(t.num_tokens[rid]))
        if hit is None:
            return None
        t.computed[rid] = hit
        if self.kv.copy_s:  # blocks brought back from the host tier
            self.swap_s += self.kv.take_copy_time()
        return hit

    def _unmatch(self, rid: int, hit: int) -> None:
        """Undo ``_match_prefix`` for a request that was not admitted after all."""
        if hit:
            self.kv.free(rid)
            self.table.computed[rid] = 0
