"""What an autoscaler decides, without an event loop: Kubernetes HPA's count on a per-replica
metric, the SLO policy's one-step count, HPA's stabilisation windows, and how long a new
replica (or diffusion node) takes to be ready. ``sim.engine.autoscaler`` runs them in the
loop."""

from __future__ import annotations

import math
from collections import deque

from sim.config.autoscaler import AutoscalerConfig


def hpa_recommendation(ready: int, current: int, total: float, target: float,
                       tolerance: float) -> int:
    """Kubernetes HPA's count (``replica_calculator``'s plain-metric rule) on a per-replica
    metric summed to ``total`` over the ``ready`` replicas of ``current`` (ready and
    starting). Usage ``u = total / ready / target``: ``current`` while ``|u − 1|`` is within
    ``tolerance``, else ``ceil(total / target)``. When it would grow while replicas are
    starting, those count at zero load: ``u' = total / current / target``; ``current``
    while ``u'`` is within tolerance or below 1, else ``ceil(total / target)``."""
    usage = total / ready / target if ready else 0.0
    if not (current > ready and usage > 1.0):
        return current if abs(usage - 1.0) <= tolerance else math.ceil(total / target - 1e-9)
    with_starting = total / current / target
    if with_starting < 1.0 + tolerance:
        return current
    return max(current, math.ceil(total / target - 1e-9))


def slo_recommendation(ready: int, current: int, observed: list[tuple[float, float]],
                       waiting: int, scale_down_below: float) -> int:
    """The ``slo`` policy's count (``observed``: (quantile, bound) pairs of the last
    window; ``current``: replicas ready and starting): one more than ``ready`` when a
    quantile breaks its bound (a replica already starting is that one more), one fewer than
    ``current`` when every one is below ``scale_down_below`` × its bound and nothing waits,
    else ``current``; with nothing observed, one fewer if nothing waits, else one more."""
    grow, shrink = max(current, ready + 1), current - 1
    if not observed:
        return shrink if waiting == 0 else grow
    if any(q > b for q, b in observed):
        return grow
    if waiting == 0 and all(q < scale_down_below * b for q, b in observed):
        return shrink
    return current


class Stabilizer:
    """HPA's stabilisation windows: a count grows to the lowest recommendation of the last
    ``up_s`` seconds and shrinks to the highest of the last ``down_s``, never past the
    current count in the other direction."""

    def __init__(self, up_s: float, down_s: float) -> None:
        self.up_s, self.down_s = up_s, down_s
        self.history: deque[tuple[float, int]] = deque()

    def __call__(self, now: float, recommended: int, current: int) -> int:
        """The count to scale to now, given this evaluation's recommendation (HPA keeps the
        recommendations strictly inside a window, and this one)."""
        horizon = now - max(self.up_s, self.down_s)
        while self.history and self.history[0][0] <= horizon:
            self.history.popleft()
        self.history.append((now, recommended))

        def recent(window_s: float) -> list[int]:
            return [r for t, r in self.history if t > now - window_s or t == now]

        if recommended > current:
            return max(current, min(recent(self.up_s)))
        if recommended < current:
            return min(current, max(recent(self.down_s)))
        return current


def windowed_rate(arrivals: deque, now: float, window_s: float) -> float:
    """The ``rate`` policy's metric: arrivals per second in ``(now − window_s, now]``, over
    the time so far before a whole window has passed; ``arrivals`` (times in order) loses
    those older than the window."""
    while arrivals and arrivals[0] <= now - window_s:
        arrivals.popleft()
    return len(arrivals) / min(window_s, now)


def scale_up_delay_s(a: AutoscalerConfig, weight_bytes_per_gpu: float) -> float:
    """Seconds from a scale-up decision to a ready replica: provisioning, each GPU loading
    its shard of the weights at ``storage_bandwidth``, and the engine's start-up."""
    return a.provision_s + weight_bytes_per_gpu / a.storage_bandwidth + a.engine_start_s
