"""An autoscaler in the loop: replicas of the pool start, serve, drain and stop as load moves.

The pool is built with ``max_replicas`` replicas; ``cluster.replicas`` of them are ready at
the start and the rest are off. Every ``interval_s`` the autoscaler recommends a count
(``hpa_recommendation`` on an engine metric, or ``slo_recommendation``), stabilises it
(``Stabilizer``, as Kubernetes' HPA behaviour) and acts on the difference:

- up: an off replica starts; it is billed from then and takes requests only once ready,
  ``scale_up_delay_s`` later (provisioning, its weights at the storage bandwidth, engine
  start-up), empty, as a repaired replica (``Cluster.repair``);
- down: a replica still starting is cancelled first (the newest), else the ready replica
  holding the fewest requests drains: the router stops sending it requests, it finishes
  those it holds, and it is off (unbilled) once it holds none. No request is lost in a
  drain.

Each state change is logged (``log``: time, replica, state), from which ``meta`` derives the
GPU-hours and the cost. The autoscaler reads the replicas as a metrics scraper would (the
scheduler's queues and KV usage at the instant of the evaluation), and the latencies (TTFT,
TPOT) of the requests completed in the last ``slo_window_s``. Kubernetes' default rate
limits on scaling (at most 4 pods or 100% more per 15 s up) are not modelled.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from sim.config.autoscaler import AutoscalerConfig
from sim.kv.budget import GIB

OFF, STARTING, READY, DRAINING = range(4)
STATES = ("off", "starting", "ready", "draining")
BILLED = (STARTING, READY, DRAINING)


def hpa_recommendation(ready: int, current: int, total: float, target: float,
                       tolerance: float) -> int:
    """Kubernetes HPA's count (``replica_calculator``'s plain-metric rule) on a per-replica
    metric summed to ``total`` over the ``ready`` replicas of ``current`` (ready and
    starting). Usage ``u = total / ready / target``: ``current`` while ``|u − 1|`` is within
    ``tolerance``, else ``ceil(total / target)``. When it would grow while replicas are
    starting, those count at zero load: ``u' = total / current / target``; ``current``
    while ``u'`` is within tolerance or below 1, else ``ceil(total / target)``."""
    usage = total / ready / target if ready else 0.0
    if not (current > ready and usage > 1.0):
        return current if abs(usage - 1.0) <= tolerance else math.ceil(total / target - 1e-9)
    with_starting = total / current / target
    if with_starting < 1.0 + tolerance:
        return current
    return max(current, math.ceil(total / target - 1e-9))


def slo_recommendation(ready: int, current: int, observed: list[tuple[float, float]],
                       waiting: int, scale_down_below: float) -> int:
    """The ``slo`` policy's count (``observed``: (quantile, bound) pairs of the last
    window; ``current``: replicas ready and starting): one more than ``ready`` when a
    quantile breaks its bound (a replica already starting is that one more), one fewer than
    ``current`` when every one is below ``scale_down_below`` × its bound and nothing waits,
    else ``current``; with nothing observed, one fewer if nothing waits, else one more."""
    grow, shrink = max(current, ready + 1), current - 1
    if not observed:
        return shrink if waiting == 0 else grow
    if any(q > b for q, b in observed):
        return grow
    if waiting == 0 and all(q < scale_down_below * b for q, b in observed):
        return shrink
    return current


class Stabilizer:
    """HPA's stabilisation windows: a count grows to the lowest recommendation of the last
    ``up_s`` seconds and shrinks to the highest of the last ``down_s``, never past the
    current count in the other direction."""

    def __init__(self, up_s: float, down_s: float) -> None:
        self.up_s, self.down_s = up_s, down_s
        self.history: deque[tuple[float, int]] = deque()

    def __call__(self, now: float, recommended: int, current: int) -> int:
        """The count to scale to now, given this evaluation's recommendation (HPA keeps the
        recommendations strictly inside a window, and this one)."""
        horizon = now - max(self.up_s, self.down_s)
        while self.history and self.history[0][0] <= horizon:
            self.history.popleft()
        self.history.append((now, recommended))

        def recent(window_s: float) -> list[int]:
            return [r for t, r in self.history if t > now - window_s or t == now]

        if recommended > current:
            return max(current, min(recent(self.up_s)))
        if recommended < current:
            return min(current, max(recent(self.down_s)))
        return current


def scale_up_delay_s(a: AutoscalerConfig, weight_bytes_per_gpu: float) -> float:
    """Seconds from a scale-up decision to a ready replica: provisioning, each GPU loading
    its shard of the weights at ``storage_bandwidth``, and the engine's start-up."""
    return a.provision_s + weight_bytes_per_gpu / a.storage_bandwidth + a.engine_start_s


class Autoscaler:
    """Resizes ``pool`` of ``cluster`` in the loop (module doc)."""

    def __init__(self, cluster, pool, a: AutoscalerConfig, gpus_per_replica: int) -> None:
        self.cluster, self.pool, self.a = cluster, pool, a
        self.env = cluster.env
        self.gpus = int(gpus_per_replica)
        n = len(pool.replicas)
        self.state = np.full(n, OFF, np.int8)
        self.state[:cluster.cfg.cluster.replicas] = READY
        self._epoch = np.zeros(n, np.int64)  # bumped when a start is cancelled
        self._started_at = np.zeros(n)
        self.delay_s = scale_up_delay_s(a, pool.parts[0].meta["weights_gib_per_gpu"] * GIB)
        self.stabilize = Stabilizer(a.scale_up_stabilization_s, a.scale_down_stabilization_s)
        self.log: list[tuple[float, int, int]] = [(0.0, r, int(s))
                                                  for r, s in enumerate(self.state)]
        self._ttft: deque[tuple[float, float]] = deque()  # (completed at, ttft s)
        self._tpot: deque[tuple[float, float]] = deque()
        for r in np.flatnonzero(self.state == OFF):
            pool.view.set_alive(int(r), False)
        self._finish, pool.on_finish = pool.on_finish, self._finished
        self.process = self.env.process(self._run())

    # ---- observing ----------------------------------------------------------------------
    def _finished(self, pool, r: int, ids: np.ndarray, now: float) -> None:
        self._finish(pool, r, ids, now)
        if self.a.policy == "slo":  # kept by when the engine reported them (in time order)
            t = pool.table
            for rid in ids:
                self._ttft.append((now, float(t.first_token[rid] - t.arrival[rid])))
                if t.generated[rid] > 1:
                    self._tpot.append((now, float((t.completion[rid] - t.first_token[rid])
                                                  / (t.generated[rid] - 1))))
        if self.state[r] == DRAINING and pool.view.outstanding[r] == 0:
            # the replica's own step told us: it stops once that step has returned
            self.env.timeout(0).callbacks.append(lambda _e, r=r: self._stop(r))

    def _observed(self, now: float) -> list[tuple[float, float]]:
        """(quantile, bound) of each watched latency over the last window (s)."""
        a, out = self.a, []
        for samples, bound in ((self._ttft, a.slo_ttft_ms), (self._tpot, a.slo_tpot_ms)):
            while samples and samples[0][0] < now - a.slo_window_s:
                samples.popleft()
            if bound is not None and samples:
                values = np.fromiter((v for _, v in samples), float, len(samples))
                out.append((float(np.quantile(values, a.slo_quantile)), bound * 1e-3))
        return out

    def _metric(self, ready: np.ndarray) -> float:
        """The policy's metric summed over the ready replicas."""
        v, policy = self.pool.view, self.a.policy
        if policy == "queue":
            return float(sum(len(v.waiting_ids(int(r))) for r in ready))
        if policy == "running":
            return float(sum(len(v.schedulers[int(r)].running) for r in ready))
        return float(sum(v.used_blocks(int(r)) / max(v.schedulers[int(r)].kv.num_blocks, 1)
                         for r in ready))

    # ---- deciding -----------------------------------------------------------------------
    def _run(self):
        a = self.a
        while True:
            yield self.env.timeout(a.interval_s)
            if self.env.peek() == math.inf:  # nothing else will ever happen: a stalled run,
                return  # which the event loop reports once this process stops ticking
            now = self.env.now
            ready = np.flatnonzero(self.state == READY)
            active = len(ready) + int((self.state == STARTING).sum())
            if a.policy == "slo":
                waiting = sum(len(self.pool.view.waiting_ids(int(r))) for r in ready)
                want = slo_recommendation(len(ready), active, self._observed(now), waiting,
                                          a.scale_down_below)
            else:
                want = hpa_recommendation(len(ready), active, self._metric(ready), a.target,
                                          a.tolerance)
            want = min(max(want, a.min_replicas), a.max_replicas)
            self._resize(self.stabilize(now, want, active), active)

    def _resize(self, target: int, active: int) -> None:
        """Start or remove replicas until ``target`` are ready or starting."""
        s = self.state
        for r in np.flatnonzero(s == OFF)[:max(target - active, 0)]:
            self._start(int(r))
        for _ in range(max(active - target, 0)):
            starting = np.flatnonzero(s == STARTING)
            if len(starting):  # the newest start first
                self._cancel(int(starting[np.argmax(self._started_at[starting])]))
                continue
            ready = np.flatnonzero(s == READY)
            self._drain(int(ready[np.argmin(self.pool.view.outstanding[ready])]))

    # ---- acting -------------------------------------------------------------------------
    def _set(self, r: int, state: int) -> None:
        self.state[r] = state
        self.log.append((float(self.env.now), r, state))

    def _start(self, r: int) -> None:
        self._set(r, STARTING)
        self._started_at[r] = self.env.now
        epoch = self._epoch[r]
        self.env.timeout(self.delay_s).callbacks.append(
            lambda _e, r=r, k=epoch: self._ready(r, k))

    def _ready(self, r: int, epoch: int) -> None:
        if self._epoch[r] != epoch or self.state[r] != STARTING:  # cancelled meanwhile
            return
        self._set(r, READY)
        self.cluster.repair(self.pool, r)  # up and empty; parked requests are routed

    def _cancel(self, r: int) -> None:
        self._epoch[r] += 1
        self._set(r, OFF)

    def _drain(self, r: int) -> None:
        self._set(r, DRAINING)
        self.pool.view.set_alive(r, False)  # the router sends it nothing more
        self.pool.router.forget(r)
        if self.pool.view.outstanding[r] == 0:
            # stopped after this instant's events: a replica made ready at this very instant
            # has not yet resumed from its restart, where it cannot be interrupted
            self.env.timeout(0).callbacks.append(lambda _e: self._stop(r))

    def _stop(self, r: int) -> None:
        """A drained replica goes off: its engine stops (``Replica.fail``: it holds nothing)
        until a later start."""
        if self.state[r] != DRAINING or self.pool.view.outstanding[r]:
            return
        self._set(r, OFF)
        self.pool.replicas[r].fail()

    # ---- records ------------------------------------------------------------------------
    def meta(self, now: float) -> dict:
        """What the run hands over: the policy, the delay its settings give, the state log
        (``time_s, replica, state`` rows, ``STATES`` codes), GPU-hours and cost to ``now``."""
        log = np.array(self.log, float).reshape(-1, 3)
        gpu_hours = state_seconds(log, BILLED, 0.0, now) * self.gpus / 3600.0
        return {"policy": self.a.policy, "scale_up_delay_s": self.delay_s,
                "gpus_per_replica": self.gpus, "gpu_hour_price": self.a.gpu_hour_price,
                "gpu_hours": gpu_hours, "cost": gpu_hours * self.a.gpu_hour_price,
                "scale_ups": int(((log[:, 0] > 0) & (log[:, 2] == STARTING)).sum()),
                "drains": int((log[:, 2] == DRAINING).sum()),
                "log": log}


def _stretches(log: np.ndarray):
    """Per replica of a ``(time, replica, state)`` log: each stretch's start, end (the last
    open, ``inf``) and state."""
    for r in np.unique(log[:, 1]):
        rows = log[log[:, 1] == r]
        yield rows[:, 0], np.append(rows[1:, 0], np.inf), rows[:, 2]


def state_seconds(log: np.ndarray, states, start: float, until: float) -> float:
    """Replica-seconds spent in any of ``states`` within ``[start, until)``, from a
    ``(time, replica, state)`` log whose first rows give every replica's state at 0."""
    total = 0.0
    for begins, ends, state in _stretches(log):
        lo, hi = np.maximum(begins, start), np.minimum(ends, until)
        total += float(np.clip(hi - lo, 0.0, None)[np.isin(state, states)].sum())
    return total


def while_starting(log: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Per time of ``times``: whether some replica was starting then (a ramp's arrivals)."""
    lo, hi = [], []
    for begins, ends, state in _stretches(log):
        lo.append(begins[state == STARTING])
        hi.append(ends[state == STARTING])
    lo, hi = np.sort(np.concatenate(lo)), np.sort(np.concatenate(hi))
    return np.searchsorted(lo, times, side="right") > np.searchsorted(hi, times, side="right")
