"""Settings that a run's chosen options do not read: set, but without effect.

One schema per config group carries the fields of every option (every scheduler, every arrival
process), so ``scheduler.chunk_size=512`` under ``scheduler=vllm`` or ``workload.cv=3`` with
Poisson arrivals composes fine and changes nothing. ``unused_settings(cfg)`` names each field
whose value differs from its schema default while the chosen option does not read it;
``cli.validation.validate_config`` logs them as warnings before a run starts (vLLM refuses
an unknown flag; here the field exists, so the run goes on).
"""

from __future__ import annotations

import dataclasses

from scenarios.config import LengthConfig, WorkloadConfig
from sim.config import ClusterConfig, LinkDegradationConfig, SchedulerConfig, StragglerConfig
from sim.config.autoscaler import AutoscalerConfig
from sim.config.diffusion_cluster import (
    DiffusionBatchingConfig,
    DiffusionJobCostConfig,
    DiffusionParallelConfig,
    cluster_kind,
)
from sim.cost.cuda_graphs import runs_eager_code
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
    "peak_rate": ("trace",),
    "peak_window_s": ("trace",),
}
# cluster fields read only by a disaggregated cluster, and the one it does not read
DISAGG_ONLY = ("prefill_replicas", "decode_replicas", "prefill_tensor_parallel_size",
               "decode_tensor_parallel_size", "kv_transfer_bandwidth", "kv_transfer_latency_us")
AGGREGATED_ONLY = ("replicas",)
# cluster fields only LLM replicas read (not cluster=diffusion), and only the node pool reads
LLM_ONLY = ("tensor_parallel_size", "pipeline_parallel_size", "expert_parallel_size",
            "data_parallel_size", "router", "router_load_cap", "prefix_block_tokens",
            "prefix_index_blocks", "disaggregated")
LLM_FAULTS = (("straggler", StragglerConfig), ("link_degradation", LinkDegradationConfig))
POOL_ONLY = ("nodes", "policy", "preemption", "gpus_per_job", "elastic", "elastic_efficiency",
             "checkpointing")
POOL_BLOCKS = (("parallel", DiffusionParallelConfig), ("batching", DiffusionBatchingConfig),
               ("job_cost", DiffusionJobCostConfig))
CONSTANT_JOB_COST = ("encode_ms", "step_ms", "decode_ms", "default_steps",
                     "parallel_efficiency")


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
    if getattr(w, "random", None) is not None and w.arrival != "trace":
        for length in ("input", "output"):
            for p in _block_changed(getattr(w, length), LengthConfig, f"workload.{length}"):
                out.append(f"{p} is ignored: workload.random draws the lengths (set "
                           f"workload.random.{length}_len)")
    if getattr(w, "sharegpt", None) is not None and w.arrival != "trace":
        for length in ("input", "output"):
            for p in _block_changed(getattr(w, length), LengthConfig, f"workload.{length}"):
                out.append(f"{p} is ignored: workload.sharegpt draws the lengths (set "
                           f"workload.sharegpt.{length}_mean)")
    b = cfg.backend
    if getattr(b, "eager_launch_us", None) is not None \
            and not runs_eager_code(b.name, b.enforce_eager):
        out.append(f"backend.eager_launch_us={b.eager_launch_us} is ignored: "
                   "backend.enforce_eager=false (vLLM's CUDA graphs and compiled code launch "
                   "the kernels)")
    if getattr(b, "cuda_graph_batch_sizes", None) is not None and b.enforce_eager:
        out.append(f"backend.cuda_graph_batch_sizes={list(b.cuda_graph_batch_sizes)} is "
                   "ignored: backend.enforce_eager=true captures no graphs")
    return out + _cluster_unused(cfg)


def _block_changed(group, schema, prefix: str) -> list[str]:
    """``prefix.field=value`` for each field of a nested block that is not its default."""
    return [f"{prefix}.{n}={getattr(group, n)}" for n in _changed(group, schema,
                                                                   list(_defaults(schema)))]


def _cluster_unused(cfg) -> list[str]:
    """Cluster fields that the cluster's kind (LLM replicas, diffusion nodes, both), its
    disaggregation, policy, batching or job cost model do not read."""
    out = []
    c = cfg.cluster
    kind = cluster_kind(c)
    if kind != "diffusion":
        unread = AGGREGATED_ONLY if c.disaggregated else DISAGG_ONLY
        for name in _changed(c, ClusterConfig, unread):
            mode = "disaggregated (cluster=disagg)" if c.disaggregated else "not disaggregated"
            out.append(f"cluster.{name}={getattr(c, name)} is ignored: the cluster is {mode}")
    out += _autoscaler_unused(c.autoscaler, nodes=kind == "diffusion")
    if kind == "llm":
        pool = [f"cluster.{n}={getattr(c, n)}" for n in _changed(c, ClusterConfig, POOL_ONLY)]
        for block, schema in POOL_BLOCKS:
            pool += _block_changed(getattr(c, block), schema, f"cluster.{block}")
        return out + [f"{p} is ignored: the cluster has no diffusion nodes (cluster=diffusion "
                      "or cluster=mixed reads it)" for p in pool]
    if kind == "diffusion":
        llm = [f"cluster.{n}={getattr(c, n)}" for n in
               _changed(c, ClusterConfig, [*LLM_ONLY, *DISAGG_ONLY, *AGGREGATED_ONLY])]
        for block, schema in LLM_FAULTS:
            llm += _block_changed(getattr(c, block), schema, f"cluster.{block}")
        out += [f"{p} is ignored: cluster=diffusion has no LLM replicas" for p in llm]
        if cfg.cost_model.name == "constant":
            out.append("cost_model=constant is ignored: cluster=diffusion prices jobs with "
                       "cluster.job_cost (cluster.job_cost.name=constant for fixed times)")
    if c.policy != "priority" and c.preemption is not True:
        out.append(f"cluster.preemption={c.preemption} is ignored: cluster.policy={c.policy} "
                   "never preempts (only priority does)")
    if c.batching.max_images == 1 and c.batching.max_wait_s != 0:
        out.append(f"cluster.batching.max_wait_s={c.batching.max_wait_s} is ignored: "
                   "cluster.batching.max_images=1 (no batching)")
    if c.elastic and _changed(c, ClusterConfig, ["gpus_per_job"]):
        out.append(f"cluster.gpus_per_job={c.gpus_per_job} is ignored: cluster.elastic=true "
                   "chooses each job's gang")
    if c.job_cost.name != "constant":
        for p in _block_changed(c.job_cost, DiffusionJobCostConfig, "cluster.job_cost"):
            if p.split("=")[0].rsplit(".", 1)[1] in CONSTANT_JOB_COST:
                out.append(f"{p} is ignored: cluster.job_cost.name={c.job_cost.name} (only "
                           "the constant job cost reads it)")
    return out


def _autoscaler_unused(a, nodes: bool = False) -> list[str]:
    """``cluster.autoscaler`` fields its policy does not read (all of them with none;
    ``nodes``: diffusion nodes, whose jobs have no TTFT or TPOT)."""
    if a.policy == "none":
        unread = [n for n in _defaults(AutoscalerConfig) if n != "policy"]
    elif a.policy == "slo":
        unread = ["target", "tolerance", "rate_window_s"]
    else:
        unread = [n for n in _defaults(AutoscalerConfig) if n.startswith("slo_")
                  or n == "scale_down_below" or (n == "rate_window_s" and a.policy != "rate")]
    out = [f"cluster.autoscaler.{n}={getattr(a, n)} is ignored: cluster.autoscaler.policy="
           f"{a.policy} does not read it" for n in _changed(a, AutoscalerConfig, unread)]
    if nodes and a.policy == "slo":
        out += [f"cluster.autoscaler.{n}={getattr(a, n)} is ignored: diffusion jobs have no "
                "tokens (cluster.autoscaler.slo_latency_ms bounds their latency)"
                for n in _changed(a, AutoscalerConfig, ["slo_ttft_ms", "slo_tpot_ms"])]
    return out
