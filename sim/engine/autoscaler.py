"""An autoscaler in the loop: replicas of the pool (or diffusion nodes) start, serve, drain
and stop as load moves.

The pool is built with ``max_replicas`` replicas; ``cluster.replicas`` of them are ready at
the start and the rest are off (a diffusion pool: ``max_replicas`` nodes, ``cluster.nodes``
ready; ``sim.diffusion.node_fleet``). Every ``interval_s`` the autoscaler recommends a count
(``hpa_recommendation`` on an engine metric, or ``slo_recommendation``;
``sim.engine.scaling_policy``), stabilises it (``Stabilizer``, as Kubernetes' HPA
behaviour) and acts on the difference:

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
TPOT, end to end) of the requests (or jobs) completed in the last ``slo_window_s``.
Kubernetes' default rate limits on scaling (at most 4 pods or 100% more per 15 s up) are not
modelled.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from sim.config.autoscaler import AutoscalerConfig
from sim.engine.scaling_policy import (  # noqa: F401 (the policies, read from here too)
    Stabilizer,
    hpa_recommendation,
    scale_up_delay_s,
    slo_recommendation,
    windowed_rate,
)
from sim.kv.budget import GIB

OFF, STARTING, READY, DRAINING = range(4)
STATES = ("off", "starting", "ready", "draining")
BILLED = (STARTING, READY, DRAINING)
# the latencies the slo policy can watch, and the field of each one's bound (ms)
SLO_BOUNDS = {"ttft": "slo_ttft_ms", "tpot": "slo_tpot_ms", "latency": "slo_latency_ms"}


class SimClock:
    """The autoscaler's time on a SimPy environment: ``now``, and ``later(delay, action)``
    (an event ``delay`` from now, ordered after those created before it)."""

    def __init__(self, env) -> None:
        self.env = env

    @property
    def now(self) -> float:
        return self.env.now

    def later(self, delay: float, action) -> None:
        self.env.timeout(delay).callbacks.append(lambda _e: action())


class Autoscaler:
    """Resizes ``fleet`` (a ``ReplicaFleet`` of LLM replicas, or diffusion nodes:
    ``sim.diffusion.node_fleet.NodeFleet``) in the loop of ``env`` (module doc); the first
    ``ready`` of its units are ready at the start. The fleet tells it what finished
    (``finished``) and asks it to stop a drained unit (``check_drained``). The compiled
    loop runs it (``run_on``): another clock and fleet, the same decisions."""

    def __init__(self, env, fleet, a: AutoscalerConfig, ready: int) -> None:
        self.env, self.fleet, self.a = env, fleet, a
        self.clock = SimClock(env)
        self.gpus = int(fleet.gpus_per_unit)
        n = fleet.size
        self.state = np.full(n, OFF, np.int8)
        self.state[:ready] = READY
        self._epoch = np.zeros(n, np.int64)  # bumped when a start is cancelled
        self._started_at = np.zeros(n)
        self.delay_s = scale_up_delay_s(a, fleet.weight_bytes_per_gpu)
        self.stabilize = Stabilizer(a.scale_up_stabilization_s, a.scale_down_stabilization_s)
        self.log: list[tuple[float, int, int]] = [(0.0, r, int(s))
                                                  for r, s in enumerate(self.state)]
        # per watched latency: its bound (s) and (reported at, value s) of recent completions
        self.bounds = {name: getattr(a, field) * 1e-3 for name, field in SLO_BOUNDS.items()
                       if a.policy == "slo" and getattr(a, field) is not None}
        self._samples: dict[str, deque[tuple[float, float]]] = {n: deque() for n in self.bounds}
        self._arrivals: deque[float] = deque()  # the rate policy's: arrival times, recent
        for r in np.flatnonzero(self.state == OFF):
            fleet.routable(int(r), False)
        fleet.attach(self)
        self.process = env.process(self._run())

    def run_on(self, clock, fleet, arrival_rate=None) -> None:
        """Decide on another event loop than SimPy's (``sim.compiled.scaling``): its
        ``clock`` (``now``, ``later``), its ``fleet`` and (``rate``) its
        ``arrival_rate(now)``; that loop calls ``evaluate`` and ``stopped``. The SimPy
        process built with the object is never run there."""
        self.clock, self.fleet = clock, fleet
        if arrival_rate is not None:
            self.arrival_rate = arrival_rate

    def stopped(self, r: int, at: float) -> None:
        """Draining unit ``r`` held nothing from ``at`` on (an earlier time, reported late
        by the compiled loop): it went off then."""
        self._set(r, OFF, at=at)

    # ---- observing ----------------------------------------------------------------------
    def finished(self, now: float, samples: dict[str, np.ndarray]) -> None:
        """Work finished now; ``samples``: its latencies (s) by name (``SLO_BOUNDS``), kept
        by when they were reported (in time order) while the SLO policy watches them."""
        for name, kept in self._samples.items():
            kept.extend((now, float(v)) for v in samples.get(name, ()))

    def arrived(self, now: float) -> None:
        """A request (or job) reached the fleet now."""
        if self.a.policy == "rate":
            self._arrivals.append(now)

    def check_drained(self, r: int) -> None:
        """Unit ``r`` may hold nothing now: if it is draining, it stops after this instant's
        events (the unit's own step or job has returned by then; a replica made ready at this
        very instant has not yet resumed from its restart, where it cannot be
        interrupted)."""
        if self.state[r] == DRAINING and self.fleet.outstanding(r) == 0:
            self.clock.later(0.0, lambda: self._stop(r))

    def _observed(self, now: float) -> list[tuple[float, float]]:
        """(quantile, bound) of each watched latency over the last window (s)."""
        a, out = self.a, []
        for name, samples in self._samples.items():
            while samples and samples[0][0] < now - a.slo_window_s:
                samples.popleft()
            if samples:
                values = np.fromiter((v for _, v in samples), float, len(samples))
                out.append((float(np.quantile(values, a.slo_quantile)), self.bounds[name]))
        return out

    # ---- deciding -----------------------------------------------------------------------
    def _run(self):
        while True:
            yield self.env.timeout(self.a.interval_s)
            if self.env.peek() == math.inf:  # nothing else will ever happen: a stalled run,
                return  # which the event loop reports once this process stops ticking
            self.evaluate(self.env.now)

    def evaluate(self, now: float) -> None:
        """One evaluation: recommend, stabilise, start or remove units."""
        a, fleet = self.a, self.fleet
        ready = np.flatnonzero(self.state == READY)
        active = len(ready) + int((self.state == STARTING).sum())
        if a.policy == "slo":
            want = slo_recommendation(len(ready), active, self._observed(now),
                                      fleet.waiting(ready), a.scale_down_below)
        else:
            total = (self.arrival_rate(now) if a.policy == "rate"
                     else fleet.metric(a.policy, ready))
            want = hpa_recommendation(len(ready), active, total, a.target, a.tolerance)
        want = min(max(want, a.min_replicas), a.max_replicas)
        self._resize(self.stabilize(now, want, active), active)

    def arrival_rate(self, now: float) -> float:
        """The ``rate`` policy's metric: arrivals per second over the last window."""
        return windowed_rate(self._arrivals, now, self.a.rate_window_s)

    def _resize(self, target: int, active: int) -> None:
        """Start or remove units until ``target`` are ready or starting."""
        s = self.state
        for r in np.flatnonzero(s == OFF)[:max(target - active, 0)]:
            self._start(int(r))
        for _ in range(max(active - target, 0)):
            starting = np.flatnonzero(s == STARTING)
            if len(starting):  # the newest start first
                self._cancel(int(starting[np.argmax(self._started_at[starting])]))
                continue
            ready = np.flatnonzero(s == READY)
            held = [self.fleet.outstanding(int(r)) for r in ready]
            self._drain(int(ready[int(np.argmin(held))]))

    # ---- acting -------------------------------------------------------------------------
    def _set(self, r: int, state: int, at: float | None = None) -> None:
        """Unit ``r`` is in ``state`` from now (or from ``at``, earlier: a drain the compiled
        loop reports after it ended)."""
        self.state[r] = state
        self.log.append((float(self.clock.now if at is None else at), r, state))

    def _start(self, r: int) -> None:
        self._set(r, STARTING)
        self._started_at[r] = self.clock.now
        epoch = self._epoch[r]
        self.clock.later(self.delay_s, lambda: self._ready(r, epoch))

    def _ready(self, r: int, epoch: int) -> None:
        if self._epoch[r] != epoch or self.state[r] != STARTING:  # cancelled meanwhile
            return
        self._set(r, READY)
        self.fleet.bring_up(r)  # up, empty and routable; waiting work may start on it

    def _cancel(self, r: int) -> None:
        self._epoch[r] += 1
        self._set(r, OFF)

    def _drain(self, r: int) -> None:
        self._set(r, DRAINING)
        self.fleet.routable(r, False)  # the router (or dispatcher) sends it nothing more
        self.check_drained(r)

    def _stop(self, r: int) -> None:
        """A drained unit goes off (it holds nothing) until a later start."""
        if self.state[r] != DRAINING or self.fleet.outstanding(r):
            return
        self._set(r, OFF)
        self.fleet.shut_down(r)

    # ---- records ------------------------------------------------------------------------
    def meta(self, now: float) -> dict:
        """What the run hands over: the policy, the delay its settings give, the state log
        (``time_s, replica, state`` rows, ``STATES`` codes), GPU-hours and cost to ``now``."""
        log = np.array(self.log, float).reshape(-1, 3)
        log = log[np.argsort(log[:, 0], kind="stable")]  # (late-reported drains in place)
        gpu_hours = state_seconds(log, BILLED, 0.0, now) * self.gpus / 3600.0
        return {"policy": self.a.policy, "scale_up_delay_s": self.delay_s,
                "gpus_per_replica": self.gpus, "gpu_hour_price": self.a.gpu_hour_price,
                "gpu_hours": gpu_hours, "cost": gpu_hours * self.a.gpu_hour_price,
                "scale_ups": int(((log[:, 0] > 0) & (log[:, 2] == STARTING)).sum()),
                "drains": int((log[:, 2] == DRAINING).sum()),
                "log": log}


class ReplicaFleet:
    """The LLM replicas of one pool as the autoscaler sees and moves them: routable or not
    (``PoolView.set_alive``), requests held, the policies' engine metrics, started by
    ``Cluster.repair`` and stopped by ``Replica.fail``."""

    def __init__(self, cluster, pool, gpus_per_replica: int) -> None:
        self.cluster, self.pool = cluster, pool
        self.size = len(pool.replicas)
        self.gpus_per_unit = gpus_per_replica
        self.weight_bytes_per_gpu = pool.parts[0].meta["weights_gib_per_gpu"] * GIB

    def attach(self, scaler: Autoscaler) -> None:
        """Report finished requests on each replica to ``scaler``."""
        self.scaler = scaler
        self._finish, self.pool.on_finish = self.pool.on_finish, self._finished

    def _finished(self, pool, r: int, ids: np.ndarray, now: float) -> None:
        self._finish(pool, r, ids, now)
        if self.scaler.bounds:
            t = pool.table
            ttft = t.first_token[ids] - t.arrival[ids]
            many = t.generated[ids] > 1
            tpot = ((t.completion[ids] - t.first_token[ids])[many]
                    / (t.generated[ids][many] - 1))
            self.scaler.finished(now, {"ttft": ttft, "tpot": tpot,
                                       "latency": t.completion[ids] - t.arrival[ids]})
        self.scaler.check_drained(r)

    def routable(self, r: int, on: bool) -> None:
        self.pool.view.set_alive(r, on)
        if not on:
            self.pool.router.forget(r)

    def outstanding(self, r: int) -> int:
        return int(self.pool.view.outstanding[r])

    def waiting(self, ready: np.ndarray) -> int:
        return sum(len(self.pool.view.waiting_ids(int(r))) for r in ready)

    def metric(self, policy: str, ready: np.ndarray) -> float:
        """The policy's metric summed over the ``ready`` replicas."""
        v = self.pool.view
        if policy == "queue":
            return float(self.waiting(ready))
        if policy == "running":
            return float(sum(len(v.schedulers[int(r)].running) for r in ready))
        return float(sum(v.used_blocks(int(r)) / max(v.schedulers[int(r)].kv.num_blocks, 1)
                         for r in ready))

    def bring_up(self, r: int) -> None:
        self.cluster.repair(self.pool, r)  # up and empty; parked requests are routed

    def shut_down(self, r: int) -> None:
        self.pool.replicas[r].fail()  # its engine stops: it holds nothing


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
