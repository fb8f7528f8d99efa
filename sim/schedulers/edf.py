"""Earliest-deadline-first admission on vLLM's token-budget loop.

No mainstream serving engine ships this policy; it is the classic real-time scheduling rule
(Liu & Layland, JACM 1973) applied to the time-to-first-token target. Each request's deadline
is its arrival plus its class's TTFT SLO (``RequestTable.ttft_slo``, from the workload's
``ttft_slo_ms`` column; no SLO = infinitely late, so without classes the order is FCFS).
Everything else is ``scheduler=vllm``: running requests first, chunked prefill under one token
budget; the waiting queue is ordered by ``(deadline, arrival)`` and the preemption victim is
the running request with the latest deadline — vLLM's priority policy with the deadline as
the priority.
"""

from __future__ import annotations

from sim.config import SchedulerConfig
from sim.kv.manager import PagedKVCache
from sim.records import LogHistogram
from sim.schedulers.vllm import VllmScheduler
from sim.state import RequestTable


class EdfScheduler(VllmScheduler):
    """vLLM's loop with waiting requests served by earliest TTFT deadline."""

    name = "edf"
    settings = VllmScheduler.settings - {"policy"}  # the deadline is the order
    fast_path = {k: v for k, v in VllmScheduler.fast_path.items() if k != "policy"}

    def __init__(self, cfg: SchedulerConfig, table: RequestTable, kv: PagedKVCache,
                 itl: LogHistogram) -> None:
        super().__init__(cfg, table, kv, itl)
        arrival, slo = table.arrival, table.ttft_slo
        self._order_by("deadline",
                       lambda rid: (float(arrival[rid] + slo[rid]), float(arrival[rid])))
