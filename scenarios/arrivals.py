"""Arrival processes: when requests arrive (open loop) or which client sends them (closed loop).

Every function takes its own ``numpy.random.Generator`` (the run's arrivals stream) and draws
nothing else, so a sweep can change the arrival process while holding lengths fixed.
"""

from __future__ import annotations

import numpy as np


def poisson_arrivals(rate: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """Arrival times (s) of a Poisson process of ``rate`` req/s: cumulative exponential gaps.

    The first arrival is at the first gap, not at 0. ``rate`` inf: all ``n`` at 0, as
    ``vllm bench serve`` sends every request at once by default.
    """
    if np.isinf(rate):
        return np.zeros(n)
    return np.cumsum(rng.exponential(1.0 / rate, size=n))


def gamma_arrivals(rate: float, cv: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """Arrival times (s) of a renewal process with Gamma gaps: mean ``1/rate``, CV ``cv``.

    Shape ``k = 1/cv**2`` and scale ``1/(rate*k)``; ``cv > 1`` is burstier than Poisson,
    ``cv < 1`` more regular, ``cv == 1`` is Poisson. The first arrival is at the first gap;
    ``rate`` inf: all at 0. ``vllm bench serve --burstiness b`` is ``cv = 1/sqrt(b)``.
    """
    if np.isinf(rate):
        return np.zeros(n)
    shape = 1.0 / cv**2
    return np.cumsum(rng.gamma(shape, 1.0 / (rate * shape), size=n))


def think_times(mean_s: float, dist: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` think times (s) of closed-loop clients: ``fixed`` at ``mean_s`` or ``exponential``."""
    if dist == "fixed":
        return np.full(n, float(mean_s))
    if dist == "exponential":
        return rng.exponential(mean_s, size=n) if mean_s > 0 else np.zeros(n)
    raise ValueError(f"unknown think-time distribution {dist!r}")


def closed_loop(
    n: int, concurrency: int, mean_think_s: float, think_dist: str, rng: np.random.Generator,
    ramp_up_s: float = 0.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Schedule ``n`` requests over ``concurrency`` clients sending one request at a time.

    Row ``i`` belongs to client ``i % concurrency``. Returns ``(arrival_time_s, client,
    think_time_s)``: client ``c``'s first row arrives at ``c · ramp_up_s / concurrency`` (all at
    0.0 without a ramp) with think time 0; every later row has arrival NaN, to be set by the
    simulator to the completion of the client's previous request plus that row's think time.
    """
    client = np.arange(n, dtype=np.int64) % concurrency
    first = np.arange(n) < concurrency
    arrival = np.where(first, client * (ramp_up_s / concurrency), np.nan)
    think = think_times(mean_think_s, think_dist, n, rng)
    think[first] = 0.0
    return arrival, client, think
