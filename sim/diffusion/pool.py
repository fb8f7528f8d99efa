"""The diffusion node pool: ``nodes`` nodes of ``gpus_per_node`` GPUs serving a job stream.

A job (a *unit*: one request, or a batch of same-shape image requests) takes a gang of GPUs of
one node for a run of ``encode_s + steps × step_s + decode_s`` (``sim.diffusion.job``); the
policy (``sim.diffusion.policies``) orders the queue, ``GangSizer`` picks the gang and node.
Jobs start in the policy's order, the head first: when it cannot start, the ones behind it
wait too (no backfilling), and a preemptive policy may pause less urgent gangs for it.

Time belongs to SimPy, and a run is one timeout: its completion is an event in the future.
A pause (preemption) or a node failure bumps the unit's ``run_id`` so that the stale event
is ignored. A pause takes effect at the next step boundary (the end of the text encoding or
of the step in progress, computed from the run's start, so it is exact without an event per
step); a job whose last step has begun is not paused. A paused job keeps its encoded prompt
and its completed steps and queues again; it may resume on another node and gang.

Node failures (``cluster.failure``: exponential times of mean ``mtbf_s`` per node, stream
``(NODE_FAULT_STREAM, node)``; back empty ``mttr_s`` later, or never) stop every gang on the
node: with ``cluster.checkpointing`` a job resumes from its last completed step, else from
the start; a job restarted more than ``failure.max_retries`` times fails
(``retries_exhausted``), and when every node is lost for good the waiting jobs fail
(``no_node_left``). A job no gang size can run (no valid plan) is rejected at arrival.
Closed-loop jobs (``client``, ``think_time_s`` columns; NaN arrivals) are released their think
time after the same client's previous job ended, as LLM requests are (``sim.engine``).
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import partial

import numpy as np
import simpy

from sim.diffusion.job import JobShape, JobTiming, ParallelPlan
from sim.diffusion.policies import JobQueue, NodeView, build_policy
from sim.diffusion.policies.gang import GangSizer
from sim.diffusion.records import (
    COMPLETED,
    FAILED,
    NO_NODE_LEFT,
    NO_VALID_PLAN,
    QUEUED,
    REJECTED,
    RETRIES_EXHAUSTED,
    RUNNING,
    DiffusionRecords,
    JobTable,
    node_buffer,
)
from sim.engine import next_of_client
from sim.errors import ConfigError

NODE_FAULT_STREAM = 8  # spawn key under the run SeedSequence (cluster 2, 4; faults 5, 6; jobs 7)
EPS = 1e-9  # relative slack when finding the step in progress


class Unit:
    """Jobs that run as one gang: one job, or a batch of same-shape image jobs."""

    __slots__ = ("uid", "ids", "shape", "sid", "key", "priority", "seq", "encoded", "steps_done",
                 "predicted_s", "node", "gpus", "timing", "run_start", "run_id", "draining",
                 "restarts")

    def __init__(self, uid: int, ids: list[int], shape: JobShape, key: tuple, priority: int,
                 seq: int) -> None:
        self.uid, self.ids, self.shape, self.key = uid, ids, shape, key
        self.sid = -1  # the pool's id of ``shape`` (its timing cache key)
        self.priority, self.seq = priority, seq
        self.encoded, self.steps_done, self.restarts = False, 0, 0
        self.predicted_s = 0.0
        self.node, self.gpus, self.timing = -1, 0, None
        self.run_start, self.run_id, self.draining = math.nan, 0, False

    @property
    def fresh(self) -> bool:
        """Never started: it may still join a batch."""
        return not self.encoded and self.steps_done == 0 and self.restarts == 0 and \
            self.timing is None


class NodePool:
    """The SimPy side of ``cluster=diffusion``: arrivals, gangs, pauses, node failures."""

    def __init__(self, env: simpy.Environment, cluster, gpus_per_node: int, cost, jobs,
                 seed: int = 0, progress=None, check_invariants: bool = False) -> None:
        """``cluster``: a ``ClusterConfig`` (its diffusion fields); ``cost``: a
        ``DiffusionCost``; ``jobs``: the job table (``sim.diffusion.job.JOB_COLUMNS``)."""
        self.env, self.cost, self.jobs_frame, self.progress = env, cost, jobs, progress
        self.c, self.G, self.n = cluster, int(gpus_per_node), int(cluster.nodes)
        self.table = JobTable(jobs)
        n = self.table.size
        client = jobs["client"].to_numpy(np.int64) if "client" in jobs else np.full(n, -1)
        self.next_of = next_of_client(client)
        self.think = (jobs["think_time_s"].to_numpy(np.float64) if "think_time_s" in jobs
                      else np.zeros(n))
        self.policy = build_policy(cluster.policy, cluster.preemption)
        self.queue = JobQueue(self.policy)
        self.sizer = GangSizer(self.G, cluster.gpus_per_job, cluster.elastic)
        self.plan = _fixed_plan(cluster.parallel)
        self.max_images = int(cluster.batching.max_images)
        # per node, plain lists: a pool has few nodes and these change at every event
        self.free = [self.G] * self.n
        self.draining = [0] * self.n
        self.up = [True] * self.n
        self.lost_nodes = 0
        self.running: list[set[Unit]] = [set() for _ in range(self.n)]
        self.forming: dict[tuple, Unit] = {}
        self.by_key: dict[tuple, list[Unit]] = {}  # fresh queued batchable units per shape
        self.nodes = node_buffer()
        self.failure_log: list[list] = []
        self._timings: dict[tuple[int, int], JobTiming | None] = {}
        self._shape_ids: dict[JobShape, int] = {}
        self._uid = 0
        self._ended = 0
        self._dispatching = False
        self.done = env.event()
        self.checker = None
        if check_invariants:
            from sim.invariants import PoolChecker
            self.checker = PoolChecker(self)
        for node in range(self.n):
            self._log(node)
        self._shapes = self._job_shapes(jobs)
        self._check_shapes()
        if self.table.size == 0:
            self.done.succeed()
        env.process(self._arrivals())
        if cluster.failure.mtbf_s is not None:
            for node in range(self.n):
                ss = np.random.SeedSequence(seed, spawn_key=(NODE_FAULT_STREAM, node))
                env.process(self._failures(node, np.random.default_rng(ss)))

    # ---- jobs, shapes and timings -------------------------------------------------------
    @staticmethod
    def _job_shapes(jobs) -> list[JobShape]:
        cols = [jobs[c].to_numpy() for c in ("model", "height", "width", "frames", "steps",
                                             "images", "guidance")]
        return [JobShape(str(m), int(h), int(w), int(f), int(s), int(i), str(g))
                for m, h, w, f, s, i, g in zip(*cols, strict=True)]

    def timing(self, shape: JobShape, gpus: int) -> JobTiming | None:
        """The job's time on ``gpus`` GPUs (the fixed plan, or the best one); None when no
        plan of that size can run it."""
        return self._timing(shape, self._shape_id(shape), gpus)

    def _timing(self, shape: JobShape, sid: int, gpus: int) -> JobTiming | None:
        k = (sid, gpus)
        if k not in self._timings:
            try:
                t = (self.cost.timing(shape, self.plan) if self.plan is not None
                     else self.cost.best(shape, gpus))
            except ConfigError:
                t = None
            self._timings[k] = t
        return self._timings[k]

    def _check_shapes(self) -> None:
        """Every job's own shape must be one its pipeline can make (checked on one GPU, or
        on the fixed plan, which must run it): else one error naming the workload field,
        before the run. (A batch a fixed plan cannot run is just not formed.)"""
        one = self.plan or ParallelPlan()
        for shape in dict.fromkeys(self._shapes):
            try:
                self.cost.timing(shape, one)
            except ConfigError as e:
                field = e.field
                if field.startswith("job."):
                    field = "workload." + field[4:]
                raise ConfigError(field, e.value, e.expected) from None

    def _remaining_s(self, unit: Unit, t: JobTiming) -> float:
        return ((0.0 if unit.encoded else t.encode_s) + (t.steps - unit.steps_done) * t.step_s
                + t.decode_s)

    def _predict(self, unit: Unit) -> None:
        """``predicted_s`` (for sjf): the work left, on the largest valid gang size."""
        for g in reversed(self.sizer.sizes):
            t = self._timing(unit.shape, unit.sid, g)
            if t is not None:
                unit.predicted_s = self._remaining_s(unit, t)
                return

    def _valid(self, unit: Unit):
        return lambda g: self._timing(unit.shape, unit.sid, g) is not None

    def _shape_id(self, shape: JobShape) -> int:
        sid = self._shape_ids.get(shape)
        if sid is None:
            sid = self._shape_ids[shape] = len(self._shape_ids)
        return sid

    # ---- arrivals and batching ----------------------------------------------------------
    def _arrivals(self):
        t = self.table
        first = np.flatnonzero(~np.isnan(t.arrival))  # closed-loop follow-ups come later
        for jid in first[np.argsort(t.arrival[first], kind="stable")]:
            delay = t.arrival[jid] - self.env.now
            if delay > 0:
                yield self.env.timeout(delay)
            self.arrive(int(jid))

    def arrive(self, jid: int) -> None:
        """Job ``jid`` reaches the pool now: rejected, failed (no node left), batched or
        queued."""
        t, shape = self.table, self._shapes[jid]
        t.arrival[jid] = self.env.now
        unit = self._new_unit([jid], shape, int(t.priority[jid]))
        if self.sizer.need(self._valid(unit)) is None:
            self._end([jid], REJECTED, reject=NO_VALID_PLAN)
        elif self.lost_nodes == self.n:
            self._end([jid], FAILED, fail=NO_NODE_LEFT)
        elif self._batchable(unit) and self.c.batching.max_wait_s > 0:
            self._form(unit)
        else:
            self._enqueue(unit)
        self._check("after an arrival")

    def _new_unit(self, ids: list[int], shape: JobShape, priority: int) -> Unit:
        self._uid += 1
        key = (shape.model, shape.height, shape.width, shape.frames, shape.steps,
               shape.guidance, priority)
        unit = Unit(self._uid, ids, shape, key, priority, self._uid)
        unit.sid = self._shape_id(shape)
        return unit

    def _batchable(self, unit: Unit) -> bool:
        return (self.max_images > 1 and unit.shape.frames == 1
                and unit.shape.images < self.max_images)

    def _form(self, unit: Unit) -> None:
        """Add a batchable job to the open batch of its shape (sealed when full, or
        ``batching.max_wait_s`` after its first job arrived)."""
        open_ = self.forming.get(unit.key)
        if open_ is not None and open_.shape.images + unit.shape.images > self.max_images:
            self._seal(open_.uid, open_.key)
            open_ = None
        if open_ is None:
            self.forming[unit.key] = unit
            self.table.status[unit.ids] = QUEUED
            timer = self.env.timeout(self.c.batching.max_wait_s)
            timer.callbacks.append(lambda _e, u=unit.uid, k=unit.key: self._seal(u, k))
            return
        self._absorb(open_, unit)
        if open_.shape.images >= self.max_images:
            self._seal(open_.uid, open_.key)

    def _absorb(self, into: Unit, other: Unit) -> None:
        into.ids = into.ids + other.ids
        into.shape = replace(into.shape, images=into.shape.images + other.shape.images)
        into.sid = self._shape_id(into.shape)
        self.table.status[other.ids] = QUEUED

    def _seal(self, uid: int, key: tuple) -> None:
        unit = self.forming.get(key)
        if unit is None or unit.uid != uid:
            return  # sealed already
        del self.forming[key]
        self._enqueue(unit)
        self._check("after a batch was sealed")

    def _enqueue(self, unit: Unit) -> None:
        for i in unit.ids:
            self.table.status[i] = QUEUED
        self._predict(unit)
        self.queue.push(unit)
        if unit.fresh and self._batchable(unit):
            self.by_key.setdefault(unit.key, []).append(unit)
        self.dispatch()

    def _merge(self, unit: Unit) -> Unit:
        """A fresh batchable unit leaving the queue takes queued jobs of its shape along, up
        to ``batching.max_images`` images (a batch no plan of its gang runs is not formed)."""
        peers = self.by_key.get(unit.key)
        if not peers:
            return unit
        keep = []
        for v in peers:
            if v is unit or v not in self.queue:
                continue
            if unit.shape.images + v.shape.images <= self.max_images and \
                    self.timing(replace(unit.shape, images=unit.shape.images
                                        + v.shape.images), unit.gpus) is not None:
                self.queue.remove(v)
                self._absorb(unit, v)
            else:
                keep.append(v)
        self.by_key[unit.key] = keep
        return unit

    # ---- dispatch, runs, pauses ---------------------------------------------------------
    def dispatch(self) -> None:
        """Start queued units, in the policy's order, while the head one fits."""
        if self._dispatching:
            return
        self._dispatching = True
        try:
            while True:
                unit = self.queue.peek()
                if unit is None:
                    return
                place = self.sizer.place(self.free, len(self.queue), self._valid(unit))
                if place is None:
                    if self.policy.preemptive:
                        self._preempt_for(unit)
                    return
                self.queue.pop()
                unit.gpus = place[1]
                self._start(self._merge(unit), *place)
        finally:
            self._dispatching = False

    def _start(self, unit: Unit, node: int, gpus: int) -> None:
        now, t = self.env.now, self.table
        timing = self._timing(unit.shape, unit.sid, gpus)
        self.free[node] -= gpus
        self.running[node].add(unit)
        unit.node, unit.gpus, unit.timing, unit.run_start = node, gpus, timing, now
        unit.run_id += 1
        unit.draining = False
        plan = t.label_id(timing.plan.label())
        for i in unit.ids:  # a few jobs per unit: scalar stores beat numpy's fancy indexing
            if t.start[i] != t.start[i]:  # NaN: its first start
                t.start[i] = now
            t.node[i], t.gpus[i], t.status[i], t.plan[i] = node, gpus, RUNNING, plan
            t.steps[i], t.step_s[i], t.batch[i] = timing.steps, timing.step_s, len(unit.ids)
        ev = self.env.timeout(self._remaining_s(unit, timing))
        ev.callbacks.append(partial(self._finish, unit, unit.run_id))
        self._log(node)
        self._check("after a gang started")

    def _stop(self, unit: Unit, steps_done: int, encoded: bool) -> None:
        """End the unit's run now: its GPUs back to its node, its progress kept as given."""
        now, t = self.env.now, self.table
        tm = unit.timing
        first_step = unit.run_start + tm.encode_s
        crossed = not unit.encoded and now >= first_step
        for i in unit.ids:
            if crossed and t.first_step[i] != t.first_step[i]:
                t.first_step[i] = first_step
            t.service[i] += now - unit.run_start
            t.steps_done[i] = steps_done
        if self.up[unit.node]:  # a failed node's GPUs are gone with it
            self.free[unit.node] += unit.gpus
            if unit.draining:
                self.draining[unit.node] -= unit.gpus
        self.running[unit.node].discard(unit)
        self._log(unit.node)
        unit.run_id += 1
        unit.steps_done, unit.encoded, unit.draining = steps_done, encoded, False

    def _finish(self, unit: Unit, run_id: int, _event=None) -> None:
        if unit.run_id != run_id:
            return  # paused or failed since
        self._stop(unit, unit.timing.steps, True)
        self._end(unit.ids, COMPLETED)
        self._check("after a job completed")
        self.dispatch()

    def _boundary(self, unit: Unit, now: float) -> tuple[float, int] | None:
        """(time, steps done then) of the unit's next step boundary at or after ``now``;
        None once its last step has begun (it completes instead)."""
        tm = unit.timing
        enc = 0.0 if unit.encoded else tm.encode_s
        elapsed = now - unit.run_start - enc
        if elapsed < 0:
            return unit.run_start + enc, unit.steps_done
        k = math.ceil(elapsed / tm.step_s - EPS) if tm.step_s > 0 else 0
        if k >= tm.steps - unit.steps_done:
            return None
        return unit.run_start + enc + k * tm.step_s, unit.steps_done + k

    def _preempt_for(self, unit: Unit) -> None:
        need = self.sizer.need(self._valid(unit))
        views = [NodeView(n, self.free[n], self.draining[n],
                          [u for u in self.running[n] if not u.draining])
                 for n in range(self.n) if self.up[n]]
        for v in self.policy.victims(unit, need, views):
            b = self._boundary(v, self.env.now)
            if b is None:
                continue
            v.draining = True
            self.draining[v.node] += v.gpus
            ev = self.env.timeout(b[0] - self.env.now)
            ev.callbacks.append(partial(self._pause, v, v.run_id, b[1]))

    def _pause(self, unit: Unit, run_id: int, steps_done: int, _event=None) -> None:
        if unit.run_id != run_id:
            return  # its node failed meanwhile
        self._stop(unit, steps_done, True)
        self.table.preemptions[unit.ids] += 1
        self._enqueue(unit)
        self._check("after a gang paused")

    # ---- endings ------------------------------------------------------------------------
    def _end(self, ids, status: int, reject: int = 0, fail: int = 0) -> None:
        t, now = self.table, self.env.now
        for i in ids:
            t.status[i], t.completion[i] = status, now
            t.reject_reason[i], t.fail_reason[i] = reject, fail
        self._ended += len(ids)
        for jid in ids:  # closed loop: the client's next job, its think time from now
            nxt = int(self.next_of[jid])
            if nxt >= 0:
                ev = self.env.timeout(float(self.think[nxt]))
                ev.callbacks.append(lambda _e, j=nxt: self.arrive(j))
        if self.progress is not None:
            self.progress.update(len(ids))
        if self._ended == t.size and not self.done.triggered:
            self.done.succeed()

    # ---- node failures ------------------------------------------------------------------
    def _failures(self, node: int, rng: np.random.Generator):
        f = self.c.failure
        while True:
            yield self.env.timeout(rng.exponential(f.mtbf_s))
            entry = [node, self.env.now, np.nan]
            self.failure_log.append(entry)
            self.fail_node(node, lost=f.mttr_s is None)
            if f.mttr_s is None:
                return
            yield self.env.timeout(f.mttr_s)
            self.repair_node(node)
            entry[2] = self.env.now

    def fail_node(self, node: int, lost: bool = False) -> None:
        """Node ``node`` goes down now (``lost``: for good): its gangs stop and queue again
        (from their last completed step with checkpointing, else from the start)."""
        now, limit = self.env.now, self.c.failure.max_retries
        self.up[node] = False
        self.free[node] = 0
        victims = list(self.running[node])
        self._dispatching = True  # requeue them all before anything starts again
        try:
            for u in victims:
                tm = u.timing
                enc = 0.0 if u.encoded else tm.encode_s
                encoded = u.encoded or now >= u.run_start + enc
                done = u.steps_done
                if encoded and tm.step_s > 0:
                    done += int(math.floor((now - u.run_start - enc) / tm.step_s + EPS))
                done = min(done, tm.steps)
                if self.c.checkpointing:
                    self._stop(u, done, encoded)
                else:
                    self._stop(u, 0, False)
                u.restarts += 1
                self.table.restarts[u.ids] += 1
                if limit is not None and u.restarts > limit:
                    self._end(u.ids, FAILED, fail=RETRIES_EXHAUSTED)
                else:
                    self._enqueue(u)
        finally:
            self._dispatching = False
        self.draining[node] = 0
        if lost:
            self.lost_nodes += 1
            if self.lost_nodes == self.n:
                self._give_up()
        if not victims:  # else each stopped gang logged the node's new state
            self._log(node)
        self._check("after a node failed")
        self.dispatch()

    def _give_up(self) -> None:
        """Every node is lost for good: whatever waits fails."""
        waiting = [u for u in self.queue.units()] + list(self.forming.values())
        self.forming.clear()
        for u in waiting:
            self.queue.remove(u)
            self._end(u.ids, FAILED, fail=NO_NODE_LEFT)

    def repair_node(self, node: int) -> None:
        """Node ``node`` is back, empty."""
        self.up[node] = True
        self.free[node] = self.G
        self._log(node)
        self._check("after a node was repaired")
        self.dispatch()

    # ---- records ------------------------------------------------------------------------
    def _log(self, node: int) -> None:
        up = self.up[node]
        self.nodes.append(self.env.now, node, self.G - self.free[node] if up else 0,
                          len(self.running[node]), up)

    def _check(self, when: str) -> None:
        if self.checker is not None:
            self.checker.check(when)

    def records(self, sim_time_s: float, partial: bool = False) -> DiffusionRecords:
        """The jobs and node occupancy so far, with the run's facts in ``meta``."""
        log = np.array(self.failure_log, float).reshape(-1, 3)
        down = np.minimum(np.nan_to_num(log[:, 2], nan=sim_time_s), sim_time_s) - log[:, 1]
        meta = {"num_nodes": self.n, "gpus_per_node": self.G, "policy": self.policy.name,
                "elastic": self.sizer.elastic, "sim_time_s": float(sim_time_s),
                "num_node_failures": len(log), "node_downtime_s": float(down.sum()),
                "node_failures": [{"node": int(n), "down_s": float(a),
                                   "up_s": None if np.isnan(b) else float(b)}
                                  for n, a, b in log],
                "partial": bool(partial)}
        if self.checker is not None:
            meta["invariant_checks"] = {"pool_checks": self.checker.checks}
        return DiffusionRecords(self.table.frame(self.jobs_frame), self.nodes.to_frame(), meta)


def _fixed_plan(p) -> ParallelPlan | None:
    """The plan ``cluster.parallel`` fixes, or None for ``auto``."""
    from sim.config.diffusion_cluster import fixed_plan, plan_degrees

    return ParallelPlan(**plan_degrees(p)) if fixed_plan(p) else None
