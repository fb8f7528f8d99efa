"""Dynamic batching (Triton Inference Server style): static batches that wait to fill up.

Imitates Triton's dynamic batcher (``dynamic_batching { max_queue_delay_microseconds }`` in the
model configuration; Triton user guide, "Batchers — Dynamic Batcher") in front of a model that
runs one batch to completion: the batcher holds requests until it can send a full batch
(``max_num_seqs``, Triton's ``max_batch_size``) or until the oldest request has waited
``max_queue_delay_ms``, whichever comes first; while a batch runs, newcomers queue. A batch is
also full when the next waiting request would not fit it (padded token budget or KV cache).
Batch formation, padding and cost are those of ``scheduler=static``
(``sim/schedulers/static.py``); ``max_queue_delay_ms=0`` is static batching.
"""

from __future__ import annotations

from sim.config import SchedulerConfig
from sim.kv.manager import PagedKVCache
from sim.records import LogHistogram
from sim.schedulers.static import StaticScheduler
from sim.state import RequestTable


class DynamicScheduler(StaticScheduler):
    """Static batching whose batch starts when full or when its oldest request has waited
    ``max_queue_delay_ms``."""

    name = "dynamic"
    settings = StaticScheduler.settings | {"max_queue_delay_ms"}

    def __init__(self, cfg: SchedulerConfig, table: RequestTable, kv: PagedKVCache,
                 itl: LogHistogram) -> None:
        super().__init__(cfg, table, kv, itl)
        self.delay = cfg.max_queue_delay_ms * 1e-3

    def _deadline(self) -> float:
        return float(self.table.arrival[self.waiting[0]]) + self.delay

    def ready(self, chosen: list[int], now: float) -> bool:
        """Full (the batch size, or a limit stops it before the queue ends) or timed out."""
        if not chosen:
            return False
        full = len(chosen) == self.max_batch or len(chosen) < len(self.waiting)
        return full or now >= self._deadline()

    def next_wakeup(self, now: float) -> float:
        """When the oldest waiting request's delay runs out (inf while a batch runs)."""
        if len(self.running) or not self.waiting:
            return float("inf")
        return self._deadline()
