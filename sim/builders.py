"""Turn the composed config into a replica's parts: cost model, KV cache, scheduler."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import SimpleNamespace

from omegaconf import DictConfig, OmegaConf

from sim.config import (
    KVCacheConfig,
    check_backend,
    check_cluster,
    check_cost_model,
    check_hardware,
    check_kv_cache,
    check_model,
    check_parallelism,
    check_scheduler,
)
from sim.config.backend import frontend_discipline, overlaps
from sim.cost import ConstantCostModel, CostModel, RooflineCostModel
from sim.cost.calibration_file import shared_calibration
from sim.cost.compute_speed import compute_scale, scaled_compute
from sim.cost.cuda_graphs import capture_sizes
from sim.cost.eager import eager_launch_s
from sim.cost.host import KEYS as HOST_KEYS
from sim.cost.host import HostCosts
from sim.engine.frontend import FRONTEND_KEYS, FrontendCosts
from sim.errors import ConfigError
from sim.kv.budget import GIB, MemoryBudget, kv_dtype_bytes, memory_budget
from sim.kv.build import build_kv_cache
from sim.kv.manager import PagedKVCache
from sim.model.weights import active_parameter_count, parameter_count
from sim.records import LogHistogram
from sim.schedulers import SCHEDULERS, TokenBudgetScheduler
from sim.state import RequestTable


@dataclass
class ReplicaParts:
    """Everything a replica is made of, plus the derived numbers worth reporting."""

    cost_model: CostModel
    kv: PagedKVCache
    scheduler: TokenBudgetScheduler
    max_model_len: int
    meta: dict = field(default_factory=dict)


def check_config(cfg) -> None:
    """Every range and cross-field check of the simulator's config groups."""
    check_model(cfg.model)
    check_hardware(cfg.hardware, cfg.model)
    check_scheduler(cfg.scheduler, cfg.model, SCHEDULERS)
    check_kv_cache(cfg.kv_cache)
    check_parallelism(cfg.cluster, cfg.model, cfg.hardware)
    check_cluster(cfg.cluster)
    check_backend(cfg.backend)
    check_cost_model(cfg.cost_model)


def calibration_of(cfg) -> tuple:
    """The calibrated efficiencies and document of ``cfg``'s hardware and backend
    (``cost_model.calibration``, or ``hardware.calibration`` when that is ``auto``)."""
    c = cfg.cost_model
    if c.calibration == "auto":  # shared, read only (every replica's build reads it)
        return shared_calibration(cfg.hardware.calibration, cfg.backend.name)
    return shared_calibration(c.calibration, cfg.backend.name, "cost_model.calibration")


def build_frontend_costs(cfg) -> FrontendCosts:
    """The API server's costs (``sim.engine.frontend``): each ``backend.frontend`` key, or
    where it is null the calibrated file's ``frontend:`` block (none under
    ``cost_model=constant``, whose runs check queueing theory: a frontend there is only what
    the config sets)."""
    given = getattr(cfg.backend, "frontend", None)
    calibrated = {}
    if cfg.cost_model.name == "roofline":
        calibrated = calibration_of(cfg)[1].get("frontend") or {}
    values = {}
    for key in FRONTEND_KEYS:
        value = getattr(given, key, None)
        values[key] = float(calibrated.get(key, 0.0) if value is None else value)
    engine = cfg.backend.name if cfg.cost_model.name == "roofline" else None
    return FrontendCosts.from_units(**values, **frontend_discipline(engine, calibrated, given))


def host_costs(c, calibrated: dict) -> HostCosts:
    """The engine's per-step host costs: each ``cost_model.host_overhead*`` override, else the
    calibrated ``host:`` block's value (0 where the block has no such key)."""
    given = dict(zip(HOST_KEYS, (c.host_overhead_ms, c.host_overhead_per_seq_us,
                                 c.host_overhead_per_new_request_us,
                                 c.host_overhead_per_token_us), strict=True))
    return HostCosts.from_units(**{k: float(calibrated.get(k, 0.0) if v is None else v)
                                   for k, v in given.items()})


def build_cost_model(cfg) -> CostModel:
    """The configured cost model for one replica of ``cfg.model`` on ``cfg.hardware``."""
    c = cfg.cost_model
    if c.name == "constant":
        return ConstantCostModel(c.step_time_ms * 1e-3)
    eff, doc = calibration_of(cfg)
    cl = cfg.cluster
    b, sched = cfg.backend, cfg.scheduler
    eager = bool(getattr(b, "enforce_eager", False))
    graphs = capture_sizes(b.name, sched.max_num_seqs, sched.max_num_batched_tokens,
                           cl.tensor_parallel_size, eager, getattr(b, "cuda_graph_max_bs", None),
                           getattr(b, "cuda_graph_batch_sizes", None))
    # warn of an uncalibrated launch time only where the user asked for eager steps
    warning = ("backend.enforce_eager steps pay no kernel-launch time (backend.eager_launch_us "
               "sets it)") if eager else None
    launch_s = eager_launch_s(cfg.hardware.calibration, getattr(b, "eager_launch_us", None),
                              warning) if graphs.eager else 0.0
    hw = scaled_compute(cfg.hardware, compute_scale(c, doc))
    return RooflineCostModel(cfg.model, hw, cl.tensor_parallel_size,
                             kv_dtype_bytes(cfg.model, cfg.kv_cache), eff,
                             host_costs(c, doc["host"]), pp=cl.pipeline_parallel_size,
                             ep=cl.expert_parallel_size, graphs=graphs,
                             overlap=overlaps(b, cl.pipeline_parallel_size),
                             eager_launch_s=launch_s)


def plain(cfg) -> SimpleNamespace:
    """The config groups the simulator reads, as plain dataclasses (fast attribute access)."""
    groups = ("model", "hardware", "backend", "scheduler", "kv_cache", "cluster", "cost_model")
    return SimpleNamespace(**{
        g: OmegaConf.to_object(getattr(cfg, g)) if isinstance(getattr(cfg, g), DictConfig)
        else getattr(cfg, g) for g in groups})


def replica_memory_budget(cfg) -> MemoryBudget:
    """The memory plan of one replica of ``cfg`` (its ``tp × pp`` layout and expert
    parallelism): the one the replica's KV cache is sized by, and the one ``python -m sim``
    logs."""
    c = cfg.cluster
    return memory_budget(cfg.model, cfg.hardware, cfg.scheduler, cfg.kv_cache,
                         c.tensor_parallel_size, ep=c.expert_parallel_size,
                         pp=c.pipeline_parallel_size, rule=cfg.backend.name)


def pool_configs(cfg) -> dict[str, SimpleNamespace]:
    """The plain config of a replica of each pool: ``mixed``, or ``prefill`` and ``decode`` in
    a disaggregated cluster, each with its own tensor-parallel size (as
    ``sim.engine.cluster`` builds them)."""
    cfg = plain(cfg)
    c = cfg.cluster
    if not c.disaggregated:
        return {"mixed": cfg}
    out = {}
    for pool, tp in (("prefill", c.prefill_tensor_parallel_size),
                     ("decode", c.decode_tensor_parallel_size)):
        pool_cfg = SimpleNamespace(**vars(cfg))
        pool_cfg.cluster = dataclasses.replace(
            c, tensor_parallel_size=c.tensor_parallel_size if tp is None else tp)
        out[pool] = pool_cfg
    return out


def pool_tp_field(cfg, pool: str) -> str:
    """The config field that sets the tensor-parallel size of ``pool``'s replicas (errors
    about that size name it, not the field its value may have been copied from)."""
    c = cfg.cluster
    if pool in ("prefill", "decode") and getattr(c, f"{pool}_tensor_parallel_size") is not None:
        return f"cluster.{pool}_tensor_parallel_size"
    return "cluster.tensor_parallel_size"


def naming_pool_field(e: ConfigError, tp_field: str) -> ConfigError:
    """``e`` naming the pool's own tensor-parallel field (``pool_tp_field``) when it names the
    shared one the pool's value was copied to."""
    if e.field == "cluster.tensor_parallel_size" and tp_field != e.field:
        return ConfigError(tp_field, e.value, e.expected)
    return e


def pool_memory_budgets(cfg) -> dict[str, MemoryBudget]:
    """The memory plan of a replica of each pool (``pool_configs``)."""
    return {pool: replica_memory_budget(c) for pool, c in pool_configs(cfg).items()}


def effective_kv_config(kv_cfg: KVCacheConfig, scheduler_name: str) -> KVCacheConfig:
    """``kv_cfg`` without the settings scheduler ``scheduler_name`` ignores
    (``ignored_settings``): swap becomes recompute, prefix caching goes off."""
    cls = SCHEDULERS[scheduler_name]
    if kv_cfg.preemption == "swap" and not cls.swaps:
        kv_cfg = dataclasses.replace(kv_cfg, preemption="recompute")
    if kv_cfg.prefix_caching and not cls.uses_prefix_cache:
        kv_cfg = dataclasses.replace(kv_cfg, prefix_caching=False)
    return kv_cfg


def ignored_settings(cfg) -> list[str]:
    """One line per ``kv_cache`` setting that ``cfg``'s scheduler does not use (logged as a
    warning at the start of a run): prefix caching under a policy without a prefix cache,
    preemption by swap under one that preempts by recompute only (sglang's retraction)."""
    name, kv = cfg.scheduler.name, cfg.kv_cache
    cls = SCHEDULERS[name]
    out = []
    if kv.prefix_caching and not cls.uses_prefix_cache:
        out.append(f"kv_cache.prefix_caching=true is ignored: scheduler={name} does not use "
                   "a prefix cache (every prompt is computed in full)")
    if kv.preemption == "swap" and not cls.swaps:
        out.append(f"kv_cache.preemption=swap is ignored: scheduler={name} preempts by "
                   "recompute only")
    return out


def build_replica_parts(cfg, table: RequestTable, itl: LogHistogram) -> ReplicaParts:
    """Validate the config, size the KV cache from memory, and wire scheduler and cost model."""
    cfg = plain(cfg)
    check_config(cfg)
    tp = cfg.cluster.tensor_parallel_size
    ep = cfg.cluster.expert_parallel_size
    budget = replica_memory_budget(cfg)
    largest = int((table.prompt + table.max_output).max()) if table.size else 0
    cls = SCHEDULERS[cfg.scheduler.name]
    kv_cfg = effective_kv_config(cfg.kv_cache, cfg.scheduler.name)
    kv = build_kv_cache(kv_cfg, cfg.hardware, budget, table.size,
                        largest_request_tokens=largest, lengths=(table.prompt, table.max_output))
    scheduler = cls(cfg.scheduler, table, kv, itl)
    max_model_len = cfg.scheduler.max_model_len or cfg.model.max_position_embeddings
    meta = {
        "parameters": parameter_count(cfg.model),
        "active_parameters": active_parameter_count(cfg.model),
        "num_gpu_blocks": kv.num_blocks + 1,  # kv_cache.num_gpu_blocks may override
        "block_size": budget.block_size,
        # of the blocks the cache has (the override, if any), as app.log_memory_budgets
        "max_concurrent_tokens": (kv.num_blocks + 1) * budget.block_size,
        # of the binding pipeline stage, whose blocks these are
        "kv_bytes_per_token": budget.block_bytes // budget.block_size,
        "state_bytes_per_request": budget.state_bytes_per_request,
        "state_blocks_per_request": budget.state_blocks_per_request,
        "weights_gib_per_gpu": round(budget.weight_bytes / GIB, 3),
        "activation_gib_per_gpu": round(budget.activation_bytes / GIB, 3),
        "kv_cache_gib_per_gpu": round(budget.kv_cache_bytes / GIB, 3),
        "max_model_len": max_model_len,
        "tensor_parallel_size": tp,
        "pipeline_parallel_size": cfg.cluster.pipeline_parallel_size,
        "expert_parallel_size": ep,
    }
    return ReplicaParts(build_cost_model(cfg), kv, scheduler, max_model_len, meta)
