"""Workload scenarios: turn a workload config into a table of requests (no GPUs, no sim).

``build_requests(workload, rng_arrivals, rng_lengths)`` is the public entry; see
``scenarios.workload`` for the table's contract.
"""

from scenarios.classes import RequestClassConfig
from scenarios.config import (
    LengthConfig,
    MultiTurnConfig,
    SystemPromptConfig,
    WorkloadConfig,
    check_workload,
)
from scenarios.errors import WorkloadError
from scenarios.workload import build_requests, requests_for_seed

__all__ = ["LengthConfig", "MultiTurnConfig", "RequestClassConfig", "SystemPromptConfig",
           "WorkloadConfig", "WorkloadError", "build_requests", "check_workload",
           "requests_for_seed"]
