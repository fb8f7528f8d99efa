"""One serving instance as a SimPy process: schedule → step time → update, forever.

A replica can fail (``fail``: the step in progress is lost, the replica sleeps until
``restart`` gives it a fresh scheduler) and a request routed to it during a fast-forwarded
decode window cuts the window at the next step boundary, exactly where step-by-step
simulation would first see the request. A straggler (``speed``, ``sim.engine.faults``) multiplies
the time of every step by the factor in force when the step starts; a decode window ends at
the first step boundary at or after the factor changes. An engine that schedules each step
while the one before it runs (``overlap``: TensorRT-LLM's overlap scheduler, SGLang's overlap
schedule, vLLM's async scheduling) holds a request that reaches it mid-step until the step
after next. With ``check`` (an
``sim.engine.invariants.InvariantChecker``) the state is checked after every step and window.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import simpy

from sim.compiled.overlap import came_before, released_in_window
from sim.cost.base import BOUNDS, CostModel, StepCost
from sim.engine.faults import SpeedSchedule
from sim.engine.frontend import FrontendServer
from sim.records import ColumnBuffer, StepTotals
from sim.routers.base import queued_ids
from sim.schedulers.base import TokenBudgetScheduler

if TYPE_CHECKING:
    from sim.engine.invariants import InvariantChecker

TIMELINE_COLUMNS = {
    "time_s": "f8", "step_time_s": "f8", "batch_size": "i4", "scheduled_tokens": "i4",
    "prefill_tokens": "i4", "decode_tokens": "i4", "queue_length": "i4",
    "kv_blocks_used": "i8", "compute_s": "f8", "memory_s": "f8", "comm_s": "f8", "host_s": "f8",
    "bound": "i1", "swap_s": "f8",
}
FAIL, CUT = "fail", "cut"  # causes of an interrupt of the replica's process


class _Window:
    """A fast-forwarded run of decode steps in progress: its batch, start, step ends and
    per-step costs, whether an arrival may cut it short, and (through a frontend) when the
    clients saw the tokens of its first steps (``Replica._stream_window``)."""

    __slots__ = ("batch", "start", "ends", "costs", "used", "cuttable", "seen")

    def __init__(self, batch, start, ends, costs, used, cuttable) -> None:
        self.batch, self.start, self.ends, self.costs = batch, start, ends, costs
        self.used, self.cuttable = used, cuttable
        self.seen: list[float] = []


class Replica:
    """Runs batches of its scheduler back to back, sleeping while it has no work.

    ``on_complete(ids, now)`` is told of requests that finished in each step (the engine
    uses it for closed-loop clients and progress). ``next_arrival()`` bounds decode windows
    when the replica alone sees every arrival; otherwise arrivals cut windows as they come.
    """

    def __init__(self, env: simpy.Environment, scheduler: TokenBudgetScheduler,
                 cost_model: CostModel, on_complete: Callable[[np.ndarray, float], None],
                 next_arrival: Callable[[], float] = lambda: float("inf"),
                 fast_forward: bool = True, gid: int = 0, speed: SpeedSchedule | None = None,
                 check: InvariantChecker | None = None, timeline: bool = True,
                 frontend: FrontendServer | None = None, steps=None,
                 overlap: bool = False, up: bool = True) -> None:
        """``gid``: its run-wide replica id; ``speed``: its straggler episodes (None: never
        slow); ``check``: the run's invariant checker (None: ``check_invariants`` is off);
        ``timeline``: keep one row per step (else only ``StepTotals``); ``steps``: where its
        rows go instead (``sim.timeline_file.StreamedSteps``); ``frontend``: its API
        server (None: a wire), which streams each step's tokens when the step ends (in a
        decode window, when something else needs the server: ``_stream_window``).
        ``overlap``: the engine schedules each step while the one
        before it runs (``sim.config.backend.overlaps``), so a request that reaches it while
        a step runs waits for the step after next (``accept``). ``up`` false: built off (an
        autoscaled pool's spare), serving nothing until ``restart``."""
        self.env, self.scheduler, self.cost_model = env, scheduler, cost_model
        self.gid, self.speed, self.check = gid, speed, check
        self.on_complete = on_complete
        self.next_arrival = next_arrival
        self.sees_all_arrivals = False  # set when next_arrival() knows every submission
        self._joins: list[float] = []  # when requests joined the queue during a decode window
        self._window: _Window | None = None
        self._cut_pending = False
        self.frontend = frontend
        # routed here, not yet in the scheduler: in the frontend, or (overlap) waiting for
        # the engine's next scheduling pass
        self.before_scheduler: set[int] = set()
        self.overlap = overlap
        self._held: deque[tuple[int, float]] = deque()  # (rid, reached at); a failure clears it
        self._busy = False  # a step (or decode window) is running
        self._last_start = -float("inf")  # the start of the step that ran last
        # bumped when a failure takes the frontend's requests back: their pending hand-overs
        # are void (a request sent here again after the repair has a hand-over of its own)
        self._handover_epoch = 0
        self.fast_forward = fast_forward
        # one row per step, rows streamed to a file, or running totals (same calls)
        self.steps = steps if steps is not None else (
            ColumnBuffer(TIMELINE_COLUMNS) if timeline else StepTotals())
        self._wakeup: simpy.Event | None = None
        self._repaired: simpy.Event | None = None
        self.up = up
        self.process = env.process(self._run())

    def submit(self, rid: int) -> None:
        """A request routed here now: through the frontend, then to the scheduler."""
        if self.frontend is None:
            self.accept(rid)
            return
        now = self.env.now
        epoch = self._handover_epoch
        if self.frontend.costs.interleaved:
            self.before_scheduler.add(rid)
            if self.frontend.join(rid):  # admitted with this instant's other arrivals
                self.env.timeout(0).callbacks.append(
                    lambda _e, k=epoch: self._admit_group(k))
            return
        # the server takes jobs in time order; a step ending at this very instant was
        # scheduled after the event that sends this request (when the step began), so
        # SimPy would run the send first
        self._stream_window(now, inclusive=False)
        at = self.frontend.admit(rid, now)
        if at == now:
            self.accept(rid)
            return
        self.before_scheduler.add(rid)
        self.env.timeout(at - now).callbacks.append(
            lambda _e, r=rid, k=epoch: self._through(r, k))

    def _admit_group(self, epoch: int) -> None:
        """This instant's arrivals have joined: they reach the engine together."""
        if epoch != self._handover_epoch:  # a failure took the group back
            return
        now = self.env.now
        self._stream_window(now)
        members, at = self.frontend.admit_group(now)
        for rid in members:
            if at == now:
                self._through(rid, epoch)
            else:
                self.env.timeout(at - now).callbacks.append(
                    lambda _e, r=rid, k=epoch: self._through(r, k))

    def _through(self, rid: int, epoch: int) -> None:
        if epoch == self._handover_epoch and rid in self.before_scheduler:  # (not taken back)
            self.before_scheduler.discard(rid)
            self.accept(rid)

    def _release(self, before: float) -> None:
        """Held requests that reached the engine before ``before`` go to the scheduler."""
        held = self._held
        while held and came_before(held[0][1], before):
            rid, _ = held.popleft()
            self.before_scheduler.discard(rid)
            self.scheduler.add_request(rid)

    def take_unscheduled(self) -> np.ndarray:
        """The requests routed here but not yet in the engine's scheduler, which will not
        reach it (a failure)."""
        ids = np.array(sorted(self.before_scheduler), np.int64)
        self.before_scheduler.clear()
        self._held.clear()
        self._handover_epoch += 1
        if self.frontend is not None:
            self.frontend.drop_group()
        return ids

    def accept(self, rid: int, hold: bool = True) -> None:
        """Hand a request to this replica's scheduler, waking the replica if it sleeps (past
        the frontend; a disaggregated request whose KV cache lands here comes straight in,
        ``hold=False``: the decode side's pick-up lag is not modelled).

        With ``overlap``, a request that arrives while a step runs is held: the engine has
        already scheduled the next step (TensorRT-LLM's ``PyExecutor._executor_loop_overlap``,
        SGLang's ``Scheduler.event_loop_overlap`` and vLLM's ``step_with_batch_queue``
        schedule step k+1 and launch it before they wait for step k's tokens), so the request
        joins the step after that (``_release``)."""
        now = self.env.now
        held = hold and self.overlap and self._busy
        if held:
            self.before_scheduler.add(rid)
            self._held.append((rid, now))
        else:
            self.scheduler.add_request(rid)
        w = self._window
        if w is not None:
            # it counts in the queue from when the scheduler has it: held, from the end of
            # the first step that began after it came (``_release``)
            self._joins.append(float(released_in_window(w.start, w.ends, now)) if held
                               else now)
            if w.cuttable:
                self._cut(w, now)
        if self._wakeup is not None and not self._wakeup.triggered:
            self._wakeup.succeed()

    def _cut(self, w: _Window, now: float) -> None:
        """End the decode window at the first step boundary at or after ``now``."""
        if (not self._cut_pending and int(np.searchsorted(w.ends, now)) < len(w.ends) - 1
                and self.env.active_process is not self.process):
            self._cut_pending = True
            self.process.interrupt(CUT)

    def kv_used_blocks(self) -> int:
        """KV blocks in use now, also inside a decode window (whose allocations the scheduler
        applies only at its end): those of the step running now, as step by step."""
        w = self._window
        if w is None:
            return self.scheduler.kv.used_blocks
        i = int(np.searchsorted(w.ends, self.env.now))
        return int(w.used[min(i, len(w.ends) - 1)])

    def waiting_ids(self) -> np.ndarray:
        """The scheduler's waiting requests as stepping would have them now: inside a decode
        window, with the held requests whose step boundary has passed."""
        ids = queued_ids(self.scheduler)
        w = self._window
        if w is None or not self._held:
            return ids
        held = np.array(self._held)  # (rid, reached at) rows
        came = held[released_in_window(w.start, w.ends, held[:, 1]) < self.env.now,
                    0].astype(np.int64)
        return np.concatenate([ids, came]) if len(came) else ids

    def fail(self) -> None:
        """The replica goes down now: the steps of a decode window that ended by now count
        (as they would have one by one), the step in progress is lost, and nothing is served
        until ``restart``. Its unfinished requests are the caller's to re-route."""
        self.up = False
        w = self._window
        if w is not None:
            now = self.env.now
            self._stream_window(now)
            self._window = None
            self._record_window(w, min(int(np.searchsorted(w.ends, now)) + 1, len(w.ends)))
            ended = int(np.searchsorted(w.ends, now, side="right"))
            if ended:
                seen = None if self.frontend is None else np.array(w.seen[:ended])
                done = self.scheduler.update_window(w.batch, w.ends[:ended], seen)
                if len(done):
                    self.on_complete(done, now if seen is None else float(seen[-1]))
        self.process.interrupt(FAIL)

    def restart(self, scheduler: TokenBudgetScheduler, cost_model: CostModel) -> None:
        """The replica is back, empty, with a fresh scheduler (and KV cache)."""
        self.scheduler, self.cost_model = scheduler, cost_model
        self.up = True
        self._repaired.succeed()

    def _run(self):
        env = self.env
        if not self.up:  # built off: wait for the first start
            self._repaired = env.event()
            yield self._repaired
        record = self.steps.append
        sched = self.scheduler
        kv = sched.kv
        while True:
            try:
                now = env.now
                self._busy = False
                if self._held:  # scheduled while the last step ran: what had come by its start
                    self._release(self._last_start)
                batch = sched.schedule(now)
                if batch is None and self._held:  # an idle engine takes what has come
                    self._release(float("inf"))
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
                self._busy, self._last_start = True, now
                if self.fast_forward and not self._held and sched.can_fast_forward(batch):
                    k = sched.decode_window_limit(batch)
                    if k > 1:
                        yield from self._decode_window(batch, k)
                        continue
                cost = self.cost_model.step_cost(*batch.cost_shape())
                swap_s = batch.swap_s
                if self.speed is not None:
                    f = self.speed.factor_at(now)
                    if f != 1.0:
                        cost, swap_s = _slowed(cost, f), swap_s * f
                scheduled = batch.num_tokens
                prefill = batch.num_prefill_tokens
                # KV copies over PCIe (swap in/out, host-tier hits) stall the step
                step_s = cost.time_s + swap_s
                record(now, step_s, len(batch.ids), scheduled, prefill,
                       scheduled - prefill, batch.queue_length, kv.used_blocks, cost.compute_s,
                       cost.memory_s, cost.comm_s, cost.host_s, BOUNDS.index(cost.bound),
                       swap_s)
                yield env.timeout(step_s)
                seen = env.now
                if self.frontend is not None:  # the clients see the tokens once streamed
                    seen = self.frontend.stream(seen, batch.tokens_sampled(sched.table))
                done = sched.update(batch, seen)
                if len(done):
                    self.on_complete(done, seen)
                if self.check is not None:
                    self.check.after_step(self, batch)
            except simpy.Interrupt:  # a failure: wait for the repair, then a fresh scheduler
                self._window, self._cut_pending = None, False
                self._joins.clear()
                self._wakeup = None
                self._repaired = env.event()
                yield self._repaired
                sched = self.scheduler
                kv = sched.kv

    def _decode_window(self, batch, k: int):
        """Run up to ``k`` decode-only steps in one timeout (fast-forward).

        With an empty waiting queue, an arrival could join the batch at the next step
        boundary, so the window stops at the first boundary at or after the next arrival
        (known in advance through ``next_arrival``, or cut when a request is submitted).
        """
        env, sched = self.env, self.scheduler
        now = env.now
        costs = self.cost_model.decode_window(batch.context_tokens, k)
        if self.speed is not None:
            f = self.speed.factor_at(now)
            if f != 1.0:
                costs = tuple(a * f for a in costs)
        ends = np.cumsum(np.concatenate(([now], costs[0])))[1:]
        if self.speed is not None:  # the step in progress at a change keeps its factor
            k = min(k, int(np.searchsorted(ends, self.speed.next_change(now), side="left")) + 1)
            ends = ends[:k]
        cuttable = not sched.waiting
        if cuttable:
            k = min(k, int(np.searchsorted(ends, self.next_arrival(), side="left")) + 1)
            ends = ends[:k]
            # a replica told of every arrival in advance has nothing left to cut its window,
            # unless requests sent before it are still in its frontend
            cuttable = not self.sees_all_arrivals or bool(self.before_scheduler)
        used = sched.kv.used_blocks + sched.block_growth(batch, k)
        w = self._window = _Window(batch, now, ends, costs, used, cuttable)
        while True:
            try:
                yield env.timeout(w.ends[-1] - env.now)
                break
            except simpy.Interrupt as stop:
                if stop.cause != CUT:
                    raise  # a failure: ``fail`` has settled the window
                self._cut_pending = False
                w.ends = w.ends[: int(np.searchsorted(w.ends, env.now)) + 1]
        self._stream_window(np.inf)
        self._window = None
        self._last_start = w.ends[-2] if len(w.ends) > 1 else w.start
        self._record_window(w, len(w.ends))
        seen = None if self.frontend is None else np.array(w.seen)
        done = sched.update_window(batch, w.ends, seen)
        if len(done):
            self.on_complete(done, env.now if seen is None else float(seen[-1]))
        if self.check is not None:
            self.check.after_window(self, batch, w.used[: len(w.ends)])

    def _stream_window(self, until: float, inclusive: bool = True) -> None:
        """Stream through the frontend the tokens of the decode window's steps that ended by
        ``until`` (``inclusive=False``: before it) and are not streamed yet, one step after
        another, as step by step each is when it ends. A window defers this until something
        else needs the server (an admission, a failure, its own end), so the server still
        takes its jobs in time order."""
        w, frontend = self._window, self.frontend
        if w is None or frontend is None:
            return
        ends, seen, tokens = w.ends, w.seen, len(w.batch.ids)  # every request decodes one
        j = len(seen)
        while j < len(ends) and (ends[j] < until or inclusive and ends[j] == until):
            seen.append(frontend.stream(float(ends[j]), tokens))
            j += 1

    def _record_window(self, w: _Window, k: int) -> None:
        """Timeline rows of the first ``k`` steps of a decode window."""
        starts = np.concatenate(([w.start], w.ends[: k - 1]))
        n = len(w.batch.ids)
        # queue length at each step start: the window's first, plus later joins by then
        queue = np.full(k, w.batch.queue_length)
        if self._joins:
            queue[1:] += np.searchsorted(self._joins, starts[1:], side="right")
            self._joins.clear()
        time, compute, memory, comm, host = w.costs
        bound = np.argmax(np.stack([compute[:k], memory[:k], comm[:k], host[:k]]), axis=0)
        self.steps.extend(k, starts, time[:k], n, n, 0, n, queue, w.used[:k],
                             compute[:k], memory[:k], comm[:k], host[:k], bound, 0.0)


def _slowed(cost: StepCost, factor: float) -> StepCost:
    """``cost`` of a step run ``factor`` times slower, every part alike."""
    return StepCost(cost.time_s * factor, cost.compute_s * factor, cost.memory_s * factor,
                    cost.comm_s * factor, cost.host_s * factor)
