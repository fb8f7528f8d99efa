"""Request classes: a workload's traffic split into named classes with a priority and a TTFT SLO.

A class (``RequestClassConfig``) has a ``name``, a ``share`` of the traffic, a ``priority``
(lower = more urgent, vLLM's convention) and a ``ttft_slo_ms`` (None: no target). Each request
independently belongs to class ``k`` with probability ``share_k``; ``assign_classes`` adds the
columns ``request_class`` (str), ``priority`` (int64) and ``ttft_slo_ms`` (float64, inf when
the class has no target) that the simulator reads. The draw uses its own random stream, so
adding classes to a workload changes neither its arrivals nor its lengths.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from scenarios.errors import WorkloadError

CLASS_COLUMNS = ("request_class", "priority", "ttft_slo_ms")
SHARE_TOLERANCE = 1e-6


@dataclass
class RequestClassConfig:
    """One class of requests: its name, share of the traffic, priority and TTFT target."""

    name: str = "???"
    share: float = 1.0
    priority: int = 0  # lower is more urgent (vLLM's convention)
    ttft_slo_ms: float | None = None  # None: no TTFT target (an infinitely late deadline)


def check_classes(classes: Any) -> None:
    """Validate ``workload.classes``: unique non-empty names, shares in (0, 1] summing to 1,
    integer priorities, positive TTFT targets; raise ``WorkloadError`` naming the field."""
    names = set()
    for i, c in enumerate(classes):
        field = f"workload.classes[{i}]"
        if not isinstance(c.name, str) or not c.name or c.name == "???":
            raise WorkloadError(f"{field}.name", c.name, "a non-empty class name")
        if c.name in names:
            raise WorkloadError(f"{field}.name", c.name, "class names must be unique")
        names.add(c.name)
        share = c.share
        if not (isinstance(share, numbers.Real) and math.isfinite(share) and 0 < share <= 1):
            raise WorkloadError(f"{field}.share", share, "must be a number in (0, 1]")
        if not isinstance(c.priority, numbers.Integral) or isinstance(c.priority, bool):
            raise WorkloadError(f"{field}.priority", c.priority, "must be an integer")
        slo = c.ttft_slo_ms
        if slo is not None and not (isinstance(slo, numbers.Real) and slo > 0):
            raise WorkloadError(f"{field}.ttft_slo_ms", slo, "must be a number > 0 (or null)")
    total = float(sum(c.share for c in classes))
    if classes and abs(total - 1.0) > SHARE_TOLERANCE:
        raise WorkloadError("workload.classes", [c.name for c in classes],
                            f"shares must sum to 1 (they sum to {total:g})")


def assign_classes(classes: Any, n: int, rng: np.random.Generator) -> pd.DataFrame:
    """The class columns of ``n`` requests, each drawn independently by share from ``rng``."""
    shares = np.array([c.share for c in classes], dtype=float)
    k = rng.choice(len(shares), size=n, p=shares / shares.sum())
    names = np.array([c.name for c in classes], dtype=object)
    priority = np.array([int(c.priority) for c in classes], dtype=np.int64)
    slo = np.array([math.inf if c.ttft_slo_ms is None else float(c.ttft_slo_ms)
                    for c in classes])
    return pd.DataFrame({"request_class": names[k], "priority": priority[k],
                         "ttft_slo_ms": slo[k]})
