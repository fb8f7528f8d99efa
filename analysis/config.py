"""Schema of the ``slo`` config group: per-request latency bounds."""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.errors import ConfigError

# each bound's name is the per-request latency column it limits (analysis.metrics
# per_request_latencies); a key outside the schema fails when Hydra composes the config
SLO_BOUNDS = ("ttft_ms", "tpot_ms", "e2el_ms")


@dataclass
class SLOConfig:
    """A request meets the SLO when each bound that is set holds (vLLM's ``--goodput``)."""

    name: str = "none"
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None


def slo_is_set(slo) -> bool:
    """Whether any bound of the SLO is given."""
    return slo is not None and any(getattr(slo, k) is not None for k in SLO_BOUNDS)


def check_slo(slo) -> None:
    """Bounds, when set, are finite and positive."""
    for key in SLO_BOUNDS:
        v = getattr(slo, key)
        if v is not None and not (v > 0 and math.isfinite(v)):
            raise ConfigError(f"slo.{key}", v, "must be a finite number > 0 or null")
