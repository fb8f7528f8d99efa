"""Batching policies, selected by ``scheduler.name``; each is one file here, one YAML and
its class in ``SCHEDULERS``, which is built from the names the classes declare (with their
settings, token limits and chunk fields: ``TokenBudgetScheduler``).

Every class is built as ``Cls(cfg, table, kv, itl)`` (``sim.builders``) and is a plain object:
``schedule(now)``, ``update(batch, now)``, ``add_request(rid)``, ``has_work()``,
``next_wakeup(now)`` and the fast-forward hooks of ``TokenBudgetScheduler``.
"""

from sim.registry import by_name
from sim.schedulers.base import Batch, TokenBudgetScheduler
from sim.schedulers.dynamic import DynamicScheduler
from sim.schedulers.edf import EdfScheduler
from sim.schedulers.orca import OrcaScheduler
from sim.schedulers.sarathi import SarathiScheduler
from sim.schedulers.sglang import SglangScheduler
from sim.schedulers.static import PaddedBatch, StaticScheduler
from sim.schedulers.trtllm import TrtllmScheduler
from sim.schedulers.vllm import VllmScheduler

SCHEDULERS = by_name(StaticScheduler, DynamicScheduler, OrcaScheduler, VllmScheduler,
                     SarathiScheduler, TrtllmScheduler, EdfScheduler, SglangScheduler)

__all__ = ["SCHEDULERS", "Batch", "DynamicScheduler", "EdfScheduler", "OrcaScheduler",
           "PaddedBatch", "SarathiScheduler", "SglangScheduler", "StaticScheduler",
           "TokenBudgetScheduler", "TrtllmScheduler", "VllmScheduler"]
