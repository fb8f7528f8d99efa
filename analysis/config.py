"""Schema of the ``slo`` config group: per-request latency bounds."""

from __future__ import annotations

from dataclasses import dataclass

from sim.errors import ConfigError


@dataclass
class SLOConfig:
    """A request meets the SLO when each bound that is set holds (vLLM's ``--goodput``)."""

    name: str = "none"
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None


def slo_is_set(slo) -> bool:
    """Whether any bound of the SLO is given."""
    return slo is not None and any(
        getattr(slo, k) is not None for k in ("ttft_ms", "tpot_ms", "e2el_ms"))


def check_slo(slo) -> None:
    """Bounds, when set, are positive."""
    for key in ("ttft_ms", "tpot_ms", "e2el_ms"):
        v = getattr(slo, key)
        if v is not None and v <= 0:
            raise ConfigError(f"slo.{key}", v, "must be > 0 or null")
