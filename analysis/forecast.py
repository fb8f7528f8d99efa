"""Traffic forecast arithmetic of the capacity plan: each month's busiest-hour rate, the
hourly rates of its day, and what a deployment costs per hour and per million tokens."""

from __future__ import annotations

import math

import numpy as np


def peak_rates(peak_rate: float, growth_per_month: float, horizon_months: int,
               growth: str = "compound") -> np.ndarray:
    """Busiest-hour rate (req/s) of each month ``0 .. horizon_months − 1``: compound
    ``peak · (1 + g)^m`` or linear ``peak · (1 + g·m)``."""
    m = np.arange(horizon_months, dtype=float)
    factor = (1 + growth_per_month) ** m if growth == "compound" else 1 + growth_per_month * m
    return peak_rate * factor


def hourly_rates(peak: float, diurnal) -> np.ndarray:
    """The 24 hourly rates of a day whose busiest hour runs at ``peak``."""
    d = np.asarray(diurnal, float)
    return peak * d / d.max()


def autoscaled_replicas(peak: float, diurnal, rate_per_replica: float,
                        peak_replicas: int) -> np.ndarray:
    """Replicas each hour if the deployment followed the day's traffic: the verified peak
    count scaled by the hour's share of the peak rate (rounded up, at least one), an estimate
    from the per-replica rate that the peak verification confirmed."""
    per = peak / peak_replicas if peak_replicas else rate_per_replica
    return np.maximum(1, np.ceil(hourly_rates(peak, diurnal) / per - 1e-9)).astype(int)


def costs(peak: float, diurnal, replicas: int, gpus_per_replica: int, price: float,
          tokens_per_request: float, output_tokens_per_request: float,
          hourly_replicas: np.ndarray) -> dict:
    """Cost of a month's deployment: provisioned for the peak all day (``cost_per_hour``,
    and per million tokens served over the day's average traffic), and autoscaled hour by
    hour."""
    gpus = replicas * gpus_per_replica
    per_hour = gpus * price
    mean_rate = float(hourly_rates(peak, diurnal).mean())
    tokens_per_hour = mean_rate * 3600 * tokens_per_request
    out_per_hour = mean_rate * 3600 * output_tokens_per_request
    auto_gpu_hours = float(hourly_replicas.sum() * gpus_per_replica)
    auto_tokens = tokens_per_hour * 24
    return {
        "gpus": gpus,
        "cost_per_hour": per_hour,
        "cost_per_million_tokens": per_hour / tokens_per_hour * 1e6 if tokens_per_hour
        else math.nan,
        "cost_per_million_output_tokens": per_hour / out_per_hour * 1e6 if out_per_hour
        else math.nan,
        "mean_rate": mean_rate,
        "autoscaled_gpu_hours_per_day": auto_gpu_hours,
        "autoscaled_cost_per_day": auto_gpu_hours * price,
        "autoscaled_cost_per_million_tokens": auto_gpu_hours * price / auto_tokens * 1e6
        if auto_tokens else math.nan,
    }
