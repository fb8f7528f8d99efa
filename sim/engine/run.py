"""``simulate``: the one public call of the simulation core.

It takes the composed config and a request table (the contract of ``scenarios.build_requests``:
columns ``arrival_time_s, input_tokens, output_tokens, client, think_time_s``; closed-loop
follow-ups have a NaN arrival and are released ``think_time_s`` after the same client's previous
request ends; optional columns ``priority``, ``ttft_slo_ms`` and ``request_class`` carry request
classes, and ``hash_ids`` prefix-block hashes) and returns ``Records``. It imports neither
scenario readers nor analysis.

Multi-turn sessions (``scenarios.sessions``) need nothing more: a session is a client whose
first turn has an arrival time and whose later turns have NaN ones, so each turn is released
its think time after the previous turn completes, as a closed-loop follow-up.

Ctrl-C while simulating (SIGINT, SIGTERM where the command handles it as Ctrl-C, or a
``KeyboardInterrupt`` raised by a progress callback) stops the event loop between two
events and returns what was simulated so far, with ``meta["partial"]`` true and
``meta["interrupted_at_sim_s"]``; requests that had not ended keep their status (pending,
waiting, running) and a NaN completion.
"""

from __future__ import annotations

import heapq
import math
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pandas as pd
import simpy
from simpy.core import EmptySchedule

from sim.compiled.core import PROGRESS_EVERY, CompiledPool, why_not_compiled
from sim.compiled.scaling import CompiledScaling
from sim.engine.cluster import Cluster
from sim.engine.cluster_outputs import cluster_timeline, run_meta, step_totals
from sim.engine.replica import TIMELINE_COLUMNS
from sim.errors import sigterm_interrupts
from sim.records import LogHistogram, Records
from sim.state import (
    REJECT_REASONS,
    REJECTED,
    STATUS_NAMES,
    RequestTable,
    check_releases,
    check_ttft_targets,
)
from sim.timeline_file import TimelineFile


def next_of_client(client: np.ndarray) -> np.ndarray:
    """For each row, the next row of the same client (−1 if none or open loop)."""
    nxt = np.full(len(client), -1, np.int64)
    closed = np.flatnonzero(client >= 0)
    if len(closed):
        order = closed[np.argsort(client[closed], kind="stable")]
        same = client[order[1:]] == client[order[:-1]]
        nxt[order[:-1][same]] = order[1:][same]
    return nxt


class _Arrivals:
    """Releases requests to the cluster: open-loop at their times, closed-loop on completion.

    ``done`` triggers when every request has ended (completed or rejected).
    """

    def __init__(self, env, table: RequestTable, cluster: Cluster, client: np.ndarray,
                 think: np.ndarray, progress) -> None:
        self.env, self.table, self.cluster = env, table, cluster
        self.think, self.next_of = think, next_of_client(client)
        follow_up = np.zeros(table.size, bool)
        follow_up[self.next_of[self.next_of >= 0]] = True
        check_releases(table.arrival, think, follow_up)
        self.progress = progress
        self.done = env.event()
        self._ended = 0
        cluster.on_done = self.completed
        cluster.bind_arrivals(self.next_time)
        first = np.flatnonzero(~np.isnan(table.arrival))
        self.initial = first[np.argsort(table.arrival[first], kind="stable")]
        self.initial_times = table.arrival[self.initial].copy()
        self._cursor = 0  # index into initial of the next open-loop arrival
        self._delayed: list[tuple[float, int]] = []  # heap of pending (time, id) releases
        if table.size == 0:
            self.done.succeed()
        env.process(self._open_loop())

    def next_time(self) -> float:
        """When the next request reaches the server (inf if none is known yet)."""
        t = self.initial_times[self._cursor] if self._cursor < len(self.initial) else math.inf
        return min(t, self._delayed[0][0]) if self._delayed else t

    def _open_loop(self):
        env, times, n = self.env, self.initial_times, len(self.initial)
        i = 0
        while i < n:
            due = times[i]
            delay = due - env.now
            if delay > 0:
                yield env.timeout(delay)
            # Every request of one trace time in one go, compared on the trace's values: the
            # clock can reach ``due`` inexactly (0.8 + (3.1 - 0.8) < 3.1), and a request
            # released 4e-16 s after its twin would be admitted and routed apart from it.
            while i < n and times[i] == due:
                self._cursor = i + 1
                self.release(int(self.initial[i]))
                i += 1

    def _release_delayed(self, rid: int) -> None:
        heapq.heappop(self._delayed)
        self.release(rid)

    def release(self, rid: int) -> None:
        """A request reaches the server now: refuse it with a reason, or route it."""
        self.table.arrival[rid] = self.env.now
        reason = self.cluster.refusal[rid]
        if reason:
            self.table.reject(rid, int(reason), self.env.now)
            self.completed(np.array([rid]), self.env.now)
        else:
            self.cluster.submit(rid)

    def completed(self, ids: np.ndarray, now: float) -> None:
        """Requests ended (finished or rejected): release their clients' next requests."""
        if self.progress is not None:
            self.progress.update(len(ids))
        for rid in ids:
            nxt = int(self.next_of[rid])
            if nxt >= 0:
                # Even with no think time the follow-up reaches the server through an event:
                # the client only learns of the completion after the step, so the follow-up
                # cannot join the batch the replica forms at this instant.
                # ``now`` is when the client saw the end (after the frontend streamed it)
                delay = now + float(self.think[nxt]) - self.env.now
                heapq.heappush(self._delayed, (now + float(self.think[nxt]), nxt))
                self.env.timeout(delay).callbacks.append(
                    lambda _e, r=nxt: self._release_delayed(r))
        self._ended += len(ids)
        if self._ended == self.table.size:
            self.done.succeed()


class _StopRequest:
    """Set by Ctrl-C (or SIGTERM) while simulating; the event loop checks it between events."""

    requested = False


# each signal's handler when it interrupts the command (SIGTERM: sim.errors.ctrl_c_exits)
_INTERRUPTS = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: sigterm_interrupts}


@contextmanager
def _ctrl_c_stops(stop: _StopRequest) -> Iterator[None]:
    """While the body runs, the first SIGINT or SIGTERM only sets ``stop.requested``, so the
    event loop ends between two events with consistent state; a second one raises at once.
    A signal is left alone outside the main thread or when someone else handles it (SIGTERM
    by default ends the process: only a command that handles it as Ctrl-C is stopped)."""
    ours = [s for s, h in _INTERRUPTS.items() if signal.getsignal(s) is h]
    if threading.current_thread() is not threading.main_thread() or not ours:
        yield
        return

    def restore() -> None:
        for s in ours:
            signal.signal(s, _INTERRUPTS[s])

    def handler(signum, frame) -> None:
        stop.requested = True
        restore()

    for s in ours:
        signal.signal(s, handler)
    try:
        yield
    finally:
        restore()


def run_until(env: simpy.Environment, done: simpy.Event, unfinished) -> bool:
    """Process events until ``done`` has been processed (as ``env.run(until=done)``) or
    Ctrl-C stops the loop; whether it was stopped. ``unfinished()`` names what had not ended
    (for the error when no event is left before ``done``)."""
    stop = _StopRequest()
    step = env.step
    with _ctrl_c_stops(stop):
        try:
            while done.callbacks is not None:  # None once the event has been processed
                if stop.requested:
                    return True
                step()
        except KeyboardInterrupt:  # from a callback, or a second Ctrl-C
            return True
        except EmptySchedule:  # no event left while a request or job has not ended
            stuck = unfinished()
            raise RuntimeError(f"simulation stalled with {len(stuck)} unfinished "
                               f"(first: {stuck[:5].tolist()})") from None
    return False


def unfinished_rows(completion: np.ndarray):
    """``run_until``'s ``unfinished`` for a table whose rows end with a completion time."""
    return lambda: np.flatnonzero(np.isnan(completion))


@dataclass
class LLMRun:
    """The LLM side of a simulation, built in an environment (``build_llm``) and turned into
    ``Records`` once the event loop has run (``llm_records``)."""

    env: simpy.Environment
    requests: pd.DataFrame
    table: RequestTable
    client: np.ndarray
    cluster: Cluster
    arrivals: _Arrivals
    itl: LogHistogram
    ttft_slo: np.ndarray | None


def simulate(cfg, requests: pd.DataFrame, progress=None, keep_itl_samples: bool = False,
             timeline_path=None) -> Records:
    """Run the configured cluster (one replica by default) over ``requests``; its records.

    ``cfg`` is the composed config (model, hardware, scheduler, kv_cache, cluster, cost_model;
    ``seed`` picks the routing and failure streams); ``progress`` is an optional tqdm-like
    object updated by completed request counts. Ctrl-C (or a ``KeyboardInterrupt`` from
    ``progress``) ends the run early: the records of what was simulated up to then, marked
    ``meta["partial"]`` with ``meta["interrupted_at_sim_s"]``. ``timeline_path``: write the
    per-step timeline there as the run goes (``sim.timeline_file``: memory bounded at any
    length; ``meta["timeline_file"]``) instead of holding it, keeping step totals.
    """
    run = build_llm(simpy.Environment(), cfg, requests, progress, keep_itl_samples,
                    timeline_path)
    try:
        why_not = why_not_compiled(cfg, run)
        if why_not:
            interrupted = run_until(run.env, run.arrivals.done,
                                    unfinished_rows(run.table.completion))
            now = float(run.env.now)
        else:
            interrupted, now = run_compiled(run, progress)
        records = llm_records(run, interrupted, now)
    except BaseException:
        if run.cluster.timeline_file is not None:  # no half-written timeline is left
            run.cluster.timeline_file.abort()
        raise
    records.meta["engine"] = f"python ({why_not})" if why_not else "compiled"
    return records


def run_compiled(run: LLMRun, progress=None) -> tuple[bool, float]:
    """Run ``run`` in the compiled loop (``sim.compiled``): whether Ctrl-C stopped it, and
    the simulated time reached."""
    core = CompiledPool(run)
    scaler = run.cluster.autoscaler
    scaling = CompiledScaling(core, scaler, run) if scaler is not None else None
    n, ended = run.table.size, 0
    every = max(1, min(PROGRESS_EVERY, n // 100))  # a progress bar moves by 1% at most
    stop = _StopRequest()
    with _ctrl_c_stops(stop):
        try:
            while ended < n:
                if stop.requested:
                    return True, core.now
                now_ended = core.advance(min(n, ended + every))
                if progress is not None:
                    progress.update(now_ended - ended)
                ended = now_ended
        except KeyboardInterrupt:  # from the progress bar, or a second Ctrl-C
            return True, core.now
        finally:
            core.finish()
            if scaling is not None:  # the autoscaler's last instant
                scaling.finish(complete=ended == n)
    return False, core.now


def build_llm(env: simpy.Environment, cfg, requests: pd.DataFrame, progress=None,
              keep_itl_samples: bool = False, timeline_path=None) -> LLMRun:
    """The replicas of ``cfg.cluster`` and the release of ``requests`` to them, as processes
    of ``env`` (``simulate`` runs them alone; ``cluster=mixed`` next to a diffusion pool);
    ``timeline_path``: as ``simulate``'s."""
    ttft_slo = None
    if "ttft_slo_ms" in requests:
        check_ttft_targets(requests["ttft_slo_ms"].to_numpy())
        ttft_slo = requests["ttft_slo_ms"].to_numpy() * 1e-3
    table = RequestTable(requests["arrival_time_s"].to_numpy(),
                         requests["input_tokens"].to_numpy(),
                         requests["output_tokens"].to_numpy(),
                         priority=requests["priority"].to_numpy() if "priority" in requests
                         else None,
                         ttft_slo_s=ttft_slo)
    client = requests["client"].to_numpy(np.int64)
    think = requests["think_time_s"].to_numpy(np.float64)
    hash_ids = requests["hash_ids"].to_numpy() if "hash_ids" in requests else None
    itl = LogHistogram(keep_samples=keep_itl_samples)
    keep = bool(getattr(cfg, "timeline", True))
    cluster = Cluster(env, cfg, table, itl, seed=getattr(cfg, "seed", 0), hash_ids=hash_ids,
                      fast_forward=bool(getattr(cfg, "fast_forward", True)),
                      check_invariants=bool(getattr(cfg, "check_invariants", False)),
                      timeline=keep, timeline_file=TimelineFile(timeline_path, TIMELINE_COLUMNS)
                      if keep and timeline_path is not None else None)
    arrivals = _Arrivals(env, table, cluster, client, think, progress)
    return LLMRun(env, requests, table, client, cluster, arrivals, itl, ttft_slo)


def llm_records(run: LLMRun, interrupted: bool, now: float | None = None) -> Records:
    """The records of an LLM run whose event loop has ended (``interrupted``: by Ctrl-C) at
    simulated time ``now`` (None: the SimPy environment's)."""
    cluster, requests = run.cluster, run.requests
    now = float(run.env.now) if now is None else now
    if not interrupted:  # an interrupt may leave a process ended by the KeyboardInterrupt
        cluster.raise_failed_process()
    if cluster.checker is not None:
        cluster.checker.check_all(-1, "at the end of the run")
    frame = _request_frame(cluster, run.client)
    frame.insert(frame.columns.get_loc("first_scheduled_s"), "engine_arrival_s",
                 cluster.engine_arrival if cluster.engine_arrival is not None
                 else frame["arrival_s"])
    if "request_class" in requests:
        frame.insert(2, "request_class", requests["request_class"].to_numpy())
    if run.ttft_slo is not None:
        frame["ttft_slo_ms"] = requests["ttft_slo_ms"].to_numpy(np.float64)
    meta = run_meta(cluster, now)
    meta.update(sim_time_s=now,
                prefix_caching=bool(getattr(cluster.cfg.kv_cache, "prefix_caching", False)),
                partial=interrupted)
    if interrupted:
        meta["interrupted_at_sim_s"] = now
    if not cluster.keep_timeline:
        meta["step_totals"] = step_totals(cluster)
    timeline = cluster_timeline(cluster)  # finishes a timeline file
    if cluster.timeline_path is not None:
        meta["timeline_file"] = str(cluster.timeline_path)
    return Records(frame, timeline, run.itl, meta)


def _request_frame(cluster: Cluster, client: np.ndarray) -> pd.DataFrame:
    t, pt, dis = cluster.table, cluster.prefill_table, cluster.disagg
    status = np.array(STATUS_NAMES)[t.status]
    nan = np.full(t.size, np.nan)

    def both(col: str) -> np.ndarray:  # a count over the prefill and the decode side
        return getattr(t, col) + getattr(pt, col) if pt is not None else getattr(t, col)

    return pd.DataFrame({
        "request_id": np.arange(t.size),
        "client": client,
        "replica": t.replica,
        "prefill_replica": pt.replica if pt is not None else np.full(t.size, -1, np.int32),
        "arrival_s": t.arrival,
        "first_scheduled_s": t.first_scheduled,
        "first_token_s": t.first_token,
        "completion_s": t.completion,
        "kv_transfer_start_s": dis.start_s if dis is not None else nan,
        "kv_transfer_end_s": dis.end_s if dis is not None else nan,
        "input_tokens": t.prompt,
        "output_tokens": t.max_output,
        "generated_tokens": t.generated,
        "cached_tokens": both("cached_tokens"),
        "num_preemptions": both("preemptions"),
        "num_swaps": both("swaps"),
        "num_retries": both("retries"),
        "priority": t.priority,
        "status": status,
        "reject_reason": np.where(t.status == REJECTED,
                                  np.array(REJECT_REASONS)[t.reject_reason], ""),
        "fail_reason": t.fail_reason_names(),
    })
