"""One serving instance as a SimPy process: schedule → step time → update, forever."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import simpy

from sim.cost.base import BOUNDS, CostModel
from sim.records import ColumnBuffer
from sim.schedulers.base import TokenBudgetScheduler

TIMELINE_COLUMNS = {
    "time_s": "f8", "step_time_s": "f8", "batch_size": "i4", "scheduled_tokens": "i4",
    "prefill_tokens": "i4", "decode_tokens": "i4", "queue_length": "i4",
    "kv_blocks_used": "i8", "compute_s": "f8", "memory_s": "f8", "comm_s": "f8", "host_s": "f8",
    "bound": "i1",
}


class Replica:
    """Runs batches of its scheduler back to back, sleeping while it has no work.

    ``on_complete(ids, now)`` is told of requests that finished in each step (the engine
    uses it for closed-loop clients and progress).
    """

    def __init__(self, env: simpy.Environment, scheduler: TokenBudgetScheduler,
                 cost_model: CostModel, on_complete: Callable[[np.ndarray, float], None],
                 next_arrival: Callable[[], float] = lambda: float("inf"),
                 fast_forward: bool = True) -> None:
        self.env, self.scheduler, self.cost_model = env, scheduler, cost_model
        self.on_complete = on_complete
        self.next_arrival = next_arrival
        self._joins: list[float] = []  # when requests joined the queue during a decode window
        self._in_window = False
        self.fast_forward = fast_forward
        self.timeline = ColumnBuffer(TIMELINE_COLUMNS)
        self._wakeup: simpy.Event | None = None
        self.process = env.process(self._run())

    def submit(self, rid: int) -> None:
        """Hand a request to this replica's scheduler, waking the replica if it sleeps."""
        self.scheduler.add_request(rid)
        if self._in_window:
            self._joins.append(self.env.now)
        if self._wakeup is not None and not self._wakeup.triggered:
            self._wakeup.succeed()

    def _run(self):
        env, sched, kv = self.env, self.scheduler, self.scheduler.kv
        record = self.timeline.append
        while True:
            now = env.now
            batch = sched.schedule(now)
            if batch is None:
                self._wakeup = env.event()
                wake_at = sched.next_wakeup(now)
                if wake_at < float("inf"):
                    yield self._wakeup | env.timeout(max(0.0, wake_at - now))
                else:
                    yield self._wakeup
                self._wakeup = None
                continue
            if self.fast_forward and sched.can_fast_forward(batch):
                k = sched.decode_window_limit(batch)
                if k > 1:
                    yield from self._decode_window(batch, k)
                    continue
            cost = self.cost_model.step_cost(*batch.cost_shape())
            scheduled = batch.num_tokens
            prefill = batch.num_prefill_tokens
            record(now, cost.time_s, len(batch.ids), scheduled, prefill, scheduled - prefill,
                   batch.queue_length, kv.used_blocks, cost.compute_s, cost.memory_s,
                   cost.comm_s, cost.host_s, BOUNDS.index(cost.bound))
            yield env.timeout(cost.time_s)
            done = sched.update(batch, env.now)
            if len(done):
                self.on_complete(done, env.now)

    def _decode_window(self, batch, k: int):
        """Run up to ``k`` decode-only steps in one timeout (fast-forward).

        With an empty waiting queue, an arrival could join the batch at the next step
        boundary, so the window stops at the first boundary at or after the next arrival.
        """
        env, sched = self.env, self.scheduler
        now = env.now
        time, compute, memory, comm, host = self.cost_model.decode_window(batch.context_tokens, k)
        ends = np.cumsum(np.concatenate(([now], time)))[1:]
        if not sched.waiting:
            k = min(k, int(np.searchsorted(ends, self.next_arrival(), side="left")) + 1)
            ends = ends[:k]
        starts = np.concatenate(([now], ends[:-1]))
        n = len(batch.ids)
        used = sched.kv.used_blocks + sched.block_growth(batch, k)
        self._in_window = True
        yield env.timeout(ends[-1] - now)
        self._in_window = False
        # queue length at each step start: the window's first, plus later joins by then
        queue = np.full(k, batch.queue_length)
        if self._joins:
            queue[1:] += np.searchsorted(self._joins, starts[1:], side="right")
            self._joins.clear()
        bound = np.argmax(np.stack([compute[:k], memory[:k], comm[:k], host[:k]]), axis=0)
        self.timeline.extend(k, starts, time[:k], n, n, 0, n, queue, used,
                             compute[:k], memory[:k], comm[:k], host[:k], bound)
        done = sched.update_window(batch, ends)
        if len(done):
            self.on_complete(done, env.now)
