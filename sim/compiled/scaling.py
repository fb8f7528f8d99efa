"""The autoscaler (``sim.engine.autoscaler.Autoscaler``) in the compiled loop: the same object
and decisions, on another clock and another view of the replicas.

- ``DueEvents``: the autoscaler's events (evaluations, replicas becoming ready, drained ones
  stopping) in a heap ordered as SimPy orders events (time, then creation stamp from the
  kernel's own counter); the kernel returns ``DUE`` at the first one
  (``CompiledPool.on_due``), which runs here.
- ``CompiledFleet``: the pool's replicas as the kernel's rows hold them: routable
  (``ALIVE``), requests held, waiting, running and KV blocks; a replica started gets the rows
  it was built with, as ``Cluster.repair`` gives it a fresh scheduler and KV cache.
- A draining replica stops when its last request ends, inside the kernel: the kernel notes
  when it came to hold nothing and by which step's event (``EMPTIED``, ``EMPTIED_STAMP``),
  and the stop is logged with that time before the autoscaler's next event (``settle``).
  SimPy runs that stop after the events created before it at its instant, so a replica
  emptied at the very instant of the next event stays draining through it, as here.
- The run's end: SimPy stops at an event created by the final one, so the autoscaler's events
  due at that instant and created before it still run, and so do the stops of replicas
  emptied by an earlier event of that instant (``finish``).
- ``rate``: the open-loop arrivals the cluster accepts, sorted once; the window's count is a
  search and the kernel's cursor (arrivals due at the evaluation's instant count if they
  came first).

``why_not_scaled`` says which autoscalers stay on the SimPy engine: the ``slo`` policy (it
reads each finished request's latencies as the engine reports them) and ``rate`` with
closed-loop clients (their arrivals are not known in advance).
"""

from __future__ import annotations

import heapq
import itertools
import math

import numpy as np

from sim.compiled import kernel as K
from sim.compiled import step_schedule as S
from sim.engine.autoscaler import DRAINING


def why_not_scaled(autoscaler, run) -> str:
    """Why the compiled loop cannot run ``autoscaler`` ("" when it can, or there is none)."""
    if autoscaler is None:
        return ""
    policy = autoscaler.a.policy
    if policy == "slo":
        return "cluster.autoscaler.policy=slo"
    if policy == "rate" and (run.arrivals.next_of >= 0).any():
        return "cluster.autoscaler.policy=rate with closed-loop clients"
    return ""


class DueEvents:
    """The caller's events of a compiled pool (module doc)."""

    def __init__(self, core) -> None:
        self.core = core
        self._heap: list[tuple[float, int, int, object]] = []
        self._seq = itertools.count()  # (ties of time and stamp never happen; the heap's key)

    @property
    def now(self) -> float:
        return self.core.now

    def later(self, delay: float, action, stamp: int | None = None) -> None:
        """``action`` due ``delay`` from now, created now (a stamp after every one so far)."""
        st = self.core.state
        if stamp is None:
            st[K.STAMP] += 1
            stamp = int(st[K.STAMP])
        heapq.heappush(self._heap, (self.core.now + delay, stamp, next(self._seq), action))
        self._arm()

    def pending(self) -> int:
        """Events not yet run."""
        return len(self._heap)

    def first_due(self) -> float:
        return self._heap[0][0]

    def first_stamp(self) -> int:
        return self._heap[0][1]

    def run_first(self) -> None:
        """Run the event the kernel stopped at (due now)."""
        _, _, _, action = heapq.heappop(self._heap)
        self._arm()
        action()

    def _arm(self) -> None:
        """Tell the kernel when the first event is due."""
        core = self.core
        if self._heap:
            core.clock[1], core.state[K.DUE_STAMP] = self._heap[0][0], self._heap[0][1]
        else:
            core.clock[1], core.state[K.DUE_STAMP] = math.inf, 0


class CompiledFleet:
    """The replicas of a ``CompiledPool`` for an ``Autoscaler`` (module doc)."""

    def __init__(self, core, replicas) -> None:
        """``replicas``: the SimPy-side fleet it replaces (its size, GPUs and weights)."""
        self.core = core
        self.rs, self.rf = core.pool[0], core.pool[1]
        self.size, self.gpus_per_unit = replicas.size, replicas.gpus_per_unit
        self.weight_bytes_per_gpu = replicas.weight_bytes_per_gpu
        self.blocks = int(core.cfg[5])

    def routable(self, r: int, on: bool) -> None:
        self.rs[r, S.ALIVE] = int(on)

    def outstanding(self, r: int) -> int:
        return int(self.rs[r, S.OUT])

    def waiting(self, ready: np.ndarray) -> int:
        return int(self.rs[ready, S.WCOUNT].sum())

    def metric(self, policy: str, ready: np.ndarray) -> float:
        """The policy's metric summed over the ``ready`` replicas (``ReplicaFleet.metric``)."""
        if policy == "queue":
            return float(self.waiting(ready))
        if policy == "running":
            return float(self.rs[ready, S.NRUN].sum())
        return float(sum((self.blocks - int(self.rs[r, S.FREE])) / max(self.blocks, 1)
                         for r in ready))

    def bring_up(self, r: int) -> None:
        """Replica ``r`` is up, empty, with the rows it was built with (a fresh scheduler)."""
        rows, floats = self.core.fresh
        self.rs[r], self.rf[r] = rows, floats
        self.rs[r, S.ALIVE] = 1

    def shut_down(self, r: int) -> None:
        """Nothing to do: a drained replica holds nothing and the router skips it."""


class CompiledScaling:
    """Drives ``autoscaler`` in ``core`` (a ``CompiledPool``) in place of its SimPy
    process."""

    def __init__(self, core, autoscaler, run) -> None:
        self.core, self.scaler = core, autoscaler
        self.events = DueEvents(core)
        rate = None
        if autoscaler.a.policy == "rate":
            order = core.order
            accepted = core.refusal[order] == 0
            self._times = np.sort(run.table.arrival[order[accepted]])
            # accepted arrivals among the first k of ``order`` (all released by the cursor)
            self._released = np.concatenate([[0], np.cumsum(accepted)])
            rate = self._rate
        autoscaler.run_on(self.events, CompiledFleet(core, autoscaler.fleet), rate)
        # per replica, (time, stamp) of the event that drained it last
        self._drained = np.full((autoscaler.fleet.size, 2), -np.inf)
        self._final = False
        core.on_due = self._due
        # the first evaluation was created at 0 before any arrival or step: the earliest stamp
        self.events.later(autoscaler.a.interval_s, self._tick, stamp=-1)

    def _rate(self, now: float) -> float:
        """Accepted arrivals per second in (now − window, now], of those released so far (at
        the evaluation's instant, an arrival due then counts if it came first: SimPy's
        order), as ``windowed_rate`` counts them."""
        w = self.scaler.a.rate_window_s
        released = self._released[self.core.state[K.CURSOR]]
        return float(released - np.searchsorted(self._times, now - w, side="right")) / min(
            w, now)

    def _due(self) -> None:
        """The kernel stopped at our first event: drains that ended before this instant
        first, then the event; replicas it drained are noted with its time and stamp."""
        now, stamp = self.core.now, self.events.first_stamp()
        self.settle(before=now)
        was = self.scaler.state.copy()
        self.events.run_first()
        drained = np.flatnonzero((self.scaler.state == DRAINING) & (was != DRAINING))
        self._drained[drained] = (now, stamp)

    def _tick(self) -> None:
        """An evaluation; the next is due ``interval_s`` later, unless nothing else will ever
        happen (a stalled run: the kernel then reports it, as the SimPy engine does) or this
        is the run's last instant."""
        if not self._final and self._idle():
            return
        self.scaler.evaluate(self.core.now)
        if not self._final:
            self.events.later(self.scaler.a.interval_s, self._tick)

    def _idle(self) -> bool:
        """Whether the kernel has nothing scheduled and no other event of ours is pending."""
        st, core = self.core.state, self.core
        arrivals_left = st[K.CURSOR] < len(core.order)
        return not (st[K.STEPS] or st[K.HEAP] or st[K.QCOUNT] or st[K.PENDING] >= 0
                    or arrivals_left or self.events.pending())

    def finish(self, complete: bool) -> None:
        """The run ended at ``core.now`` (``complete``: every request ended). SimPy ends it
        with an event created by the final one: our events due then, all created before it,
        run first (not those they create), then the stops of replicas emptied at that instant
        before the final event. Interrupted: the drains that ended before now."""
        now = self.core.now
        if complete:
            cutoff = int(self.core.state[K.STAMP])
            self._final = True
            while (self.events.pending() and self.events.first_due() == now
                   and self.events.first_stamp() <= cutoff):
                self._due()
        self.settle(before=now, final=int(self.core.state[K.LAST_STAMP]) if complete else None)

    def settle(self, before: float, final: int | None = None) -> None:
        """Log the stop of every draining replica that came to hold nothing after it began
        to drain and before ``before`` (at ``before`` itself: by an event before the
        ``final`` one), at the time it did. (One empty when it began to drain stops through
        its own event.)"""
        s, rs, rf = self.scaler, self.core.pool[0], self.core.pool[1]
        for r in np.flatnonzero(s.state == DRAINING):
            r = int(r)
            emptied = (float(rf[r, S.EMPTIED]), float(rf[r, S.EMPTIED_STAMP]))
            if rs[r, S.OUT] or emptied <= tuple(self._drained[r]):
                continue
            if emptied[0] < before or (final is not None and emptied[0] == before
                                       and emptied[1] < final):
                s.stopped(r, emptied[0])
