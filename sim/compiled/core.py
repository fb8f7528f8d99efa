"""Runs an LLM simulation in the compiled event loop (``sim.compiled.kernel``) where it applies.

The SimPy engine (``sim.engine.replica``, ``sim.schedulers``, ``sim.cost``) is the reference and
serves every configuration. Its per-step Python costs ~0.1–0.2 ms, so a million requests
take minutes; the compiled loop does the same work in microseconds per step for the
configurations most runs use: one pool of replicas (one, or several behind the
``round_robin``, ``least_outstanding``, ``jsq_tokens``, ``kv_aware``, ``prefix_affinity``,
``power_of_two`` or ``random`` router, ``sim.compiled.routing``; the load routers with FCFS
waiting queues), a policy whose class declares a ``fast_path`` with the values it runs (the
vLLM scheduler under FCFS or priority order, earliest-deadline-first, Sarathi-Serve,
TensorRT-LLM, SGLang, Orca: recompute preemption; vLLM's prefix cache under all but SGLang,
``sim.compiled.prefix_cache``; no swap, host tier or state blocks), the roofline cost model on
one pipeline stage with full GQA attention in every layer, no faults, ITL kept as a
histogram, no invariant checks; open-loop arrivals and closed-loop clients alike; an
autoscaler with a utilisation policy, or the rate policy on open-loop arrivals
(``sim.compiled.scaling.why_not_scaled``).
``engine: auto`` (the default) takes it wherever that holds; ``engine: python`` always runs
the SimPy engine. Both give the same records to float rounding
(``tests/sim/schedulers/test_compiled_core.py``).
"""

from __future__ import annotations

import math

import numpy as np

from sim.compiled import kernel as K
from sim.compiled import keyed_queue as Q
from sim.compiled import routing as RT
from sim.compiled import step_schedule as S
from sim.compiled.prefix_cache import prefix_state
from sim.compiled.pricing import Prices, packable
from sim.compiled.scaling import why_not_scaled
from sim.config.backend import overlaps
from sim.engine.replica import TIMELINE_COLUMNS
from sim.errors import ConfigError
from sim.schedulers import SCHEDULERS
from sim.state import REJECTED

ENGINES = ("auto", "python")
CHUNK_ROWS = 1 << 16  # timeline rows handed to the replicas' buffers at a time (at least)
CHUNK_ROWS_PER_REPLICA = 256  # (a flush costs Python work per replica: keep flushes rare)
PROGRESS_EVERY = 2000  # ended requests between returns to Python (progress bar, Ctrl-C)


ROUTERS = tuple(RT.KINDS)  # the routers sim.compiled.routing and the kernel write out
LOAD_ROUTERS = ("jsq_tokens", "kv_aware")  # (they walk a replica's FCFS waiting queue)
# (their state assumes every replica stays up: draws made before the run, an index never
# forgotten)
STATIC_ROUTERS = ("prefix_affinity", "power_of_two", "random")
# the policies sim.compiled.step_schedule writes out (each class's fast_path says with what)
POLICIES = {"vllm": S.VLLM, "edf": S.VLLM, "sarathi": S.SARATHI, "trtllm": S.TRTLLM,
            "sglang": S.SGLANG, "orca": S.ORCA}
# the policies whose compiled admission matches prefixes as their class does (as each declares)
PREFIX_SCHEDULERS = tuple(name for name, cls in SCHEDULERS.items()
                          if cls.fast_path is not None and cls.compiled_prefix_cache)
# a scheduler's waiting_order, as sim.compiled.keyed_queue numbers it
ORDERS = {"arrival": Q.FCFS, "priority": Q.PRIORITY, "deadline": Q.DEADLINE}


def scheduler_not_compiled(sched_cfg) -> str:
    """Why the compiled loop cannot run the policy of ``sched_cfg`` (``scheduler.*``; "" when
    it can): the allow-list is what each policy declares as its ``fast_path``."""
    fast = SCHEDULERS[sched_cfg.name].fast_path
    if fast is None:
        compiled = [n for n, cls in SCHEDULERS.items() if cls.fast_path is not None]
        return f"scheduler={sched_cfg.name} (compiled: {', '.join(compiled)})"
    for name, allowed in fast.items():
        value = getattr(sched_cfg, name)
        if allowed is not None and value not in allowed:
            return (f"scheduler.{name}={value} (compiled: "
                    f"{', '.join(str(a) for a in allowed)})")
    return ""


def why_not_compiled(cfg, run) -> str:
    """Why the compiled loop cannot run ``run`` (an ``engine.LLMRun``; "" when it can)."""
    engine = str(getattr(cfg, "engine", "auto"))
    if engine not in ENGINES:
        raise ConfigError("engine", engine, f"one of {list(ENGINES)}")
    cluster = run.cluster
    pool = cluster.pools[0]
    c = cluster.cfg.cluster
    reasons = [
        (engine == "python", "engine=python"),
        (len(cluster.pools) > 1, "disaggregated prefill and decode"),
        (len(pool.replicas) > 1 and c.router not in ROUTERS,
         f"router {c.router} (compiled: {', '.join(ROUTERS)})"),
        (c.failure.mtbf_s is not None or bool(cluster.speeds), "faults"),
        (bool(why_not_scaled(cluster.autoscaler, run)), why_not_scaled(cluster.autoscaler,
                                                                       run)),
        (cluster.checker is not None, "check_invariants"),
        (run.itl._samples is not None, "keep_itl_samples"),
    ]
    if pool.replicas:
        kv = pool.parts[0].scheduler.kv
        why = scheduler_not_compiled(cluster.cfg.scheduler)
        reasons += [
            (bool(why), why),
            (kv.swap is not None or kv.host is not None or kv.holds_state,
             "swap, a host tier of the prefix cache, or state blocks"),
            (kv.prefix is not None and cluster.cfg.scheduler.name not in PREFIX_SCHEDULERS,
             f"prefix caching with scheduler={cluster.cfg.scheduler.name} (compiled: "
             f"{', '.join(PREFIX_SCHEDULERS)})"),
            (kv.prefix is not None and cluster.autoscaler is not None,
             "prefix caching with an autoscaler"),
            (c.router in STATIC_ROUTERS and cluster.autoscaler is not None,
             f"router {c.router} with an autoscaler"),
        ]
        order = pool.parts[0].scheduler.waiting_order
        reasons.append((len(pool.replicas) > 1 and c.router in LOAD_ROUTERS
                        and order != "arrival",
                        f"router {c.router} with a keyed waiting order ({order})"))
        why = packable(pool.parts[0].cost_model)
        reasons.append((bool(why), why))
    return next((why for cond, why in reasons if cond), "")


class CompiledPool:
    """The replicas of ``run``'s one pool, its router and its arrivals, as arrays for
    ``kernel.run``."""

    def __init__(self, run) -> None:
        self.run_ = run
        pool = run.cluster.pools[0]
        parts = pool.parts[0]  # every replica is built from the same config
        self.steps = [rep.steps for rep in pool.replicas]
        self.shared = run.cluster.shared_timeline
        s, kv, t = parts.scheduler, parts.kv, run.table
        sched = run.cluster.cfg.scheduler
        R, m = len(pool.replicas), max(sched.max_num_seqs, 1)
        most = max(type(s).step_token_limit(sched), sched.max_num_batched_tokens)
        self.prices = Prices(parts.cost_model, most, sched.max_num_seqs)
        self.table = (t.arrival, t.num_tokens, t.computed, t.generated, t.max_output, kv.held,
                      t.status, t.first_scheduled, t.first_token, t.last_token, t.completion,
                      t.preemptions, t.replica, t.prompt,
                      prefix_state(kv, t, R), t.cached_tokens)
        self.order = np.ascontiguousarray(run.arrivals.initial, dtype=np.int64)
        self.refusal = run.cluster.refusal
        arr = run.arrivals
        # per request its client's next one and that one's think time; a heap of releases
        # (time, creation stamp, request)
        # (a request is in it once at most: n + id is its entry through its replica's
        # frontend); and the frontends (sim.engine.frontend): per request its admission time and
        # when it reached an engine, per replica when its server and its streaming process
        # are free, and (per output token, latency, on, interleaved, own streaming process);
        # under interleaved admission, per
        # replica the group arrived at this instant (first, last, admission work summed in
        # arrival order) and per request the next member of its group
        c = run.cluster
        fe = c.frontend_costs
        front = (c.frontend_service_s, c.engine_arrival if c.engine_arrival is not None
                 else np.zeros(t.size), np.zeros((R, 2)),
                 np.array([fe.per_output_token_s, fe.latency_s, float(not fe.is_wire),
                           float(fe.interleaved), float(fe.own_stream_process)]),
                 np.full((R, 2), -1, np.int64), np.zeros(R), np.full(t.size, -1, np.int64))
        self.clients = (arr.next_of.astype(np.int64), np.asarray(arr.think, np.float64),
                        (np.zeros(t.size), np.zeros(t.size, np.int64),
                         np.zeros(t.size, np.int64)), front)
        self.router = RT.router_state(pool.router, R, self.refusal)
        rs = np.zeros((R, S.NUM_FIELDS), np.int64)
        rs[:, S.FREE] = [p.kv.free_blocks for p in pool.parts]
        rs[:, S.CHUNKED] = -1
        rs[:, S.ALIVE] = [int(a) for a in pool.view.alive]
        rf = np.zeros((R, S.NUM_FLOATS))
        rf[:, S.RATIO] = S.INIT_NEW_TOKEN_RATIO
        self.fresh = (rs[0].copy(), rf[0].copy())  # a replica's rows as built (a restart)
        ids = lambda: np.zeros((R, m), np.int64)  # noqa: E731
        # per replica: state, (step start, end, SGLang's ratio), running, batch ids, new and
        # cached tokens;
        # the waiting queues' links (and keys, under a keyed order: sim.compiled.keyed_queue);
        # what is left to happen at this instant (kernel._now_queue);
        # the heap of the busy replicas' step ends (time, stamp, replica); an overlapping
        # engine's held requests (per request the next one held and when it came, per
        # replica the first and last, and whether the engine overlaps)
        order = ORDERS[s.waiting_order]
        keyed = t.size if order != Q.FCFS else 0
        base = (np.asarray(t.priority, np.float64) if order == Q.PRIORITY
                else np.asarray(t.ttft_slo, np.float64) if order == Q.DEADLINE
                else np.zeros(0))
        waiting = (np.zeros(t.size, np.int64), np.full(keyed, -1, np.int64), np.zeros(keyed),
                   np.zeros(keyed), base)
        self.pool = (rs, rf, ids(), ids(), ids(), ids(), waiting,
                     np.zeros(2 * R + t.size + 1, np.int64),
                     (np.zeros(R), np.zeros(R, np.int64), np.zeros(R, np.int64)),
                     (np.full(t.size, -1, np.int64), np.zeros(t.size),
                      np.full((R, 2), -1, np.int64),
                      np.array([int(overlaps(run.cluster.cfg.backend,
                                              run.cluster.cfg.cluster.pipeline_parallel_size))],
                               np.int64)))
        self.state = np.zeros(K.NUM_STATE, np.int64)
        self.state[K.PENDING] = -1
        self.clock = np.array([0.0, math.inf])  # now; when the caller's next event is due
        self.on_due = None  # runs the caller's event due at clock[1] (sim.compiled.scaling)
        self.cfg = np.array([sched.max_num_batched_tokens, sched.max_num_seqs,
                             sched.long_prefill_token_threshold,
                             int(sched.enable_chunked_prefill), kv.block_size, kv.num_blocks,
                             POLICIES[sched.name],
                             int(sched.capacity_scheduler_policy == "GUARANTEED_NO_EVICT"),
                             sched.chunk_size, order], np.int64)
        self.scratch = (np.zeros(m, np.int64), np.zeros(m, np.int64), np.zeros(m, np.int64),
                        np.zeros(m), np.zeros(8), np.zeros(5))  # want, need, emit, gaps, x, cost
        cols = list(TIMELINE_COLUMNS.values())[:-1] + ["i4"]  # swap_s is 0; + replica
        chunk = max(CHUNK_ROWS, CHUNK_ROWS_PER_REPLICA * R)
        self.rows = tuple(np.zeros(chunk, dtype=d) for d in cols)
        itl = run.itl
        self.itl = (itl.counts, itl.sums, float(itl.LOW_S), float(itl._log_ratio))

    @property
    def now(self) -> float:
        """Simulated time reached."""
        return float(self.clock[0])

    def _flush(self) -> None:
        """Hand the chunk's timeline rows to each replica's buffer (or step totals)."""
        k = int(self.state[K.ROWS])
        if not k:
            return
        self.state[K.ROWS] = 0  # (first: a Ctrl-C while handing over loses rows, never doubles)
        cols, replica = [c[:k] for c in self.rows[:-1]], self.rows[-1][:k]
        if self.shared is not None:  # every replica's rows in one buffer, as they come
            self.shared.extend(k, replica, *cols, 0.0)
        elif len(self.steps) == 1:
            self.steps[0].extend(k, *cols, 0.0)
        else:  # grouped by replica once (stable: each keeps its time order), not masked R times
            order = np.argsort(replica, kind="stable")
            cols = [c[order] for c in cols]
            ends = np.cumsum(np.bincount(replica, minlength=len(self.steps)))
            start = 0
            for r in np.flatnonzero(np.diff(ends, prepend=0)):
                end = int(ends[r])
                self.steps[r].extend(end - start, *(c[start:end] for c in cols), 0.0)
                start = end

    def advance(self, max_ended: int) -> int:
        """Run until ``max_ended`` requests have ended (or all have); returns how many have."""
        p, st = self.prices, self.state
        prices = (p.tok, p.head_tok, p.head_seq, p.params, p.etas)
        while True:
            code = K.run(self.table, self.order, self.refusal, self.clients, self.router,
                         self.pool, st, self.clock, self.cfg, prices, self.scratch, self.rows,
                         self.itl, max_ended)
            if code == K.NEED_TOKENS:
                p.fill_tokens(int(st[K.NEED]))
            elif code == K.NEED_SEQS:
                p.fill_seqs(int(st[K.NEED]))
            elif code == K.CHUNK_FULL:
                self._flush()
            elif code == K.DUE:
                self.on_due()
            elif code == K.STALLED:
                self._flush()
                stuck = np.flatnonzero(np.isnan(self.run_.table.completion))
                raise RuntimeError(f"simulation stalled with {len(stuck)} unfinished "
                                   f"(first: {stuck[:5].tolist()})")
            else:  # (the rows wait for a full chunk or ``finish``)
                return int(st[K.ENDED])

    def finish(self) -> None:
        """Hand over the timeline rows still held and leave the cluster's bookkeeping as the
        SimPy engine would at this point."""
        self._flush()
        c, t = self.run_.cluster, self.run_.table
        rejected = t.status == REJECTED
        t.reject_reason[rejected] = self.refusal[rejected]
        c.submitted[:] = t.replica >= 0
        pool, rs = c.pools[0], self.pool[0]
        pool.view.outstanding[:] = rs[:, S.OUT]
        for parts, free in zip(pool.parts, rs[:, S.FREE], strict=True):
            parts.kv.free_blocks = int(free)
