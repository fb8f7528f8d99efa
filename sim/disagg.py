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
shard (the smaller tensor-parallel size) sets the time. The decode replica allocates its
blocks when the request is admitted after the transfer; a transfer whose decode replica fails
is sent again to another one.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sim.cost.base import BOUNDS
from sim.memory import kv_bytes_per_token
from sim.records import ColumnBuffer
from sim.replica import TIMELINE_COLUMNS
from sim.state import TRANSFERRING

KIND_KV_TRANSFER = 1  # code of a transfer in the timeline's ``kind`` column (0: a step)


class Disaggregation:
    """Moves requests from the prefill pool to the decode pool of a cluster."""

    def __init__(self, cluster, prefill, decode) -> None:
        """``cluster``: the owning ``Cluster``; ``prefill``/``decode``: its two pools."""
        self.cluster, self.prefill, self.decode = cluster, prefill, decode
        prefill.on_finish = self._prefilled
        cfg = cluster.cfg
        c = cfg.cluster
        tps = (p.cfg.cluster.tensor_parallel_size for p in (prefill, decode))
        # pipeline stages hold their own layers: each GPU sends its stage's shard
        per_gpu = max(kv_bytes_per_token(cfg.model, cfg.kv_cache, tp) for tp in tps) / max(
            1, getattr(c, "pipeline_parallel_size", 1))
        bandwidth = c.kv_transfer_bandwidth or cfg.hardware.nvlink_bandwidth
        self.seconds_per_token = per_gpu / bandwidth
        self.latency_s = c.kv_transfer_latency_us * 1e-6
        n = cluster.table.size
        self.start_s = np.full(n, np.nan)  # of the last transfer of each request
        self.end_s = np.full(n, np.nan)
        self._rows = ColumnBuffer(TIMELINE_COLUMNS, capacity=1024)
        self._row_replica: list[int] = []
        self._parked: list[int] = []  # prefilled while no decode replica was up
        self._comm = BOUNDS.index("comm")

    def transfer_time(self, prompt_tokens: int) -> float:
        """Seconds to move the KV cache of a prompt to a decode replica."""
        return self.latency_s + prompt_tokens * self.seconds_per_token

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
        r = c.assign(self.decode, rid)
        if r < 0:
            self._parked.append(rid)
            return
        duration = self.transfer_time(int(t.prompt[rid]))
        self.start_s[rid] = now
        blocks = self.decode.view.schedulers[r].kv.blocks_for(t.prompt[rid])
        self._rows.append(now, duration, 1, t.prompt[rid], 0, 0, 0, blocks,
                          0.0, 0.0, duration, 0.0, self._comm, 0.0)
        self._row_replica.append(self.decode.first + r)
        attempt = int(t.retries[rid])
        c.env.timeout(duration).callbacks.append(
            lambda _e, rid=rid, r=r, a=attempt: self._arrived(rid, r, a))

    def _arrived(self, rid: int, r: int, attempt: int) -> None:
        c = self.cluster
        t = c.table
        if t.retries[rid] != attempt:  # its decode replica failed meanwhile: sent again
            return
        self.end_s[rid] = c.env.now
        t.computed[rid] = t.prompt[rid] - 1  # the last prompt token is recomputed here
        self.decode.replicas[r].submit(rid)

    def resume(self) -> None:
        """A decode replica is back: send what was prefilled while none was up."""
        parked, self._parked = self._parked, []
        for rid in parked:
            self.send(rid)

    def timeline(self) -> pd.DataFrame:
        """One row per transfer, on the receiving replica: ``step_time_s`` and ``comm_s``
        are its duration, ``scheduled_tokens`` and ``kv_blocks_used`` the prompt tokens and
        KV blocks moved."""
        tl = self._rows.to_frame()
        tl.insert(0, "replica", np.array(self._row_replica, np.int32))
        tl["kind"] = np.int8(KIND_KV_TRANSFER)
        return tl
