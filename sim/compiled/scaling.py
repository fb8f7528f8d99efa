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
  when it came to hold nothing (``EMPTIED``) and the stop is logged with that time before
  the next event of the autoscaler (or at the end). SimPy runs that stop after the events
  created before it at its instant, so a replica emptied at the very instant of the next
  event stays draining through it, as here.
- ``rate``: the open-loop arrivals the cluster accepts, sorted once; the window's count is two
  searches.

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
from sim.engine.autoscaler import DRAINING, OFF


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
        autoscaler.fleet = CompiledFleet(core, autoscaler.fleet)
        autoscaler.clock = self.events
        if autoscaler.a.policy == "rate":
            t, order = run.table, core.order
            accepted = order[core.refusal[order] == 0]
            self._times = np.sort(t.arrival[accepted])
            autoscaler.arrival_rate = self._rate
        core.on_due = self._due
        # the first evaluation was created at 0 before any arrival or step: the earliest stamp
        self.events.later(autoscaler.a.interval_s, self._tick, stamp=-1)

    def _rate(self, now: float) -> float:
        """Accepted arrivals per second in (now − window, now] (``windowed_rate``)."""
        w = self.scaler.a.rate_window_s
        k = np.searchsorted(self._times, [now - w, now], side="right")
        return float(k[1] - k[0]) / min(w, now)

    def _due(self) -> None:
        self.settle(before=self.core.now)
        self.events.run_first()

    def _tick(self) -> None:
        """An evaluation; the next is due ``interval_s`` later, unless nothing else will ever
        happen (a stalled run: the kernel then reports it, as the SimPy engine does)."""
        if self._idle():
            return
        self.scaler.evaluate(self.core.now)
        self.events.later(self.scaler.a.interval_s, self._tick)

    def _idle(self) -> bool:
        """Whether the kernel has nothing scheduled and no other event of ours is pending."""
        st, core = self.core.state, self.core
        arrivals_left = st[K.CURSOR] < len(core.order)
        return not (st[K.STEPS] or st[K.HEAP] or st[K.QCOUNT] or st[K.PENDING] >= 0
                    or arrivals_left or self.events.pending())

    def settle(self, before: float = math.inf) -> None:
        """Log the stop of every draining replica that came to hold nothing before
        ``before``, at the time it did."""
        s = self.scaler
        for r in np.flatnonzero(s.state == DRAINING):
            r = int(r)
            # (one empty when it began to drain stops through its own event, at that time)
            at = max(float(self.core.pool[1][r, S.EMPTIED]), float(s.drained_at[r]))
            if self.core.pool[0][r, S.OUT] == 0 and at < before:
                s._set(r, OFF, at=at)
