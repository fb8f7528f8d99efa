"""Summary metrics of a diffusion node pool's records (definitions in docs/metrics.md,
section "Diffusion")."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from analysis.autoscaling import autoscaler_metrics
from analysis.metrics import value_stats
from sim.diffusion.records import DiffusionRecords
from sim.engine.autoscaler import BILLED, state_seconds

NOT_ENDED = ("pending", "queued", "running")


def per_job_times(jobs: pd.DataFrame) -> pd.DataFrame:
    """Completed jobs with ``job_latency_s`` (completion − arrival), ``job_queue_s`` (first
    start − arrival), ``job_service_s`` (time holding GPUs, every run counted) and
    ``steps_per_s`` (denoising steps per second of its last plan: 1 / step time)."""
    done = jobs[jobs["status"] == "completed"]
    return pd.DataFrame({
        "job_id": done["job_id"],
        "job_latency_s": done["completion_s"] - done["arrival_s"],
        "job_queue_s": done["start_s"] - done["arrival_s"],
        "job_service_s": done["service_s"],
        "steps_per_s": 1.0 / done["step_s"],
    })


def busy_gpu_seconds(nodes: pd.DataFrame, start: float, end: float) -> float:
    """GPU-seconds in use between ``start`` and ``end``: each node's busy GPUs held from one
    occupancy row to its next (the last row to ``end``)."""
    total = 0.0
    for _, rows in nodes.groupby("node", sort=False):
        t = np.clip(rows["time_s"].to_numpy(), start, end)
        busy = rows["busy_gpus"].to_numpy(float)
        total += float(np.dot(busy, np.diff(np.append(t, end))))
    return total


def _reasons(jobs: pd.DataFrame, status: str, column: str) -> dict:
    return jobs.loc[jobs["status"] == status, column].value_counts().to_dict()


def summarize_jobs(records: DiffusionRecords,
                   percentiles: Sequence[float] | None = None) -> dict:
    """Every diffusion metric of one run, flat and JSON-ready (``jobs_*`` counts, job latency,
    queue and service statistics, throughputs, GPU utilization, preemptions, restarts); the
    time statistics have the percentiles of ``analysis.metrics.stat_labels(percentiles)``."""
    jobs, meta = records.jobs, records.meta
    times = per_job_times(jobs)
    completed = len(times)
    ended = jobs[~jobs["status"].isin(NOT_ENDED)]
    start = float(jobs["arrival_s"].min()) if len(jobs) else 0.0
    end = float(ended["completion_s"].max()) if len(ended) else start
    duration = end - start
    hours = duration / 3600.0
    per_h = (lambda x: x / hours) if hours > 0 else (lambda x: 0.0 if x == 0 else float("nan"))
    done = jobs[jobs["status"] == "completed"]
    video = done["frames"] > 1
    s = {
        "jobs_completed": completed,
        "jobs_rejected": int((jobs["status"] == "rejected").sum()),
        "jobs_rejected_reasons": _reasons(jobs, "rejected", "reject_reason"),
        "jobs_failed": int((jobs["status"] == "failed").sum()),
        "jobs_failed_reasons": _reasons(jobs, "failed", "fail_reason"),
        "jobs_unfinished": int(jobs["status"].isin(NOT_ENDED).sum()),
        "jobs_duration_s": duration,
        "jobs_per_hour": per_h(completed),
        "images_per_hour": per_h(int(done.loc[~video, "images"].sum())),
        "videos_per_hour": per_h(int(video.sum())),
    }
    for name in ("job_latency_s", "job_queue_s", "job_service_s"):
        s.update(value_stats(name, times[name].to_numpy(float), percentiles))
    sps = times["steps_per_s"].to_numpy(float)
    s["mean_steps_per_s"] = float(sps.mean()) if completed else float("nan")
    s["median_steps_per_s"] = float(np.median(sps)) if completed else float("nan")
    n, g = int(meta.get("num_nodes", 0)), int(meta.get("gpus_per_node", 0))
    capacity = n * g * duration
    if "autoscaler" in meta:  # of the GPUs billed, not of every node the pool could start
        capacity = state_seconds(meta["autoscaler"]["log"], BILLED, start, end) * g
    s["gpu_utilization"] = (busy_gpu_seconds(records.nodes, start, end) / capacity
                            if capacity > 0 else float("nan"))
    s.update({
        "num_job_preemptions": int(jobs["num_preemptions"].sum()),
        "num_job_restarts": int(jobs["num_restarts"].sum()),
        "batched_jobs": int((jobs["batch_size"] > 1).sum()),
        "num_nodes": n, "gpus_per_node": g, "policy": meta.get("policy"),
        "num_node_failures": int(meta.get("num_node_failures", 0)),
    })
    span = meta.get("sim_time_s", 0.0)
    s["node_availability"] = (1.0 - meta.get("node_downtime_s", 0.0) / (n * span)
                              if span and n else float("nan"))
    if "pool_invariant_checks" in meta:
        s["pool_invariant_checks"] = int(meta["pool_invariant_checks"])
    s.update(autoscaler_metrics(jobs, meta))  # its nodes: mean_replicas etc. count nodes
    return s
