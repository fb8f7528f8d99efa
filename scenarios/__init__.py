"""Workload scenarios: turn a workload config into a table of requests (no GPUs, no sim).

``build_requests(workload, rng_arrivals, rng_lengths)`` is the public entry for LLM requests
(see ``scenarios.workload`` for the table's contract) and ``build_jobs(workload, default_model,
seed)`` for diffusion jobs (``scenarios.diffusion``).
"""

from scenarios.classes import RequestClassConfig
from scenarios.config import (
    LengthConfig,
    MultiTurnConfig,
    SystemPromptConfig,
    WorkloadConfig,
    check_workload,
)
from scenarios.diffusion import build_jobs
from scenarios.diffusion_config import JobShapeConfig, PriorityClassConfig
from scenarios.errors import WorkloadError
from scenarios.workload import build_requests, requests_for_seed

__all__ = ["JobShapeConfig", "LengthConfig", "MultiTurnConfig", "PriorityClassConfig",
           "RequestClassConfig", "SystemPromptConfig", "WorkloadConfig", "WorkloadError",
           "build_jobs", "build_requests", "check_workload", "requests_for_seed"]
