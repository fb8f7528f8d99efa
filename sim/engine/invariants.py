"""Invariants of a running simulation, checked after every step (``check_invariants=true``).

The replica calls ``after_step`` (or ``after_window`` for the k steps of a fast-forwarded
decode window) when the flag is on, and the cluster calls ``check_all`` after a failure or
a repair; with the flag off nothing here runs. Each check names its invariant:

- ``batch_limits``: a step schedules each request at most once, at least one token each, at
  most ``max_num_seqs`` sequences and at most the policy's token budget
  (``max_num_batched_tokens``; Sarathi's ``chunk_size``; SGLang may admit a first prompt
  up to its ``chunk_size``); a replica runs at most ``max_num_seqs`` requests.
- ``kv_accounting``: on every live replica, the blocks in use equal those its waiting and
  running requests hold (plus their state blocks, plus the cached prefix blocks they
  reference, once each), the prefix pool's references are theirs, the host swap space adds
  up; no request holds blocks outside a live replica's queues; a decode window's KV usage
  stays within capacity and never shrinks.
- ``queue_status``: a request in a replica's waiting queue has status waiting, one in its
  running list running, each assigned to that replica; a parked request is pending, a KV
  transfer in flight transferring.
- ``timestamps``: per request, arrival ≤ first scheduled ≤ first token ≤ last token ≤
  completion (a NaN, not yet, is allowed, but not before a later one is set), none after now.
- ``tokens``: generated ≤ max output, prompt + generated = tokens known, 0 ≤ computed ≤
  tokens known, a completed request generated all its output.
- ``conservation``: every released request is in exactly one place (a live replica's waiting
  queue or running list, a pool's parked list, a KV transfer or the decode parking of a
  disaggregated cluster, or ended: completed, rejected or failed), no request that was
  not released is anywhere, and no scheduler holds a request before it got through its
  frontend (``engine_arrival``).

After every step the checker looks at what the step touched: the batch, the stepping
replica's queues and KV cache, and the timestamps and tokens of the batch's requests. The
whole-cluster checks (every request's timestamps and tokens, conservation, blocks held outside
any queue) scan every request, so they run after every ``⌈requests / FULL_CHECK_REQUESTS⌉``-th
step (every step for runs of up to ``FULL_CHECK_REQUESTS`` requests, as in the tests), after
every failure, repair or pool loss, and once at the end of the run: a million-request run
stays linear in its requests instead of quadratic.

A violation raises ``sim.errors.InvariantError`` naming the invariant, the replica, the time
and the requests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from sim.errors import InvariantError
from sim.schedulers import SCHEDULERS
from sim.state import (
    ENDED,
    FINISHED,
    PENDING,
    REJECTED,
    RUNNING,
    TRANSFERRING,
    WAITING,
    RequestTable,
)

if TYPE_CHECKING:
    from sim.engine.cluster import Cluster
    from sim.engine.replica import Replica
    from sim.schedulers.base import Batch

_EMPTY = np.empty(0, np.int64)
FULL_CHECK_REQUESTS = 256  # whole-cluster checks every ⌈requests / this⌉ steps


def step_limits(sched_cfg) -> tuple[int, int]:
    """(most sequences, most tokens) one step of the configured policy may schedule, as the
    policy declares them."""
    return sched_cfg.max_num_seqs, SCHEDULERS[sched_cfg.name].step_token_limit(sched_cfg)


def _ids(queue) -> np.ndarray:
    return np.fromiter(queue, np.int64, len(queue)) if len(queue) else _EMPTY


class InvariantChecker:
    """Checks the state of a ``sim.engine.cluster.Cluster`` and raises on the first violation."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.max_seqs, self.max_tokens = step_limits(cluster.cfg.scheduler)
        self._when = ""  # what just happened, for the messages of ``check_all``
        self.full_every = max(1, -(-cluster.table.size // FULL_CHECK_REQUESTS))
        self._until_full = 0
        self.steps_checked = 0  # steps (a decode window counts its steps) and windows checked
        self.full_checks = 0

    def counts(self) -> dict:
        """How much was checked: for ``summary.json``."""
        return {"steps_checked": self.steps_checked, "full_checks": self.full_checks}

    def _raise(self, invariant: str, replica: int, ids, detail: str) -> None:
        raise InvariantError(invariant, replica, self.cluster.env.now, np.asarray(ids).ravel(),
                             detail)

    # ---- hooks ---------------------------------------------------------------------------
    def after_step(self, replica: Replica, batch: Batch) -> None:
        """The state after one step of ``replica`` that ran ``batch``."""
        self._batch(replica.gid, batch)
        self._after(replica, batch, 1)

    def after_window(self, replica: Replica, batch: Batch, used: np.ndarray) -> None:
        """The state after a decode window of ``replica``: ``batch`` ran once per step, with
        ``used`` KV blocks at the start of each step."""
        self._batch(replica.gid, batch)
        cap = replica.scheduler.kv.num_blocks
        if len(used) and (used.min() < 0 or used.max() > cap or (np.diff(used) < 0).any()):
            self._raise("kv_accounting", replica.gid, batch.ids,
                        f"a decode window's KV blocks per step {used.tolist()} leave "
                        f"[0, {cap}] or shrink")
        self._after(replica, batch, len(used))

    def _after(self, replica: Replica, batch: Batch, steps: int) -> None:
        """What the step (or window of ``steps`` steps) touched; every ``full_every``-th
        time, the whole cluster."""
        self.steps_checked += steps
        self._until_full -= 1
        if self._until_full <= 0:
            self._until_full = self.full_every
            self.check_all(replica.gid)
            return
        gid, sched = replica.gid, replica.scheduler
        self._when = ""
        self._replica(sched.table, gid, sched)
        self._timestamps(sched.table, gid, batch.ids)
        self._tokens(sched.table, gid, batch.ids)

    def check_all(self, gid: int, when: str = "") -> None:
        """Every invariant over the whole cluster; ``gid`` is the replica that just acted
        (−1: none), ``when`` what just happened (for the message)."""
        c = self.cluster
        self.full_checks += 1
        self._when = f" ({when})" if when else ""
        self._conservation(gid)
        held = []
        for pool in c.pools:
            for r, rep in enumerate(pool.replicas):
                if rep.up:
                    held.append(self._replica(pool.table, pool.first + r, rep.scheduler))
        leak = np.setdiff1d(np.flatnonzero(c.held > 0), np.concatenate([_EMPTY, *held]))
        if len(leak):
            self._raise("kv_accounting", gid, leak, "requests hold KV blocks but are in no "
                        f"live replica's queues{self._when}")
        for t in (c.table, c.prefill_table):
            if t is not None:
                self._timestamps(t, gid)
                self._tokens(t, gid)

    # ---- the checks ----------------------------------------------------------------------
    def _batch(self, gid: int, batch: Batch) -> None:
        ids, n = batch.ids, len(batch.ids)
        if n > self.max_seqs or batch.num_tokens > self.max_tokens:
            self._raise("batch_limits", gid, ids, f"{n} sequences and {batch.num_tokens} "
                        f"tokens in a step (limits {self.max_seqs} and {self.max_tokens})")
        if len(np.unique(ids)) != n or (n and batch.new_tokens.min() < 1):
            self._raise("batch_limits", gid, ids, "a request scheduled twice, or for no "
                        f"token, in one step (new tokens {batch.new_tokens.tolist()})")

    def _replica(self, t: RequestTable, gid: int, sched) -> np.ndarray:
        """Queues, statuses and KV blocks of one live replica; the requests holding blocks."""
        waiting, running = _ids(sched.waiting), np.asarray(sched.running, np.int64)
        if len(running) > self.max_seqs:
            self._raise("batch_limits", gid, running, f"{len(running)} requests running "
                        f"(max_num_seqs={self.max_seqs}){self._when}")
        for ids, code, name in ((waiting, WAITING, "waiting"), (running, RUNNING, "running")):
            bad = ids[t.status[ids] != code]
            if len(bad):
                self._raise("queue_status", gid, bad, f"{name} on this replica with status "
                            f"codes {t.status[bad].tolist()}{self._when}")
        members = np.concatenate([waiting, running])
        bad = members[t.replica[members] != gid]
        if len(bad):
            self._raise("queue_status", gid, bad, "queued here but assigned to replicas "
                        f"{t.replica[bad].tolist()}{self._when}")
        kv = sched.kv
        holders = members[kv.held[members] > 0]
        wrong = kv.audit(holders)
        if wrong:
            self._raise("kv_accounting", gid, holders, wrong + self._when)
        if kv.swap is not None and kv.swap.held:
            swapped = np.fromiter(kv.swap.held, np.int64, len(kv.swap.held))
            bad = swapped[~np.isin(swapped, waiting) | (kv.held[swapped] > 0)]
            if len(bad):
                self._raise("kv_accounting", gid, bad, "swapped out but not waiting here, "
                            f"or holding GPU blocks too{self._when}")
        return holders

    def _timestamps(self, t: RequestTable, gid: int, ids: np.ndarray | None = None) -> None:
        """Every request's timestamps in order (``ids``: only these requests')."""
        now = self.cluster.env.now
        pick = (lambda x: x) if ids is None else (lambda x: x[ids])
        name = (lambda bad: bad) if ids is None else (lambda bad: ids[bad])
        chain = (("arrival", pick(t.arrival)), ("first_scheduled", pick(t.first_scheduled)),
                 ("first_token", pick(t.first_token)), ("last_token", pick(t.last_token)),
                 ("completion", pick(t.completion)))
        for i, (a, x) in enumerate(chain):
            for b, y in chain[i + 1:]:  # every pair: a NaN between two set ones is allowed
                bad = np.flatnonzero(x > y)
                if len(bad):
                    self._raise("timestamps", gid, name(bad), f"{a} after {b}{self._when}")
        for (a, x), (b, y) in zip(chain[1:], chain[2:4], strict=False):
            bad = np.flatnonzero(np.isnan(x) & ~np.isnan(y))
            if len(bad):
                self._raise("timestamps", gid, name(bad), f"{b} set without {a}{self._when}")
        # a decode window sleeps ``end − start`` seconds, so the clock may stop an ulp short
        # of the step end it stamps
        now += 1e-12 * max(1.0, abs(now))
        # what clients see is stamped when a frontend has streamed it, up to its free time
        seen = max([now] + [rep.frontend.busy_until for p in self.cluster.pools
                            for rep in p.replicas if rep.frontend is not None])
        for what, x in chain[1:]:
            if what in ("first_token", "last_token", "completion"):
                now = seen
            bad = np.flatnonzero(x > now)
            if len(bad):
                self._raise("timestamps", gid, name(bad), f"{what} in the future{self._when}")

    def _tokens(self, t: RequestTable, gid: int, ids: np.ndarray | None = None) -> None:
        """Every request's token counts consistent (``ids``: only these requests')."""
        pick = (lambda x: x) if ids is None else (lambda x: x[ids])
        gen, out, known, computed = (pick(t.generated), pick(t.max_output),
                                     pick(t.num_tokens), pick(t.computed))
        for bad, what in ((gen > out, "generated more than max output"),
                          (known != pick(t.prompt) + gen,
                           "tokens known != prompt + generated"),
                          ((computed < 0) | (computed > known),
                           "computed tokens outside [0, tokens known]"),
                          ((pick(t.status) == FINISHED) & (gen != out),
                           "completed without all its output")):
            rows = np.flatnonzero(bad)
            if len(rows):
                self._raise("tokens", gid, rows if ids is None else ids[rows],
                            what + self._when)

    def _conservation(self, gid: int) -> None:
        c = self.cluster
        t = c.table
        count = np.zeros(t.size, np.int64)
        places = []  # (ids, table, status they must have)
        reached = c.engine_arrival  # when each request got through its frontend (or None)
        late = c.env.now + 1e-12 * max(1.0, abs(c.env.now))
        for pool in c.pools:
            for rep in pool.replicas:
                if rep.up:
                    s = rep.scheduler
                    held = [_ids(s.waiting), _ids(s.running)]
                    places += [(ids, None, None) for ids in held]
                    if reached is not None:
                        early = np.concatenate(held)
                        early = early[reached[early] > late]
                        if len(early):
                            self._raise("conservation", gid, early, "in a scheduler before "
                                        f"it got through its frontend{self._when}")
                # routed here, still in its frontend (sim.engine.frontend)
                places.append((_ids(rep.before_scheduler), pool.table, PENDING))
            places.append((np.asarray(pool.parked, np.int64), pool.table, PENDING))
        if c.disagg is not None:
            places += [(_ids(c.disagg.in_flight), t, TRANSFERRING),
                       (np.asarray(c.disagg.parked, np.int64), t, TRANSFERRING)]
        for ids, _, _ in places:
            np.add.at(count, ids, 1)
        ended = np.isin(t.status, ENDED)
        count[ended] += 1
        released = c.submitted | (t.status == REJECTED)
        for bad, what in ((count > 1, "in more than one place"),
                          (released & (count == 0), "released but nowhere (lost)"),
                          (~released & (count > 0), "somewhere before its release")):
            ids = np.flatnonzero(bad)
            if len(ids):
                self._raise("conservation", gid, ids, f"requests {what}: {int(released.sum())}"
                            f" released, {int(ended.sum())} ended{self._when}")
        for ids, table, code in places:
            if table is not None:
                bad = ids[table.status[ids] != code]
                if len(bad):
                    self._raise("queue_status", gid, bad, "parked or on the KV link with "
                                f"status codes {table.status[bad].tolist()}{self._when}")


class PoolChecker:
    """Invariants of a diffusion node pool (``sim.diffusion.pool.NodePool``), checked after
    every event of the pool when ``check_invariants`` is on:

    - ``gang``: on every node, 0 <= free GPUs <= GPUs per node, the gangs running there hold
      exactly the GPUs that are not free, each gang fits one node, a node that is down runs
      nothing and offers no GPU;
    - ``conservation``: every job that arrived is in exactly one place (an open batch, the
      queue or a running gang) or has ended (completed, rejected, failed), with the status
      of that place; a job that has not arrived is nowhere;
    - ``timestamps``: arrival <= start <= first step <= completion where set, none in the
      future; steps done <= steps.
    """

    def __init__(self, pool) -> None:
        self.pool = pool
        self.checks = 0

    def _raise(self, invariant: str, ids, detail: str, when: str) -> None:
        raise InvariantError(invariant, -1, self.pool.env.now, np.asarray(ids).ravel(),
                             f"{detail} ({when})")

    def check(self, when: str = "") -> None:
        """Every invariant of the pool now; ``when`` says what just happened."""
        from sim.diffusion.records import JOB_ENDED, PENDING, QUEUED, RUNNING

        p, t = self.pool, self.pool.table
        self.checks += 1
        for n in range(p.n):
            held = sum(u.gpus for u in p.running[n])
            ids = [i for u in p.running[n] for i in u.ids]
            if not 0 <= p.free[n] <= p.G or (p.up[n] and held != p.G - p.free[n]) \
                    or any(u.gpus > p.G or u.node != n for u in p.running[n]):
                self._raise("gang", ids, f"node {n}: {p.free[n]} GPUs free of {p.G}, gangs "
                            f"holding {held}", when)
            if not p.up[n] and (p.running[n] or p.free[n]):
                self._raise("gang", ids, f"node {n} is down but runs gangs or offers GPUs",
                            when)
        count = np.zeros(t.size, np.int64)
        places = ((list(p.batcher.forming.values()), QUEUED), (p.queue.units(), QUEUED),
                  ([u for r in p.running for u in r], RUNNING))
        for units, status in places:
            ids = np.array([i for u in units for i in u.ids], np.int64)
            np.add.at(count, ids, 1)
            bad = ids[t.status[ids] != status]
            if len(bad):
                self._raise("conservation", bad, f"status codes {t.status[bad].tolist()} "
                            f"where {status} belongs", when)
        ended = np.isin(t.status, JOB_ENDED)
        count[ended] += 1
        arrived = t.status != PENDING
        for bad, what in ((count > 1, "in more than one place"),
                          (arrived & (count == 0), "arrived but nowhere (lost)"),
                          (~arrived & (count > 0), "somewhere before its arrival")):
            if bad.any():
                self._raise("conservation", np.flatnonzero(bad), f"jobs {what}", when)
        chain = (t.arrival, t.start, t.first_step, t.completion)
        now = p.env.now + 1e-9 * max(1.0, p.env.now)
        for i, x in enumerate(chain):
            for y in chain[i + 1:]:
                if (x > y + 1e-9).any():
                    self._raise("timestamps", np.flatnonzero(x > y + 1e-9), "out of order",
                                when)
            if i and (x > now).any():
                self._raise("timestamps", np.flatnonzero(x > now), "in the future", when)
        if (t.steps_done > t.steps).any():
            self._raise("timestamps", np.flatnonzero(t.steps_done > t.steps),
                        "more steps done than the job has", when)
