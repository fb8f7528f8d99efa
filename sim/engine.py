"""``simulate``: the one public call of the simulation core.

It takes the composed config and a request table (the contract of ``scenarios.build_requests``:
columns ``arrival_time_s, input_tokens, output_tokens, client, think_time_s``; closed-loop
follow-ups have a NaN arrival and are released ``think_time_s`` after the same client's previous
request ends; optional columns ``priority``, ``ttft_slo_ms`` and ``request_class`` carry request
classes) and returns ``Records``. It imports neither scenario readers nor analysis.
"""

from __future__ import annotations

import heapq
import math

import numpy as np
import pandas as pd
import simpy

from sim.builders import ReplicaParts, build_replica_parts
from sim.records import LogHistogram, Records
from sim.replica import Replica
from sim.state import REJECT_REASONS, REJECTED, TOO_BIG_FOR_CACHE, TOO_LONG, RequestTable

STATUS_NAMES = np.array(["pending", "waiting", "running", "completed", "rejected"])


def _next_of_client(client: np.ndarray) -> np.ndarray:
    """For each row, the next row of the same client (−1 if none or open loop)."""
    nxt = np.full(len(client), -1, np.int64)
    closed = np.flatnonzero(client >= 0)
    if len(closed):
        order = closed[np.argsort(client[closed], kind="stable")]
        same = client[order[1:]] == client[order[:-1]]
        nxt[order[:-1][same]] = order[1:][same]
    return nxt


class _Arrivals:
    """Releases requests to the replica: open-loop at their times, closed-loop on completion."""

    def __init__(self, env, table: RequestTable, replica: Replica, parts: ReplicaParts,
                 client: np.ndarray, think: np.ndarray, progress) -> None:
        self.env, self.table, self.replica, self.parts = env, table, replica, parts
        self.think, self.next_of = think, _next_of_client(client)
        self.progress = progress
        replica.on_complete = self.completed
        replica.next_arrival = self.next_time
        first = np.flatnonzero(~np.isnan(table.arrival))
        self.initial = first[np.argsort(table.arrival[first], kind="stable")]
        self.initial_times = table.arrival[self.initial].copy()
        total = table.prompt + table.max_output
        # the last output token is sampled, never cached: total − 1 tokens must fit
        self.admissible = (total <= parts.max_model_len) & parts.kv.fits_alone(total - 1)
        self._cursor = 0  # index into initial of the next open-loop arrival
        self._delayed: list[tuple[float, int]] = []  # heap of pending (time, id) releases
        env.process(self._open_loop())

    def next_time(self) -> float:
        """When the next request reaches the server (inf if none is known yet)."""
        t = self.initial_times[self._cursor] if self._cursor < len(self.initial) else math.inf
        return min(t, self._delayed[0][0]) if self._delayed else t

    def _open_loop(self):
        env = self.env
        for i, rid in enumerate(self.initial):
            delay = self.initial_times[i] - env.now
            if delay > 0:
                yield env.timeout(delay)
            self._cursor = i + 1
            self.release(int(rid))

    def _release_delayed(self, rid: int) -> None:
        heapq.heappop(self._delayed)
        self.release(rid)

    def release(self, rid: int) -> None:
        """A request reaches the server now: refuse it with a reason, or queue it."""
        now, t, p = self.env.now, self.table, self.parts
        t.arrival[rid] = now
        if self.admissible[rid]:
            self.replica.submit(rid)
        elif t.prompt[rid] + t.max_output[rid] > p.max_model_len:
            self._reject(rid, TOO_LONG)
        else:
            self._reject(rid, TOO_BIG_FOR_CACHE)

    def _reject(self, rid: int, reason: int) -> None:
        self.table.reject(rid, reason, self.env.now)
        self.completed(np.array([rid]), self.env.now)

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
                delay = float(self.think[nxt])
                heapq.heappush(self._delayed, (now + delay, nxt))
                self.env.timeout(delay).callbacks.append(
                    lambda _e, r=nxt: self._release_delayed(r))


def simulate(cfg, requests: pd.DataFrame, progress=None, keep_itl_samples: bool = False) -> Records:
    """Run one serving replica over ``requests`` and return its records.

    ``cfg`` is the composed config (model, hardware, scheduler, kv_cache, cluster, cost_model);
    ``progress`` is an optional tqdm-like object updated by completed request counts.
    """
    ttft_slo = requests["ttft_slo_ms"].to_numpy() * 1e-3 if "ttft_slo_ms" in requests else None
    table = RequestTable(requests["arrival_time_s"].to_numpy(),
                         requests["input_tokens"].to_numpy(),
                         requests["output_tokens"].to_numpy(),
                         priority=requests["priority"].to_numpy() if "priority" in requests
                         else None,
                         ttft_slo_s=ttft_slo)
    client = requests["client"].to_numpy(np.int64)
    think = requests["think_time_s"].to_numpy(np.float64)
    env = simpy.Environment()
    itl = LogHistogram(keep_samples=keep_itl_samples)
    parts = build_replica_parts(cfg, table, itl)
    replica = Replica(env, parts.scheduler, parts.cost_model, on_complete=lambda ids, now: None,
                      fast_forward=bool(getattr(cfg, "fast_forward", True)))
    _Arrivals(env, table, replica, parts, client, think, progress)
    env.run()
    frame = _request_frame(table, client)
    if "request_class" in requests:
        frame.insert(2, "request_class", requests["request_class"].to_numpy())
    return Records(frame, replica.timeline.to_frame(), itl,
                   dict(parts.meta, sim_time_s=float(env.now)))


def _request_frame(t: RequestTable, client: np.ndarray) -> pd.DataFrame:
    status = STATUS_NAMES[t.status]
    return pd.DataFrame({
        "request_id": np.arange(t.size),
        "client": client,
        "replica": np.zeros(t.size, np.int32),
        "arrival_s": t.arrival,
        "first_scheduled_s": t.first_scheduled,
        "first_token_s": t.first_token,
        "completion_s": t.completion,
        "input_tokens": t.prompt,
        "output_tokens": t.max_output,
        "generated_tokens": t.generated,
        "num_preemptions": t.preemptions,
        "priority": t.priority,
        "status": status,
        "reject_reason": np.where(t.status == REJECTED,
                                  np.array(REJECT_REASONS)[t.reject_reason], ""),
    })
