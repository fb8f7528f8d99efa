"""A forecast month's whole day on an autoscaled cluster (``capacity.day``): the peak-hour
plan sizes for the busiest hour, while a real fleet follows the daily curve with an
autoscaler whose new replicas take minutes; this simulates that day and reports what it
costs and in which hours the plan's SLO is missed."""

from __future__ import annotations

import copy

import numpy as np
from omegaconf import open_dict

from analysis.autoscaling import autoscaler_metrics, hourly_replicas
from analysis.capacity_search import judge
from analysis.forecast import hourly_rates
from analysis.steady import steady_metrics
from scenarios import requests_for_seed
from sim import simulate
from sim.errors import ConfigError

HOURS = 24


def check_day(cfg) -> None:
    """A day needs an autoscaler to resize the cluster through it."""
    if cfg.capacity.day.enabled and cfg.cluster.autoscaler.policy == "none":
        raise ConfigError("capacity.day.enabled", True, "false without an autoscaler: set "
                          "cluster.autoscaler.policy (e.g. cluster=autoscaled)")


def simulate_day(cfg, peak: float, first_hour_replicas: int, peak_replicas: int,
                 slo: dict, min_throughput_ratio: float) -> dict:
    """The day of a month whose busiest hour runs at ``peak`` req/s: ``forecast.diurnal``
    as the rate profile, ``first_hour_replicas`` ready at midnight, at most the larger of
    ``cluster.autoscaler.max_replicas`` and the verified ``peak_replicas``. Per hour (by
    arrival) the plan's SLO bounds are judged on that hour's requests; GPU-hours and cost
    are of a real day (a compressed one's scaled by 3600 / ``hour_s``)."""
    d, f = cfg.capacity.day, cfg.capacity.forecast
    day = copy.deepcopy(cfg)
    with open_dict(day):
        day.workload.rate = float(peak)
        day.workload.rate_profile.hourly = hourly_rates(1.0, f.diurnal).tolist()
        day.workload.rate_profile.hour_s = float(d.hour_s)
        day.workload.rate_profile.points = []
        a = day.cluster.autoscaler
        a.max_replicas = max(int(a.max_replicas), int(peak_replicas))
        day.cluster.replicas = min(max(int(first_hour_replicas), int(a.min_replicas)),
                                   int(a.max_replicas))
        day.timeline = False
        day.seed = int(d.seed)
    rec = simulate(day, requests_for_seed(day.workload, int(d.seed)))
    req, meta = rec.requests, rec.meta
    hour = np.floor(req["arrival_s"].to_numpy() / d.hour_s)
    missed = {}
    for h in range(HOURS):
        mine = req[hour == h]
        if not len(mine):
            continue
        m = steady_metrics(mine, h * d.hour_s, day.slo)
        m["throughput_ratio"] = float((mine["status"] == "completed").mean())
        ok, why, _ = judge(m, slo, min_throughput_ratio)
        if not ok:
            missed[h] = why
    scale = 3600.0 / float(d.hour_s)
    a = autoscaler_metrics(req, meta)
    by_hour = hourly_replicas(meta, req, float(d.hour_s), HOURS)
    return {"hour_s": float(d.hour_s), "requests": len(req),
            "gpu_hours": a["gpu_hours"] * scale, "cost": a["cost"] * scale,
            "mean_replicas": a["mean_replicas"], "peak_replicas": a["peak_replicas"],
            "scale_ups": a["scale_ups"], "scale_up_delay_s": a["scale_up_delay_s"],
            "hours_missing_slo": sorted(missed), "missed": {str(h): v for h, v in missed.items()},
            "replicas_by_hour": [round(r["replicas"], 3) for r in by_hour]}
