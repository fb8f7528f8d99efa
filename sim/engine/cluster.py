"""The replicas of one run and how requests reach them: pools, routers, failures.

A *pool* is a set of identical replicas behind one router. A plain cluster has one pool
(``mixed``) of ``cluster.replicas`` replicas. ``cluster.disaggregated`` makes two: requests
are prefilled in the ``prefill`` pool, their KV cache moves over a link (``sim.engine.disagg``),
and a ``decode`` replica generates their tokens. Every replica of a run shares one request
table per pool and one per-request KV ``held`` array (a request is on one replica at a
time), so memory does not grow with replicas × requests.

With ``cluster.failure.mtbf_s`` set, each replica fails after exponential times (mean
``mtbf_s``, its own stream) and comes back empty ``mttr_s`` later (never, with ``mttr_s``
null). The requests it held go back to its pool's router and are recomputed elsewhere (their
generated tokens are kept, as in recompute preemption; ``retries`` counts them; a client sees
a retried request's next tokens after those the failed replica's API server, which outlives
its engine, was still streaming: ``Scheduler.update``); with no
replica of the pool up they wait for the first repair. A request fails instead (status
``failed``) when its replicas have failed more than ``failure.max_retries`` times
(``retries_exhausted``), or when every replica of its pool is lost for good
(``no_replica_left``), so every request ends completed, rejected or failed. Stragglers and
link degradation are in ``sim.engine.faults``.

Random streams are children of ``SeedSequence(seed)`` with their own spawn keys: arrivals 0
and lengths 1 (``scenarios``), routing ``(2, pool)``, failures ``(4, replica)``, stragglers
5 and the KV link 6 (``sim.engine.faults``), so turning routing or faults on leaves the requests
unchanged. With ``check_invariants`` every step is checked (``sim.engine.invariants``).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import simpy

from sim.builders import (
    ReplicaParts,
    build_frontend_costs,
    build_replica_parts,
    ignored_settings,
    naming_pool_field,
    plain,
    pool_tp_field,
)
from sim.config import check_cluster
from sim.config.autoscaler import autoscaled
from sim.config.backend import overlaps
from sim.config.cluster import pool_size
from sim.engine.autoscaler import Autoscaler, ReplicaFleet
from sim.engine.disagg import Disaggregation
from sim.engine.faults import link_schedule, stragglers
from sim.engine.frontend import FrontendServer
from sim.engine.invariants import InvariantChecker
from sim.engine.replica import TIMELINE_COLUMNS, Replica
from sim.errors import ConfigError
from sim.records import LogHistogram, SharedTimeline
from sim.routers import ROUTERS, PoolView, Router
from sim.state import (
    NO_REPLICA_LEFT,
    RETRIES_EXHAUSTED,
    RUNNING,
    TOO_BIG_FOR_CACHE,
    TOO_LONG,
    TRANSFERRING,
    WAITING,
    RequestTable,
)
from sim.timeline_file import StreamedSteps, TimelineFile

ROUTING_STREAM, FAULT_STREAM = 2, 4  # spawn keys under the run's SeedSequence
log = logging.getLogger(__name__)


@dataclass
class Pool:
    """Identical replicas behind one router, working on one request table."""

    name: str  # "mixed", "prefill" or "decode"
    cfg: SimpleNamespace  # the run's config with this pool's tensor parallel size
    table: RequestTable
    itl: LogHistogram
    first: int  # run-wide id of its first replica
    parts: list[ReplicaParts]
    replicas: list[Replica] = field(default_factory=list)
    view: PoolView | None = None
    router: Router | None = None
    parked: list[int] = field(default_factory=list)  # waiting for a replica to come back
    lost: int = 0  # replicas down for good (failures without repair)
    on_finish: object = None  # (pool, r, ids, now) when requests finish on replica r


class Cluster:
    """Builds the pools of a run, routes requests, and fails and repairs replicas."""

    def __init__(self, env: simpy.Environment, cfg, table: RequestTable, itl: LogHistogram,
                 seed: int = 0, hash_ids: np.ndarray | None = None,
                 fast_forward: bool = True, check_invariants: bool = False,
                 timeline: bool = True, timeline_file: TimelineFile | None = None) -> None:
        """``cfg``: the composed config; ``hash_ids``: per request, prefix-block hashes;
        ``check_invariants``: assert the run's invariants after every step (slow; tests);
        ``timeline``: one record per step (else running totals per replica);
        ``timeline_file``: write those records there as they come (memory bounded) and keep
        running totals."""
        self.env, self.cfg, self.table = env, plain(cfg), table
        self.seed, self.hash_ids, self.fast_forward = int(seed), hash_ids, fast_forward
        self._lengths = None  # prompt + output tokens per request, once a cache caches
        self.timeline_file = timeline_file
        self.timeline_path = None  # where the timeline went, once its file is finished
        self.keep_timeline = timeline and timeline_file is None  # rows held in memory
        # every replica's rows in one buffer, when they are held
        self.shared_timeline = SharedTimeline(TIMELINE_COLUMNS) if self.keep_timeline else None
        self.check_invariants = check_invariants
        self.checker = InvariantChecker(self) if check_invariants else None
        self.held = np.zeros(table.size, np.int64)
        self.submitted = np.zeros(table.size, bool)  # reached the cluster (not refused)
        self.on_done = lambda ids, now: None  # requests that ended for good
        self.failure_log: list[list] = []  # [replica, down_s, up_s]
        c = self.cfg.cluster
        check_cluster(c)
        self.speeds = stragglers(c.straggler, pool_size(c), self.seed)
        self.link = link_schedule(c.link_degradation, self.seed) if c.disaggregated else None
        if c.link_degradation.mtbd_s is not None and not c.disaggregated:
            log.warning("cluster.link_degradation is ignored: the cluster is not "
                        "disaggregated (no KV transfers)")
        # each replica's API server (sim.engine.frontend), None when it costs nothing
        self.frontend_costs = build_frontend_costs(self.cfg)
        self.engine_arrival = None if self.frontend_costs.is_wire else \
            np.full(table.size, np.nan)
        self.frontend_service_s = self.frontend_costs.service_times(table.prompt)
        self.pools: list[Pool] = []
        if c.disaggregated:
            self.prefill_table = RequestTable(table.arrival, table.prompt,
                                              np.ones(table.size, np.int64),
                                              priority=table.priority, ttft_slo_s=table.ttft_slo)
            # arrivals are set as requests are released: both tables must see them
            self.prefill_table.arrival = table.arrival
            prefill = self._pool("prefill", c.prefill_replicas,
                                 c.prefill_tensor_parallel_size, self.prefill_table,
                                 LogHistogram())
            decode = self._pool("decode", c.decode_replicas, c.decode_tensor_parallel_size,
                                table, itl)
            self.disagg = Disaggregation(self, prefill, decode, self.link)
        else:
            self.prefill_table = None
            self.disagg = None
            self._pool("mixed", pool_size(c), None, table, itl)
        self.autoscaler = Autoscaler(
            env, ReplicaFleet(self, self.pools[0],
                              c.tensor_parallel_size * c.pipeline_parallel_size),
            c.autoscaler, c.replicas) if autoscaled(c) else None
        self.refusal = self._refusals()
        for line in ignored_settings(self.cfg):  # the config is valid by now
            log.warning(line)
        if c.failure.mtbf_s is not None:
            for pool in self.pools:
                for r in range(len(pool.replicas)):
                    ss = np.random.SeedSequence(self.seed,
                                                spawn_key=(FAULT_STREAM, pool.first + r))
                    env.process(self._failures(pool, r, np.random.default_rng(ss)))

    # ---- building -----------------------------------------------------------------------
    def _build(self, pool_cfg, table: RequestTable, itl: LogHistogram, tp_field: str):
        try:
            parts = build_replica_parts(pool_cfg, table, itl)
        except ConfigError as e:  # name the pool's own field, not the one it was copied to
            raise naming_pool_field(e, tp_field) from None
        parts.kv.share_held(self.held)
        # the workload's ids name cluster.prefix_block_tokens tokens each (the router's unit);
        # a request without ids has blocks of its own, up to its prompt and output
        if parts.kv.prefix is not None and self._lengths is None:
            self._lengths = table.prompt + table.max_output
        parts.kv.set_prefix_source(self.hash_ids, self.cfg.cluster.prefix_block_tokens,
                                   self._lengths)
        return parts

    def _pool(self, name: str, size: int, tp: int | None, table: RequestTable,
              itl: LogHistogram) -> Pool:
        c = self.cfg.cluster
        tp_field = pool_tp_field(self.cfg, name)
        pool_cfg = SimpleNamespace(**vars(self.cfg))
        pool_cfg.cluster = dataclasses.replace(
            c, tensor_parallel_size=c.tensor_parallel_size if tp is None else tp)
        first = sum(len(p.replicas) for p in self.pools)
        pool = Pool(name, pool_cfg, table, itl, first,
                    [self._build(pool_cfg, table, itl, tp_field) for _ in range(size)])
        pool.on_finish = self._finished
        for r, parts in enumerate(pool.parts):
            # disaggregated: the prefill side admits, the decode side streams to the client
            costs = (dataclasses.replace(self.frontend_costs, per_output_token_s=0.0)
                     if name == "prefill" else self.frontend_costs)
            frontend = None if self.engine_arrival is None else FrontendServer(
                costs, self.frontend_service_s, self.engine_arrival)
            pool.replicas.append(Replica(
                self.env, parts.scheduler, parts.cost_model,
                on_complete=lambda ids, now, p=pool, r=r: p.on_finish(p, r, ids, now),
                fast_forward=self.fast_forward, gid=first + r,
                overlap=overlaps(self.cfg.backend, c.pipeline_parallel_size),
                speed=self.speeds.get(first + r), check=self.checker,
                timeline=self.keep_timeline, frontend=frontend,
                steps=self._steps_of(first + r),
                up=not autoscaled(c) or r < c.replicas))  # an autoscaler's spares start off
        meta = pool.parts[0].meta
        kv_tokens = (meta["num_gpu_blocks"] - 1) * meta["block_size"]
        pool.view = PoolView([p.scheduler for p in pool.parts], table, self.hash_ids, kv_tokens,
                             used_blocks=lambda r: pool.replicas[r].kv_used_blocks(),
                             waiting_ids=lambda r: pool.replicas[r].waiting_ids())
        ss = np.random.SeedSequence(self.seed, spawn_key=(ROUTING_STREAM, len(self.pools)))
        pool.router = ROUTERS[c.router](pool.view, np.random.default_rng(ss), c)
        self.pools.append(pool)
        return pool

    def _steps_of(self, gid: int):
        """Where replica ``gid`` records its steps: the shared timeline, the timeline file, or
        (None) running totals of its own."""
        if self.shared_timeline is not None:
            return self.shared_timeline.rows_of(gid)
        if self.timeline_file is not None:
            return StreamedSteps(self.timeline_file, gid, TIMELINE_COLUMNS)
        return None

    def _refusals(self) -> np.ndarray:
        """Per request: 0 if some replica can serve it, else its reject reason code."""
        t = self.table
        total = t.prompt + t.max_output
        entry = self.pools[0]
        refusal = np.zeros(t.size, np.int8)
        # the last output token is sampled, never cached: total − 1 tokens must fit
        fits = entry.parts[0].kv.fits_alone(total - 1)
        if self.disagg is not None:  # the prefill side holds the prompt only
            fits = self.pools[1].parts[0].kv.fits_alone(total - 1) & \
                entry.parts[0].kv.fits_alone(t.prompt)
        refusal[~fits] = TOO_BIG_FOR_CACHE
        refusal[total > entry.parts[0].max_model_len] = TOO_LONG
        return refusal

    def bind_arrivals(self, next_arrival) -> None:
        """A lone entry replica sees every arrival: let it bound its decode windows by the
        next one (more replicas: an arrival cuts the window of the replica it goes to)."""
        entry = self.pools[0]
        if len(entry.replicas) == 1:
            entry.replicas[0].next_arrival = next_arrival
            entry.replicas[0].sees_all_arrivals = True

    # ---- routing ------------------------------------------------------------------------
    def submit(self, rid: int) -> None:
        """A new request (one some replica can serve) reaches the cluster now."""
        self.submitted[rid] = True
        if self.autoscaler is not None:
            self.autoscaler.arrived(self.env.now)
        self.route(self.pools[0], rid)

    def assign(self, pool: Pool, rid: int) -> int:
        """The replica of ``pool`` (local index) that the router picks for ``rid``, now
        counted as holding it; −1 when none is up."""
        v = pool.view
        if len(v.alive_ids) == 0:
            return -1
        r = 0 if v.size == 1 else pool.router.choose(rid)
        v.outstanding[r] += 1
        pool.table.replica[rid] = pool.first + r
        return r

    def route(self, pool: Pool, rid: int) -> None:
        """Send ``rid`` to a replica of ``pool`` that is up, or park it until one is back
        (it fails when none will be)."""
        r = self.assign(pool, rid)
        if r < 0:
            if self.lost(pool):
                self.fail_requests(np.array([rid]), NO_REPLICA_LEFT)
            else:
                pool.parked.append(rid)
        else:
            pool.replicas[r].submit(rid)

    def _finished(self, pool: Pool, r: int, ids: np.ndarray, now: float) -> None:
        pool.view.outstanding[r] -= len(ids)
        ends = pool.table.completion[ids]
        if (ends > now).any():  # a retry's last token behind a failed replica's stream
            for end in np.unique(ends):
                self.on_done(ids[ends == end], float(end))
            return
        self.on_done(ids, now)

    # ---- failures -----------------------------------------------------------------------
    def _failures(self, pool: Pool, r: int, rng: np.random.Generator):
        f = self.cfg.cluster.failure
        while True:
            yield self.env.timeout(rng.exponential(f.mtbf_s))
            entry = [pool.first + r, self.env.now, np.nan]
            self.failure_log.append(entry)
            if f.mttr_s is None:
                self.lose(pool, r)
                return
            self.fail(pool, r)
            yield self.env.timeout(f.mttr_s)
            self.repair(pool, r)
            entry[2] = self.env.now

    def lose(self, pool: Pool, r: int) -> None:
        """Replica ``r`` of ``pool`` goes down for good (if it is up: as ``fail``); when it
        was the pool's last, the requests waiting for one fail (``no_replica_left``)."""
        pool.lost += 1  # before its requests are re-routed: none may wait for it
        if pool.replicas[r].up:
            self.fail(pool, r)
        if self.lost(pool):
            self._give_up(pool)

    def lost(self, pool: Pool) -> bool:
        """Whether every replica of ``pool`` is down for good."""
        return pool.lost == len(pool.replicas)

    def _give_up(self, pool: Pool) -> None:
        """``pool`` has no replica left: requests waiting for one fail."""
        parked, pool.parked = pool.parked, []
        if parked:
            self.fail_requests(np.array(parked, np.int64), NO_REPLICA_LEFT)
        if self.disagg is not None and pool is self.disagg.decode:
            self.disagg.give_up()
        if self.checker is not None:
            self.checker.check_all(-1, "after the last replica of a pool was lost")

    def fail_requests(self, rids: np.ndarray, reason: int) -> None:
        """``rids`` cannot complete: they end now as failed, with a ``FAIL_REASONS`` code
        (each client told after the tokens its frontend was still streaming)."""
        self.table.fail(rids, reason, self.env.now)
        ends = self.table.completion[rids]
        for end in np.unique(ends):
            self.on_done(rids[ends == end], float(end))

    def fail(self, pool: Pool, r: int) -> None:
        """Replica ``r`` of ``pool`` goes down now; its requests go back to the router."""
        pool.replicas[r].fail()
        pool.view.set_alive(r, False)
        pool.view.outstanding[r] = 0
        pool.router.forget(r)
        t = pool.table
        mine = np.flatnonzero(t.replica == pool.first + r)
        status = t.status[mine]
        lost = mine[(status == WAITING) | (status == RUNNING) | (status == TRANSFERRING)]
        lost = np.union1d(lost, pool.replicas[r].take_unscheduled())  # not yet in the engine
        moving = t.status[lost] == TRANSFERRING
        self.held[lost] = 0
        t.retry(lost)
        spent = self._out_of_retries(lost)
        if spent.any():
            if self.disagg is not None:
                for rid in lost[spent & moving]:  # its transfer will not land anywhere
                    self.disagg.in_flight.pop(int(rid), None)
            self.fail_requests(lost[spent], RETRIES_EXHAUSTED)
            lost, moving = lost[~spent], moving[~spent]
        if self.disagg is not None and pool is self.disagg.decode:
            for rid in lost[moving]:  # the KV cache was still on its way: send it again
                self.disagg.send(int(rid))
            lost = lost[~moving]
        for rid in lost:
            self.route(pool, int(rid))
        if self.checker is not None:
            self.checker.check_all(pool.first + r, "after the replica failed")

    def _out_of_retries(self, rids: np.ndarray) -> np.ndarray:
        """Which of ``rids`` have been retried more than ``failure.max_retries`` times (on
        either pool of a disaggregated cluster)."""
        limit = self.cfg.cluster.failure.max_retries
        if limit is None:
            return np.zeros(len(rids), bool)
        tries = self.table.retries[rids]
        if self.prefill_table is not None:
            tries = tries + self.prefill_table.retries[rids]
        return tries > limit

    def repair(self, pool: Pool, r: int) -> None:
        """Replica ``r`` of ``pool`` is back, empty; parked requests are routed again."""
        parts = self._build(pool.cfg, pool.table, pool.itl, "cluster.tensor_parallel_size")
        pool.parts[r] = parts
        pool.view.schedulers[r] = parts.scheduler
        pool.replicas[r].restart(parts.scheduler, parts.cost_model)
        pool.view.set_alive(r, True)
        parked, pool.parked = pool.parked, []
        for rid in parked:
            self.route(pool, rid)
        if self.disagg is not None and pool is self.disagg.decode:
            self.disagg.resume()
        if self.checker is not None:
            self.checker.check_all(pool.first + r, "after the replica was repaired")

    # ---- records ------------------------------------------------------------------------
    def raise_failed_process(self) -> None:
        """Re-raise an error a replica's process ended with in the instant the run ended:
        SimPy raises it only when processing that event, and the run stops before."""
        for pool in self.pools:
            for rep in pool.replicas:
                if rep.process.triggered and not rep.process.ok:
                    raise rep.process.value
