"""Batching policies, selected by ``scheduler.name``; each is one file here and one YAML."""

from sim.schedulers.base import Batch, TokenBudgetScheduler
from sim.schedulers.vllm import VllmScheduler

SCHEDULERS = {"vllm": VllmScheduler}

__all__ = ["SCHEDULERS", "Batch", "TokenBudgetScheduler", "VllmScheduler"]
