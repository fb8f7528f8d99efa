"""Settings that a run's chosen options do not read: set, but without effect.

One schema per config group carries the fields of every option (every scheduler, every arrival
process), so ``scheduler.chunk_size=512`` under ``scheduler=vllm`` or ``workload.cv=3`` with
Poisson arrivals composes fine and changes nothing. ``unused_settings(cfg)`` names each field
whose value differs from its schema default while the chosen option does not read it;
``sim.validation.validate_config`` logs them as warnings before a run starts (vLLM refuses
an unknown flag; here the field exists, so the run goes on).
"""

from __future__ import annotations

import dataclasses

from scenarios.config import WorkloadConfig
from sim.config import ClusterConfig, SchedulerConfig
from sim.schedulers import SCHEDULERS

# workload fields read only under some arrival processes
WORKLOAD_ARRIVALS = {
    "rate": ("poisson", "gamma"),
    "cv": ("gamma",),
    "num_requests": ("poisson", "gamma", "closed_loop"),
    "concurrency": ("closed_loop",),
    "think_time_s": ("closed_loop",),
    "think_time_dist": ("closed_loop",),
    "ramp_up_s": ("closed_loop",),
    "trace_path": ("trace",),
    "time_scale": ("trace",),
    "window_start_s": ("trace",),
    "window_end_s": ("trace",),
    "max_requests": ("trace",),
}
# cluster fields read only by a disaggregated cluster, and the one it does not read
DISAGG_ONLY = ("prefill_replicas", "decode_replicas", "prefill_tensor_parallel_size",
               "decode_tensor_parallel_size", "kv_transfer_bandwidth", "kv_transfer_latency_us")
AGGREGATED_ONLY = ("replicas",)


def _defaults(schema) -> dict:
    return {f.name: f.default for f in dataclasses.fields(schema)
            if f.default is not dataclasses.MISSING}


def _changed(group, schema, names) -> list[str]:
    """Those of ``names`` whose value in ``group`` is not the schema's default."""
    default = _defaults(schema)
    return [n for n in names if n in default and getattr(group, n, default[n]) != default[n]]


def unused_settings(cfg) -> list[str]:
    """One line per set field that the run's scheduler, arrival process or cluster mode
    does not read."""
    out = []
    s = cfg.scheduler
    reads = SCHEDULERS[s.name].settings
    for name in _changed(s, SchedulerConfig, [f for f in _defaults(SchedulerConfig)
                                             if f not in reads]):
        out.append(f"scheduler.{name}={getattr(s, name)} is ignored: scheduler={s.name} does "
                   f"not read it (it reads {', '.join(sorted(reads - {'name'}))})")
    w = cfg.workload
    for name, arrivals in WORKLOAD_ARRIVALS.items():
        if w.arrival not in arrivals and _changed(w, WorkloadConfig, [name]):
            out.append(f"workload.{name}={getattr(w, name)} is ignored: "
                       f"workload.arrival={w.arrival} does not read it (only "
                       f"{', '.join(arrivals)} arrivals do)")
    c = cfg.cluster
    unread = AGGREGATED_ONLY if c.disaggregated else DISAGG_ONLY
    for name in _changed(c, ClusterConfig, unread):
        mode = "disaggregated (cluster=disagg)" if c.disaggregated else "not disaggregated"
        out.append(f"cluster.{name}={getattr(c, name)} is ignored: the cluster is {mode}")
    return out
