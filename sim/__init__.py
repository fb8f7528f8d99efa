"""The serving system: SimPy replicas, schedulers, the KV-cache manager and cost models.

Public entry: ``simulate(cfg, requests) -> Records``.
"""

from sim.engine.run import simulate
from sim.records import Records

__all__ = ["Records", "simulate"]
