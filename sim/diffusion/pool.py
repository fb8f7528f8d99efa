"""The diffusion node pool: ``nodes`` nodes of ``gpus_per_node`` GPUs serving a job stream.

A job (a *unit*, ``sim.diffusion.unit``: one request, or a batch of same-shape image
requests, ``sim.diffusion.batching``) takes a gang of GPUs of one node for a run of
``encode_s + steps × step_s + decode_s`` (``sim.diffusion.job``); the policy
(``sim.diffusion.policies``) orders the queue, ``GangSizer`` picks the gang and node.
Jobs start in the policy's order, the head first: when it cannot start, the ones behind it
wait too (no backfilling), and a preemptive policy may pause less urgent gangs for it.

Time belongs to SimPy, and a run is one timeout: its completion is an event in the future.
A pause (preemption) or a node failure bumps the unit's ``run_id`` so that the stale event
is ignored. A pause takes effect at the next step boundary (the end of the text encoding or
of the step in progress, computed from the run's start, so it is exact without an event per
step); a job whose last step has begun is not paused. A paused job keeps its encoded prompt
and its completed steps and queues again; it may resume on another node and gang.

Node failures (``cluster.failure``) are ``sim.diffusion.failures``. Under ``cluster=diffusion``
an autoscaler (``cluster.autoscaler``; ``sim.diffusion.node_fleet``) builds ``max_replicas``
nodes, ``nodes`` of them up: a draining node starts no gang (``accepting``) and goes off once
its gangs have ended; a started one comes up empty after its delay. A job no gang size can
run (no valid plan) is rejected at arrival. Closed-loop jobs (``client``, ``think_time_s``
columns; NaN arrivals) are released their think time after the same client's previous job
ended, as LLM requests are (``sim.engine.run``).
"""

from __future__ import annotations

from functools import partial

import numpy as np
import simpy

from sim.config.autoscaler import autoscaled, check_autoscaler
from sim.config.cluster import pool_size
from sim.config.diffusion_cluster import cluster_kind
from sim.diffusion.batching import Batcher
from sim.diffusion.failures import NodeFailures
from sim.diffusion.job import JobShape, JobTiming, ParallelPlan
from sim.diffusion.node_fleet import NodeFleet
from sim.diffusion.policies import JobQueue, NodeView, build_policy
from sim.diffusion.policies.gang import DEFAULT_EFFICIENCY, GangSizer
from sim.diffusion.preemption import next_boundary
from sim.diffusion.records import (
    COMPLETED,
    FAILED,
    NO_NODE_LEFT,
    NO_VALID_PLAN,
    QUEUED,
    REJECTED,
    RUNNING,
    DiffusionRecords,
    JobTable,
    node_buffer,
)
from sim.diffusion.timings import Timings
from sim.diffusion.unit import Unit
from sim.engine.autoscaler import Autoscaler
from sim.engine.run import next_of_client


class NodePool:
    """The SimPy side of ``cluster=diffusion``: arrivals, gangs, pauses, node failures."""

    def __init__(self, env: simpy.Environment, cluster, gpus_per_node: int, cost, jobs,
                 seed: int = 0, progress=None, check_invariants: bool = False) -> None:
        """``cluster``: a ``ClusterConfig`` (its diffusion fields); ``cost``: a
        ``DiffusionCost``; ``jobs``: the job table (``sim.diffusion.job.JOB_COLUMNS``)."""
        self.env, self.cost, self.jobs_frame, self.progress = env, cost, jobs, progress
        self.c, self.G = cluster, int(gpus_per_node)
        scaled = cluster_kind(cluster) == "diffusion" and autoscaled(cluster)
        self.n = pool_size(cluster, nodes=True) if scaled else int(cluster.nodes)
        self.table = JobTable(jobs)
        n = self.table.size
        client = jobs["client"].to_numpy(np.int64) if "client" in jobs else np.full(n, -1)
        self.next_of = next_of_client(client)
        self.think = (jobs["think_time_s"].to_numpy(np.float64) if "think_time_s" in jobs
                      else np.zeros(n))
        self.policy = build_policy(cluster.policy, cluster.preemption)
        self.queue = JobQueue(self.policy)
        self.sizer = GangSizer(self.G, cluster.gpus_per_job, cluster.elastic,
                               getattr(cluster, "elastic_efficiency", DEFAULT_EFFICIENCY))
        self.batcher = Batcher(self, cluster.batching.max_images, cluster.batching.max_wait_s)
        # per node, plain lists: a pool has few nodes and these change at every event
        ready = int(cluster.nodes)  # an autoscaler's spares (the rest) start off
        self.free = [self.G if n < ready else 0 for n in range(self.n)]
        self.draining = [0] * self.n
        self.up = [n < ready for n in range(self.n)]
        self.accepting = [True] * self.n  # an autoscaler's draining nodes start no gang
        self.autoscaler = None  # (sim.diffusion.node_fleet) told of completions and gangs left
        self.lost_nodes = 0
        # per node, its running units in start order (a dict, not a set: preemption victims
        # and failed gangs are visited in this order, and a set's order varies between runs)
        self.running: list[dict[Unit, None]] = [{} for _ in range(self.n)]
        self.nodes = node_buffer()
        self.timings = Timings(cost, _fixed_plan(cluster.parallel), self.sizer)
        self._uid = 0
        self._ended = 0
        self.dispatching = False
        self.done = env.event()
        self.checker = None
        if check_invariants:
            from sim.engine.invariants import PoolChecker
            self.checker = PoolChecker(self)
        for node in range(self.n):
            self.log_node(node)
        self.shapes = self._job_shapes(jobs)
        self.timings.check_shapes(self.shapes)
        if self.table.size == 0:
            self.done.succeed()
        env.process(self._arrivals())
        self.failures = NodeFailures(self, seed)
        if scaled:  # nodes started and drained as load moves
            check_autoscaler(cluster, nodes=True)
            Autoscaler(env, NodeFleet(self), cluster.autoscaler, int(cluster.nodes))

    # ---- jobs, shapes and timings -------------------------------------------------------
    @staticmethod
    def _job_shapes(jobs) -> list[JobShape]:
        cols = [jobs[c].to_numpy() for c in ("model", "height", "width", "frames", "steps",
                                             "images", "guidance")]
        return [JobShape(str(m), int(h), int(w), int(f), int(s), int(i), str(g))
                for m, h, w, f, s, i, g in zip(*cols, strict=True)]

    def timing(self, shape: JobShape, gpus: int) -> JobTiming | None:
        """The job's time on ``gpus`` GPUs (``Timings.timing``)."""
        return self.timings.timing(shape, gpus)

    def shape_id(self, shape: JobShape) -> int:
        """The id of ``shape`` in the timing caches."""
        return self.timings.shape_id(shape)

    # ---- arrivals -----------------------------------------------------------------------
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
        t, shape = self.table, self.shapes[jid]
        t.arrival[jid] = self.env.now
        unit = self._new_unit([jid], shape, int(t.priority[jid]))
        if self.sizer.need(self.timings.valid(unit)) is None:
            self.end([jid], REJECTED, reject=NO_VALID_PLAN)
        elif self.lost_nodes == self.n:
            self.end([jid], FAILED, fail=NO_NODE_LEFT)
        else:
            if self.autoscaler is not None:  # a job the pool takes (as Cluster.submit)
                self.autoscaler.arrived(self.env.now)
            if self.batcher.waits(unit):
                self.batcher.form(unit)
            else:
                self.enqueue(unit)
        self.check("after an arrival")

    def _new_unit(self, ids: list[int], shape: JobShape, priority: int) -> Unit:
        self._uid += 1
        key = (shape.model, shape.height, shape.width, shape.frames, shape.steps,
               shape.guidance, priority)
        unit = Unit(self._uid, ids, shape, key, priority, self._uid)
        unit.sid = self.shape_id(shape)
        return unit

    def enqueue(self, unit: Unit) -> None:
        """Queue ``unit`` (its jobs become ``queued``) and start what can start."""
        for i in unit.ids:
            self.table.status[i] = QUEUED
        self.timings.predict(unit)
        self.queue.push(unit)
        self.batcher.queued(unit)
        self.dispatch()

    # ---- dispatch, runs, pauses ---------------------------------------------------------
    def dispatch(self) -> None:
        """Start queued units, in the policy's order, while the head one fits."""
        if self.dispatching:
            return
        self.dispatching = True
        try:
            while True:
                unit = self.queue.peek()
                if unit is None:
                    return
                target = self.timings.target(unit) if self.sizer.elastic else None
                free = self.free if all(self.accepting) else [
                    f if ok else 0 for f, ok in zip(self.free, self.accepting, strict=True)]
                place = self.sizer.place(free, len(self.queue), self.timings.valid(unit),
                                         target)
                if place is None:
                    if self.policy.preemptive:
                        self._preempt_for(unit)
                    return
                self.queue.pop()
                unit.gpus = place[1]
                self._start(self.batcher.merge(unit), *place)
        finally:
            self.dispatching = False

    def _start(self, unit: Unit, node: int, gpus: int) -> None:
        now, t = self.env.now, self.table
        timing = self.timings.cached(unit.shape, unit.sid, gpus)
        self.free[node] -= gpus
        self.running[node][unit] = None
        unit.node, unit.gpus, unit.timing, unit.run_start = node, gpus, timing, now
        unit.run_id += 1
        unit.draining = False
        plan = t.label_id(timing.plan.label())
        for i in unit.ids:  # a few jobs per unit: scalar stores beat numpy's fancy indexing
            if t.start[i] != t.start[i]:  # NaN: its first start
                t.start[i] = now
            t.node[i], t.gpus[i], t.status[i], t.plan[i] = node, gpus, RUNNING, plan
            t.steps[i], t.step_s[i], t.batch[i] = timing.steps, timing.step_s, len(unit.ids)
        ev = self.env.timeout(self.timings.remaining_s(unit, timing))
        ev.callbacks.append(partial(self._finish, unit, unit.run_id))
        self.log_node(node)
        self.check("after a gang started")

    def stop(self, unit: Unit, steps_done: int, encoded: bool) -> None:
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
        self.running[unit.node].pop(unit, None)
        self.log_node(unit.node)
        unit.run_id += 1
        unit.steps_done, unit.encoded, unit.draining = steps_done, encoded, False
        if self.autoscaler is not None:  # a draining node may hold nothing now
            self.autoscaler.check_drained(unit.node)

    def _finish(self, unit: Unit, run_id: int, _event=None) -> None:
        if unit.run_id != run_id:
            return  # paused or failed since
        self.stop(unit, unit.timing.steps, True)
        self.end(unit.ids, COMPLETED)
        self.check("after a job completed")
        self.dispatch()

    def _preempt_for(self, unit: Unit) -> None:
        """Ask the policy which gangs to pause for ``unit``; each pauses at its next step
        boundary (``sim.diffusion.preemption``)."""
        need = self.sizer.need(self.timings.valid(unit))
        views = [NodeView(n, self.free[n], self.draining[n],
                          [u for u in self.running[n] if not u.draining])
                 for n in range(self.n) if self.up[n] and self.accepting[n]]
        for v in self.policy.victims(unit, need, views):
            b = next_boundary(v, self.env.now)
            if b is None:
                continue
            v.draining = True
            self.draining[v.node] += v.gpus
            # the boundary is computed from the run's start: at "now" it may land a rounding
            # error before it
            ev = self.env.timeout(max(b[0] - self.env.now, 0.0))
            ev.callbacks.append(partial(self._pause, v, v.run_id, b[1]))

    def _pause(self, unit: Unit, run_id: int, steps_done: int, _event=None) -> None:
        if unit.run_id != run_id:
            return  # its node failed meanwhile
        self.stop(unit, steps_done, True)
        self.table.preemptions[unit.ids] += 1
        self.enqueue(unit)
        self.check("after a gang paused")

    # ---- endings -----------------------------------------------------------------------
    def end(self, ids, status: int, reject: int = 0, fail: int = 0) -> None:
        """Jobs ``ids`` end now with ``status`` (and why); a closed-loop client's next job
        is released its think time later."""
        t, now = self.table, self.env.now
        for i in ids:
            t.status[i], t.completion[i] = status, now
            t.reject_reason[i], t.fail_reason[i] = reject, fail
        self._ended += len(ids)
        if status == COMPLETED and self.autoscaler is not None:
            ids = np.asarray(ids, np.int64)
            self.autoscaler.finished(now, {"latency": now - t.arrival[ids]})
        for jid in ids:  # closed loop: the client's next job, its think time from now
            nxt = int(self.next_of[jid])
            if nxt >= 0:
                ev = self.env.timeout(float(self.think[nxt]))
                ev.callbacks.append(lambda _e, j=nxt: self.arrive(j))
        if self.progress is not None:
            self.progress.update(len(ids))
        if self._ended == t.size and not self.done.triggered:
            self.done.succeed()

    # ---- nodes up and down -------------------------------------------------------------
    def bring_up(self, node: int, why: str = "after a node came up") -> None:
        """Node ``node`` is up, empty and takes gangs; queued jobs may start on it."""
        self.up[node], self.accepting[node] = True, True
        self.free[node] = self.G
        self.log_node(node)
        self.check(why)
        self.dispatch()

    def shut_down(self, node: int) -> None:
        """Node ``node``, drained (it runs nothing), goes off."""
        self.up[node], self.free[node] = False, 0
        self.log_node(node)
        self.check("after a drained node went off")

    # ---- records ------------------------------------------------------------------------
    def log_node(self, node: int) -> None:
        """Append node ``node``'s occupancy now to ``nodes.parquet``."""
        up = self.up[node]
        self.nodes.append(self.env.now, node, self.G - self.free[node] if up else 0,
                          len(self.running[node]), up)

    def check(self, when: str) -> None:
        """Check the pool's invariants now, when ``check_invariants`` is on."""
        if self.checker is not None:
            self.checker.check(when)

    def records(self, sim_time_s: float, partial: bool = False) -> DiffusionRecords:
        """The jobs and node occupancy so far, with the run's facts in ``meta``."""
        log = np.array(self.failures.log, float).reshape(-1, 3)
        down = np.minimum(np.nan_to_num(log[:, 2], nan=sim_time_s), sim_time_s) - log[:, 1]
        meta = {"num_nodes": self.n, "gpus_per_node": self.G, "policy": self.policy.name,
                "elastic": self.sizer.elastic, "sim_time_s": float(sim_time_s),
                "num_node_failures": len(log), "node_downtime_s": float(down.sum()),
                "node_failures": [{"node": int(n), "down_s": float(a),
                                   "up_s": None if np.isnan(b) else float(b)}
                                  for n, a, b in log],
                "partial": bool(partial)}
        if self.autoscaler is not None:
            meta["autoscaler"] = self.autoscaler.meta(sim_time_s)
        if self.checker is not None:
            meta["pool_invariant_checks"] = self.checker.checks
        return DiffusionRecords(self.table.frame(self.jobs_frame), self.nodes.to_frame(), meta)


def _fixed_plan(p) -> ParallelPlan | None:
    """The plan ``cluster.parallel`` fixes, or None for ``auto``."""
    from sim.config.diffusion_cluster import fixed_plan, plan_degrees

    return ParallelPlan(**plan_degrees(p)) if fixed_plan(p) else None
