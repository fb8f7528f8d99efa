"""Per-request state of a simulation, held in columns (numpy arrays indexed by request id).

A request has ``prompt`` tokens and asks for ``max_output`` tokens. ``num_tokens`` is what
the engine knows of it (prompt + tokens generated so far) and ``computed`` how many of those
are in the KV cache. A step that brings ``computed`` up to ``num_tokens`` samples one new
token (vLLM semantics); a request finishes when it has generated ``max_output`` tokens.
Preemption by recompute sets ``computed`` back to 0 and keeps the generated tokens.

One table is shared by every replica of a run (a request is on one replica at a time);
``replica`` says which one holds it, and a retry after a replica failure is a recompute on
another replica, counted in ``retries``. Every request ends in one of three ways: completed
(``FINISHED``), rejected at arrival with a ``reject_reason``, or failed by a fault with a
``fail_reason`` (too many retries, or no replica of its pool left).
"""

from __future__ import annotations

import numpy as np

from sim.errors import ConfigError

# status codes; TRANSFERRING: prefilled, its KV cache on the way to a decode replica
PENDING, WAITING, RUNNING, FINISHED, REJECTED, TRANSFERRING, FAILED = range(7)
STATUS_NAMES = ("pending", "waiting", "running", "completed", "rejected", "transferring",
                "failed")
ENDED = (FINISHED, REJECTED, FAILED)  # a request in one of these is done for good
REJECT_REASONS = ("", "exceeds_max_model_len", "exceeds_kv_cache")
TOO_LONG, TOO_BIG_FOR_CACHE = 1, 2  # indices into REJECT_REASONS
FAIL_REASONS = ("", "retries_exhausted", "no_replica_left")
RETRIES_EXHAUSTED, NO_REPLICA_LEFT = 1, 2  # indices into FAIL_REASONS


class RequestTable:
    """Columnar state and timestamps of every request of one simulation."""

    def __init__(self, arrival_s: np.ndarray, prompt: np.ndarray, max_output: np.ndarray,
                 priority: np.ndarray | None = None, ttft_slo_s: np.ndarray | None = None) -> None:
        """``priority``: lower is more urgent (vLLM's convention), 0 when absent;
        ``ttft_slo_s``: each request's TTFT target (its deadline is arrival + target), inf
        when absent."""
        n = len(prompt)
        self.size = n
        self.arrival = np.asarray(arrival_s, dtype=np.float64).copy()
        self.prompt = np.asarray(prompt, dtype=np.int64)
        self.max_output = np.asarray(max_output, dtype=np.int64)
        self.priority = (np.zeros(n, np.int64) if priority is None
                         else np.asarray(priority, dtype=np.int64))
        self.ttft_slo = (np.full(n, np.inf) if ttft_slo_s is None
                         else np.asarray(ttft_slo_s, dtype=np.float64))
        self.num_tokens = self.prompt.copy()
        self.computed = np.zeros(n, np.int64)
        self.generated = np.zeros(n, np.int64)
        self.preemptions = np.zeros(n, np.int32)
        self.retries = np.zeros(n, np.int32)
        self.replica = np.full(n, -1, np.int32)
        # filled by the KV manager: prompt tokens served from the prefix cache, swap-outs
        self.cached_tokens = np.zeros(n, np.int64)
        self.swaps = np.zeros(n, np.int32)
        self.status = np.full(n, PENDING, np.int8)
        self.reject_reason = np.zeros(n, np.int8)
        self.fail_reason = np.zeros(n, np.int8)
        nan = np.full(n, np.nan)
        self.first_scheduled = nan.copy()
        self.first_token = nan.copy()
        self.last_token = nan.copy()
        self.completion = nan.copy()

    def preempt(self, rid: int) -> None:
        """Recompute preemption: the KV cache of ``rid`` is dropped, its tokens are kept."""
        self.computed[rid] = 0
        self.preemptions[rid] += 1
        self.status[rid] = WAITING

    def retry(self, rids: np.ndarray) -> None:
        """The replica holding ``rids`` failed: their KV caches are lost, their tokens kept
        (already streamed to the client); they wait for a replica to recompute them."""
        self.computed[rids] = 0
        self.retries[rids] += 1
        self.status[rids] = PENDING
        self.replica[rids] = -1

    def reject(self, rid: int, reason: int, now: float) -> None:
        """Mark ``rid`` as refused at ``now`` with a code from ``REJECT_REASONS``."""
        self.status[rid] = REJECTED
        self.reject_reason[rid] = reason
        self.completion[rid] = now

    def fail(self, rids, reason: int, now: float) -> None:
        """Mark ``rids`` as failed at ``now`` (they cannot complete: a fault took their last
        chance) with a code from ``FAIL_REASONS``; their generated tokens are kept. A client
        sees the failure after the last token its API server was still streaming (the
        frontend outlives the engine), so it ends no earlier than that token."""
        self.status[rids] = FAILED
        self.fail_reason[rids] = reason
        self.completion[rids] = np.fmax(now, self.last_token[rids])

    def fail_reason_names(self) -> np.ndarray:
        """Per request, why it failed ("" unless its status is failed)."""
        return np.where(self.status == FAILED, np.array(FAIL_REASONS)[self.fail_reason], "")


def check_ttft_targets(ttft_slo_ms: np.ndarray) -> None:
    """Refuse a ``ttft_slo_ms`` column with a target that is not a number > 0 (inf: none), as
    the workload's classes are refused: a NaN deadline compares with nothing, so a keyed order
    (``scheduler=edf``) could no longer pick one victim among its requests. One
    ``ConfigError`` naming the first bad row and its value."""
    slo = np.asarray(ttft_slo_ms, np.float64)
    rows = np.flatnonzero(~(slo > 0))
    if len(rows):
        raise ConfigError(f"requests.ttft_slo_ms (row {rows[0]})", float(slo[rows[0]]),
                          "a number > 0 in milliseconds (inf: no target)")


def check_releases(arrival: np.ndarray, think: np.ndarray, follow_up: np.ndarray) -> None:
    """Refuse a request table whose requests cannot all be released as it says: an arrival
    that is not a finite time ≥ 0 (NaN only for a closed-loop follow-up), a think time that
    is not, a follow-up (``follow_up``: the next request of its row's client) with an arrival
    time of its own, or a row with none that is nobody's follow-up. One ``ConfigError``
    naming the column, the first bad row and its value."""
    arrival, think = np.asarray(arrival, np.float64), np.asarray(think, np.float64)
    empty = np.isnan(arrival)
    checks = (
        ("arrival_time_s", arrival, ~empty & ~((arrival >= 0) & np.isfinite(arrival)),
         "a finite time >= 0 in seconds"),
        ("think_time_s", think, ~(np.isfinite(think) & (think >= 0)),
         "a finite time >= 0 in seconds"),
        ("arrival_time_s", arrival, follow_up & ~empty,
         "empty (NaN): the row follows its client's previous request, which releases it"),
        ("arrival_time_s", arrival, ~follow_up & empty,
         "a time: the row is the first of its client (or of no client), so nothing else "
         "releases it"),
    )
    for column, values, bad, expected in checks:
        rows = np.flatnonzero(bad)
        if len(rows):
            raise ConfigError(f"requests.{column} (row {rows[0]})", float(values[rows[0]]),
                              expected)
