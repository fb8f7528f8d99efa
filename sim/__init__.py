"""The serving system: SimPy replicas, schedulers, the KV-cache manager and cost models.

Public entry: ``simulate(cfg, requests) -> Records``. Both names load on first use, so that
``import sim.errors`` (the GPU profiler's only need) does not pull in the engine and numba.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sim.engine.run import simulate
    from sim.records import Records

__all__ = ["Records", "simulate"]


def __getattr__(name: str):
    if name == "simulate":
        from sim.engine.run import simulate

        return simulate
    if name == "Records":
        from sim.records import Records

        return Records
    raise AttributeError(f"module 'sim' has no attribute {name!r}")
