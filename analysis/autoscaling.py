"""What an autoscaled run (``cluster.autoscaler``) cost and how its replicas moved: whole-run
fields of ``summary.json``, per-hour replica counts and GPU-hours, and ``replicas.parquet``
(every state change: replica, time, state)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from sim.engine.autoscaler import BILLED, READY, STATES, state_seconds, while_starting


def autoscaler_metrics(requests: pd.DataFrame, meta: dict) -> dict:
    """``summary.json`` fields of an autoscaled run (none without an autoscaler):
    ``gpu_hours`` and ``cost`` (billed from a start to the end of a drain),
    ``mean_replicas`` (billed, averaged over the run), ``peak_replicas``, ``scale_ups``,
    ``drains``, ``scale_up_delay_s`` and ``arrived_while_scaling_up`` (requests that
    arrived while some replica was starting)."""
    a = meta.get("autoscaler")
    if a is None:
        return {}
    log, end = a["log"], float(meta["sim_time_s"])
    return {"autoscaler_policy": a["policy"], "scale_up_delay_s": a["scale_up_delay_s"],
            "gpu_hours": a["gpu_hours"], "cost": a["cost"],
            "mean_replicas": state_seconds(log, BILLED, 0.0, end) / end if end > 0
            else float("nan"),
            "peak_replicas": peak_billed(log), "scale_ups": a["scale_ups"],
            "drains": a["drains"],
            "arrived_while_scaling_up": int(while_starting(
                log, requests["arrival_s"].to_numpy()).sum())}


def peak_billed(log: np.ndarray) -> int:
    """The most replicas billed at one time."""
    order = np.argsort(log[:, 0], kind="stable")  # the log's own order within an instant
    billed = np.isin(log[order, 2], BILLED)
    now: dict[int, bool] = {}
    peak = 0
    for r, b in zip(log[order, 1].astype(int), billed, strict=True):
        now[r] = bool(b)
        peak = max(peak, sum(now.values()))
    return peak


def hourly_replicas(meta: dict, requests: pd.DataFrame, hour_s: float, hours: int) -> list[dict]:
    """Per hour: ``replicas`` (billed) and ``ready_replicas``, each averaged over the hour
    (over its part before the run ended), ``gpu_hours``, ``cost`` and
    ``arrived_while_scaling_up``."""
    a = meta["autoscaler"]
    log, end = a["log"], float(meta["sim_time_s"])
    ramp = while_starting(log, requests["arrival_s"].to_numpy())
    hour = np.floor(requests["arrival_s"].to_numpy() / hour_s)
    rows = []
    for h in range(hours):
        lo, hi = h * hour_s, min((h + 1) * hour_s, end)  # the run may end inside an hour
        span = hi - lo
        billed = state_seconds(log, BILLED, lo, hi)
        gpu_hours = billed * a["gpus_per_replica"] / 3600.0
        rows.append({"replicas": billed / span if span > 0 else float("nan"),
                     "ready_replicas": state_seconds(log, (READY,), lo, hi) / span
                     if span > 0 else float("nan"),
                     "gpu_hours": gpu_hours, "cost": gpu_hours * a["gpu_hour_price"],
                     "arrived_while_scaling_up": int((ramp & (hour == h)).sum())})
    return rows


def replica_states(meta: dict) -> pd.DataFrame:
    """``replicas.parquet``: one row per state change (at 0: every replica's first state)."""
    log = meta["autoscaler"]["log"]
    return pd.DataFrame({"time_s": log[:, 0], "replica": log[:, 1].astype(np.int32),
                         "state": pd.Categorical.from_codes(log[:, 2].astype(int),
                                                            categories=list(STATES))})
