"""Simulated faults other than replica failures: slow replicas and a degraded KV link.

Both are *episodes*: intervals of simulated time during which a fault is in force. Between
two episodes lies an exponential gap (mean ``mtbs_s`` for stragglers, ``mtbd_s`` for the
link), and an episode lasts ``duration_s``; without a mean gap a straggler is slow for the
whole run. Episodes are drawn lazily from their own random stream, always in the same order,
so when they are asked about (step by step, or once per fast-forward window) never changes
them.

- A straggler replica runs every step that *starts* during an episode ``factor`` times
  slower (``SpeedSchedule``); a step in progress when an episode starts or ends keeps the
  factor of its start, and a decode window ends at the first step boundary at or after an
  episode boundary, so fast-forward prices each step as stepping one by one would.
- A degraded link moves KV data at ``bandwidth_factor`` times its bandwidth and adds
  ``added_latency_us`` to a transfer that starts during an episode (``LinkSchedule``).
  A transfer is priced piecewise: its data moves at the bandwidth in force at each instant,
  so one that spans an episode's start or end is slowed for the part inside it.

Streams are children of ``SeedSequence(seed)``: the choice of stragglers ``(5, 0)``, the
episodes of run-wide replica ``g`` ``(5, 1 + g)``, the link's episodes ``(6,)``.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right

import numpy as np

from sim.config.cluster import ClusterConfig, LinkDegradationConfig, StragglerConfig

STRAGGLER_STREAM, LINK_STREAM = 5, 6  # spawn keys under the run's SeedSequence


class Episodes:
    """When one fault is in force: alternating gaps (exponential, mean ``mean_gap_s``) and
    episodes of ``duration_s``, starting with a gap at time 0; or, with ``mean_gap_s`` None,
    one episode that lasts the whole run."""

    def __init__(self, rng: np.random.Generator | None, mean_gap_s: float | None,
                 duration_s: float) -> None:
        self.always = mean_gap_s is None
        self._rng, self._gap, self._duration = rng, mean_gap_s, float(duration_s)
        self.starts: list[float] = []
        self.ends: list[float] = []

    def _draw_past(self, t: float) -> None:
        """Draw episodes until one ends after ``t``."""
        while not self.ends or self.ends[-1] <= t:
            start = (self.ends[-1] if self.ends else 0.0) + self._rng.exponential(self._gap)
            self.starts.append(start)
            self.ends.append(start + self._duration)

    def _index(self, t: float) -> int:
        self._draw_past(t)
        return bisect_right(self.starts, t) - 1  # the last episode started by t (−1: none)

    def active(self, t: float) -> bool:
        """Whether an episode is in force at ``t`` (episodes are ``[start, end)``)."""
        if self.always:
            return True
        i = self._index(t)
        return i >= 0 and t < self.ends[i]

    def next_change(self, t: float) -> float:
        """The first time after ``t`` at which ``active`` changes (inf: never)."""
        if self.always:
            return math.inf
        i = self._index(t)
        return self.ends[i] if i >= 0 and t < self.ends[i] else self.starts[i + 1]

    def started(self, until: float) -> list[tuple[float, float]]:
        """(start, end) of every episode that started before ``until``."""
        if self.always:
            return [(0.0, math.inf)]
        self._draw_past(until)
        n = bisect_left(self.starts, until)
        return list(zip(self.starts[:n], self.ends[:n], strict=True))


class SpeedSchedule:
    """The step-time factor of one straggler replica over time."""

    def __init__(self, factor: float, episodes: Episodes) -> None:
        self.factor, self.episodes = float(factor), episodes

    def factor_at(self, t: float) -> float:
        """Multiplier of the time of a step that starts at ``t``."""
        return self.factor if self.episodes.active(t) else 1.0

    def next_change(self, t: float) -> float:
        """When the factor next changes after ``t`` (inf: never)."""
        return self.episodes.next_change(t)


class LinkSchedule:
    """Bandwidth and latency of the KV-transfer link over time."""

    def __init__(self, bandwidth_factor: float, added_latency_s: float,
                 episodes: Episodes) -> None:
        self.factor, self.added_latency_s = float(bandwidth_factor), float(added_latency_s)
        self.episodes = episodes

    def transfer_time(self, start: float, latency_s: float, data_s: float) -> float:
        """Seconds a transfer starting at ``start`` takes: its latency (plus the added one
        if an episode is in force then), then ``data_s`` seconds of data at full bandwidth,
        moved piecewise at the bandwidth in force at each instant."""
        ep = self.episodes
        elapsed = latency_s + (self.added_latency_s if ep.active(start) else 0.0)
        t, left = start + elapsed, data_s
        while True:
            rate = self.factor if ep.active(t) else 1.0
            change = ep.next_change(t)
            if (change - t) * rate >= left:
                return elapsed + left / rate
            left -= (change - t) * rate
            elapsed += change - t
            t = change  # exactly on the boundary, so the next piece sees the new state


def _stream(seed: int, *key: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=key))


def stragglers(cfg: StragglerConfig, num_replicas: int, seed: int) -> dict[int, SpeedSchedule]:
    """Run-wide replica id → its speed schedule, for the stragglers of ``cfg``
    (``cluster.straggler``); empty when there are none."""
    if cfg.replicas:
        chosen = sorted(int(r) for r in cfg.replicas)
    else:
        k = math.ceil(cfg.fraction * num_replicas - 1e-9)
        chosen = sorted(_stream(seed, STRAGGLER_STREAM, 0).choice(num_replicas, k,
                                                                  replace=False).tolist())
    if cfg.factor == 1.0:
        return {}
    return {g: SpeedSchedule(cfg.factor, Episodes(_stream(seed, STRAGGLER_STREAM, 1 + g),
                                                  cfg.mtbs_s, cfg.duration_s))
            for g in chosen}


def link_schedule(cfg: LinkDegradationConfig, seed: int) -> LinkSchedule | None:
    """The degraded-link episodes of ``cluster.link_degradation`` (None when off)."""
    if cfg.mtbd_s is None:
        return None
    return LinkSchedule(cfg.bandwidth_factor, cfg.added_latency_us * 1e-6,
                        Episodes(_stream(seed, LINK_STREAM), cfg.mtbd_s, cfg.duration_s))


def fault_meta(cluster_cfg: ClusterConfig, speeds: dict[int, SpeedSchedule],
               link: LinkSchedule | None, sim_time_s: float) -> dict:
    """The fault settings of a run and its straggler and link episodes up to its end."""
    c = cluster_cfg
    slow = [{"replica": g, "start_s": a, "end_s": None if math.isinf(b) else b}
            for g, s in speeds.items() for a, b in s.episodes.started(sim_time_s)]
    degraded = [{"start_s": a, "end_s": b}
                for a, b in (link.episodes.started(sim_time_s) if link else [])]
    f, s, d = c.failure, c.straggler, c.link_degradation
    return {
        "faults": {
            "failure": {"mtbf_s": f.mtbf_s, "mttr_s": f.mttr_s, "max_retries": f.max_retries},
            "straggler": {"factor": s.factor, "fraction": s.fraction,
                          "replicas": sorted(speeds), "mtbs_s": s.mtbs_s,
                          "duration_s": s.duration_s},
            "link_degradation": {"mtbd_s": d.mtbd_s, "duration_s": d.duration_s,
                                 "bandwidth_factor": d.bandwidth_factor,
                                 "added_latency_us": d.added_latency_us},
        },
        "num_straggler_episodes": len(slow),
        "straggler_episodes": slow,
        "num_link_degradation_episodes": len(degraded),
        "link_degradation_episodes": degraded,
    }
