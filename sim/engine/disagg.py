"""Prefill/decode disaggregation: the hand-over of a prefilled request to a decode replica.

Imitates vLLM's disaggregated serving with a KV connector (NixlConnector, as Dynamo and
llm-d deploy it): a prefill replica computes the whole prompt (its sampled token is not
returned); the decode replica the router picks receives the prompt's KV cache over a link,
then recomputes the last prompt token to get its logits (vLLM sets the decode request's
``num_computed_tokens`` to the prompt length − 1) and streams every output token. So TTFT =
prefill queue and compute + transfer + the decode replica's first step.

The transfer takes ``kv_transfer_latency_us + prompt tokens × bytes per token per GPU /
kv_transfer_bandwidth``: every GPU of a replica moves its own shard of the KV cache (its
KV heads of its pipeline stage's layers) over its own link, and the side with the larger
shard (the smaller tensor-parallel size) sets the time. Sliding-window layers that keep only
their window (``sim.kv.rules.sliding_paged_as_full``) send the last ``min(prompt,
sliding_window)`` tokens' K and V. The decode replica allocates its
blocks when the request is admitted after the transfer; a transfer whose decode replica fails
is sent again to another one (unless the request has used up its retries), and a prefilled
request fails (``no_replica_left``) when every decode replica is lost for good.

With ``cluster.link_degradation`` the link has episodes of lower bandwidth and added latency
(``sim.engine.faults.LinkSchedule``): a transfer's data moves piecewise at the bandwidth in force at
each instant, and the added latency counts when the transfer starts inside an episode.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sim.cost.base import BOUNDS
from sim.engine.faults import LinkSchedule
from sim.engine.replica import TIMELINE_COLUMNS
from sim.kv.budget import kv_bytes_per_token, window_bytes_per_token
from sim.kv.rules import sliding_paged_as_full
from sim.records import ColumnBuffer
from sim.state import NO_REPLICA_LEFT, TRANSFERRING

KIND_KV_TRANSFER = 1  # code of a transfer in the timeline's ``kind`` column (0: a step)


class Disaggregation:
    """Moves requests from the prefill pool to the decode pool of a cluster."""

    def __init__(self, cluster, prefill, decode, link: LinkSchedule | None = None) -> None:
        """``cluster``: the owning ``Cluster``; ``prefill``/``decode``: its two pools;
        ``link``: the link's degraded episodes (None: always at full speed)."""
        self.cluster, self.prefill, self.decode = cluster, prefill, decode
        self.link = link
        prefill.on_finish = self._prefilled
        cfg = cluster.cfg
        c = cfg.cluster
        # pipeline stages hold their own layers: each GPU sends its stage's shard
        full = sliding_paged_as_full(cfg.backend.name, cfg.model, cfg.kv_cache)
        tps = [p.cfg.cluster.tensor_parallel_size for p in (prefill, decode)]
        stages = max(1, getattr(c, "pipeline_parallel_size", 1))
        per_gpu = max(kv_bytes_per_token(cfg.model, cfg.kv_cache, tp, sliding_full=full)
                      for tp in tps) / stages
        window = max(window_bytes_per_token(cfg.model, cfg.kv_cache, tp, sliding_full=full)
                     for tp in tps) / stages
        bandwidth = c.kv_transfer_bandwidth or cfg.hardware.nvlink_bandwidth
        self.seconds_per_token = per_gpu / bandwidth
        # the window's tokens of the sliding-window layers paged by window
        self.window_seconds_per_token = window / bandwidth
        self.window_tokens = cfg.model.sliding_window if window else 0
        self.latency_s = c.kv_transfer_latency_us * 1e-6
        n = cluster.table.size
        self.start_s = np.full(n, np.nan)  # of the last transfer of each request
        self.end_s = np.full(n, np.nan)
        # one timeline row per transfer, unless the run keeps step totals only
        self._rows = ColumnBuffer(TIMELINE_COLUMNS, capacity=1024) if (
            cluster.keep_timeline or cluster.timeline_file is not None) else None
        self._row_replica: list[int] = []
        self.parked: list[int] = []  # prefilled while no decode replica was up
        self.in_flight: dict[int, int] = {}  # rid → retry count when its transfer started
        self._comm = BOUNDS.index("comm")

    def transfer_time(self, prompt_tokens: int, start: float = 0.0) -> float:
        """Seconds to move the KV cache of a prompt to a decode replica, starting at
        ``start`` (which matters only on a degraded link)."""
        data_s = prompt_tokens * self.seconds_per_token + \
            min(prompt_tokens, self.window_tokens) * self.window_seconds_per_token
        if self.link is None:
            return self.latency_s + data_s
        return self.link.transfer_time(start, self.latency_s, data_s)

    def _prefilled(self, pool, r: int, ids: np.ndarray, now: float) -> None:
        pool.view.outstanding[r] -= len(ids)
        t = self.cluster.table
        t.first_scheduled[ids] = np.fmin(t.first_scheduled[ids],
                                         self.cluster.prefill_table.first_scheduled[ids])
        for rid in ids:
            self.send(int(rid))

    def send(self, rid: int) -> None:
        """Start moving the KV cache of prefilled ``rid`` to a decode replica."""
        c = self.cluster
        t, now = c.table, c.env.now
        t.status[rid] = TRANSFERRING
        self.in_flight.pop(rid, None)  # a transfer its decode replica's failure cut short
        r = c.assign(self.decode, rid)
        if r < 0:
            if c.lost(self.decode):
                c.fail_requests(np.array([rid]), NO_REPLICA_LEFT)
            else:
                self.parked.append(rid)
            return
        duration = self.transfer_time(int(t.prompt[rid]), now)
        self.start_s[rid] = now
        if self._rows is not None:
            blocks = self.decode.view.schedulers[r].kv.blocks_for(t.prompt[rid])
            self._rows.append(now, duration, 1, t.prompt[rid], 0, 0, 0, blocks,
                              0.0, 0.0, duration, 0.0, self._comm, 0.0)
            self._row_replica.append(self.decode.first + r)
        attempt = self.in_flight[rid] = int(t.retries[rid])
        c.env.timeout(duration).callbacks.append(
            lambda _e, rid=rid, r=r, a=attempt: self._arrived(rid, r, a))

    def _arrived(self, rid: int, r: int, attempt: int) -> None:
        c = self.cluster
        t = c.table
        if t.retries[rid] != attempt:  # its decode replica failed meanwhile: sent again
            return
        del self.in_flight[rid]
        self.end_s[rid] = c.env.now
        t.computed[rid] = t.prompt[rid] - 1  # the last prompt token is recomputed here
        # its frontend admitted it on the prefill side
        self.decode.replicas[r].accept(rid, hold=False)

    def resume(self) -> None:
        """A decode replica is back: send what was prefilled while none was up."""
        parked, self.parked = self.parked, []
        for rid in parked:
            self.send(rid)

    def give_up(self) -> None:
        """Every decode replica is lost for good: what waits for one fails."""
        parked, self.parked = self.parked, []
        if parked:
            self.cluster.fail_requests(np.array(parked, np.int64), NO_REPLICA_LEFT)

    def timeline(self) -> pd.DataFrame:
        """One row per transfer, on the receiving replica: ``step_time_s`` and ``comm_s``
        are its duration, ``scheduled_tokens`` and ``kv_blocks_used`` the prompt tokens and
        KV blocks moved."""
        tl = self._rows.to_frame()
        tl.insert(0, "replica", np.array(self._row_replica, np.int32))
        tl["kind"] = np.int8(KIND_KV_TRANSFER)
        return tl
