"""One validation layer: every check of a composed config, in order, before anything runs.

``validate_config(cfg)`` is the one place that calls every check of a simulation's input;
an entry point calls it right after composing (``python -m sim`` first thing in ``run``), so
bad input fails before a request is drawn or a file written.
Most check bodies live next to the schema they guard (``sim.config.*.check_*``,
``scenarios.config.check_workload``, ``analysis.config.check_slo``); the checks that span
groups and have no better home live here. In order:

1. every number of the simulator's groups is finite (no NaN or infinity reaches a formula);
2. the run's own fields (``seed``, ``progress``);
3. the diffusion node pool's fields (``cluster.nodes``, policy, gang size, plan, batching,
   job cost), then that the workload's kind is the cluster's and the model's kind fits
   (``check_kinds``); a ``cluster=diffusion`` run checks the model (``check_model``: a
   pipeline's fields) and the cluster, and skips the LLM replica checks below;
4. each config group's ranges and choices (``sim.builders.check_config``), and the scale of
   the cluster (replica counts, times);
5. cross-field checks: the KV block size the backend's engine takes (``check_block_size``),
   each pool's parallel layout, that the model fits the GPUs at that parallelism with room
   for at least one KV block, the KV capacity override, the calibration files and dtypes the
   cost model needs, the prefix hash granularity;
6. the workload's ranges, then the files it names (trace, empirical lengths); for diffusion
   jobs, every shape the workload can draw against its pipeline, whatever the job cost
   (``sim.diffusion.shapes.check_workload_shapes``: the pipeline exists, sizes, frames, the
   fixed plan), with a warning for a video pipeline asked for one frame;
7. the SLO's bounds, then the latency percentiles to report (``metrics.percentiles``);
8. not a check but a warning: fields set that the chosen options do not read
   (``cli.unused_settings``).

Once a diffusion job table is built, ``check_job_models`` checks the pipelines it names and
the node pool checks each job shape against its job cost (and the fixed plan) before the run.

The first failure raises ``ConfigError`` (or ``WorkloadError``) naming the field, the value
and what would be valid; ``docs/validation.md`` lists every check. A model ``config.json``
(``model=<path>``) is read, and refused, before composition (``cli.preflight``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterator
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from analysis.config import check_slo
from analysis.metrics import check_metrics
from cli.unused_settings import unused_settings
from scenarios import check_workload
from scenarios.diffusion import check_job_files
from scenarios.traces import MAX_TIME_S
from scenarios.workload import check_workload_files
from sim.builders import (
    build_cost_model,
    check_config,
    effective_kv_config,
    naming_pool_field,
    pool_configs,
    pool_tp_field,
    replica_memory_budget,
)
from sim.compiled.core import ENGINES
from sim.config import check_cluster, check_hardware, check_parallelism
from sim.config.diffusion_cluster import (
    check_diffusion_cluster,
    cluster_kind,
    fixed_plan,
    plan_degrees,
)
from sim.config.kv_cache import check_block_size
from sim.config.model import check_model
from sim.errors import ConfigError
from sim.kv.build import build_kv_cache

# the config groups the simulator and the workload read: every number in them must be finite
log = logging.getLogger("sim")
NUMERIC_GROUPS = ("model", "hardware", "backend", "scheduler", "kv_cache", "cluster",
                  "cost_model", "workload", "slo")
MAX_REPLICAS = 10_000
PROGRESS_VALUES = ("auto", "true", "false", "1", "0", "yes", "no", "on", "off")


def validate_config(cfg: Any) -> None:
    """Run every check of a composed simulation config (the module doc lists them, in order);
    raise the first failure as one ``ConfigError``/``WorkloadError``."""
    check_finite(cfg)
    check_run_fields(cfg)
    kind = cluster_kind(cfg.cluster)
    if kind != "llm":
        check_hardware(cfg.hardware, cfg.model)  # gpus_per_node sizes the nodes
    check_diffusion_cluster(cfg.cluster, cfg.hardware.gpus_per_node)
    check_kinds(cfg)
    if kind == "diffusion":  # no LLM replica: the pipeline and the node pool only
        check_model(_plain_model(cfg.model))
        check_cluster(cfg.cluster)
        check_cluster_scale(cfg)
    else:
        check_config(cfg)
        check_block_size(cfg.kv_cache, cfg.backend.name)
        check_cluster_scale(cfg)
        check_pools(cfg)
        check_prefix_hashes(cfg)
    check_workload(cfg.workload)
    if kind != "diffusion":
        check_workload_files(cfg.workload)
    if kind != "llm":
        check_job_files(cfg.workload)
        check_job_shapes(cfg)
    check_slo(cfg.slo)
    metrics = getattr(cfg, "metrics", None)  # None: a config built without the run schema
    if metrics is not None:
        check_metrics(metrics)
    for line in unused_settings(cfg):  # valid, but set without effect: say so
        log.warning(line)


CLUSTER_FOR = {"llm": "cluster=single or cluster=disagg", "diffusion": "cluster=diffusion",
               "mixed": "cluster=mixed"}


def check_kinds(cfg: Any) -> None:
    """The workload's kind is the cluster's (LLM requests on replicas, diffusion jobs on
    nodes, both on ``cluster=mixed``); the model serving LLM requests is an LLM, and the
    pipeline of diffusion jobs that name none (``workload.model: ''``) is ``model=``, so a
    diffusion model there."""
    ck = cluster_kind(cfg.cluster)
    wk = getattr(cfg.workload, "kind", "llm")
    if wk != ck and wk in CLUSTER_FOR:
        raise ConfigError("workload.kind", wk, f"the cluster's kind: cluster={cfg.cluster.name}"
                          f" serves {ck} work; use {CLUSTER_FOR[wk]} for a {wk} workload")
    mk = getattr(cfg.model, "kind", "llm")
    if ck != "diffusion" and mk != "llm":
        raise ConfigError("model", cfg.model.name, f"an LLM (kind: llm) to serve the LLM "
                          f"requests of cluster={cfg.cluster.name} (diffusion pipelines run on "
                          "cluster=diffusion, or as workload.model under cluster=mixed)")
    named = bool(getattr(cfg.workload, "model", "")) or (
        len(getattr(cfg.workload, "mix", [])) > 0 and all(e.model for e in cfg.workload.mix))
    if ck == "diffusion" and mk != "diffusion" and not named:
        raise ConfigError("model", cfg.model.name, "a diffusion pipeline (kind: diffusion) for "
                          "the jobs of cluster=diffusion, e.g. model=flux1_dev (or name one in "
                          "workload.model)")


def _plain_model(m: Any) -> Any:
    """The model group as its dataclass (the pipeline checks iterate dataclass fields)."""
    return OmegaConf.to_object(m) if isinstance(m, DictConfig) else m


def check_job_shapes(cfg: Any) -> None:
    """Every job shape the workload can draw (its flat shape, or each ``mix`` entry) names a
    diffusion pipeline that can make it, on the fixed plan when ``cluster.parallel`` fixes
    one, whatever ``cluster.job_cost`` (``sim.diffusion.shapes.check_workload_shapes``)."""
    from sim.diffusion.job import ParallelPlan
    from sim.diffusion.shapes import Pipelines, check_workload_shapes

    own = cfg.model.name if getattr(cfg.model, "kind", "llm") == "diffusion" else ""
    p = cfg.cluster.parallel
    plan = ParallelPlan(**plan_degrees(p)) if fixed_plan(p) else None
    check_workload_shapes(cfg.workload, own, Pipelines.of_run(cfg), plan)


def check_job_models(jobs) -> None:
    """Every pipeline a job table names is a diffusion model of ``conf/model/`` (its fields
    checked by ``load_pipeline``)."""
    from sim.diffusion.pipeline import load_pipeline

    for name in jobs["model"].unique():
        try:
            load_pipeline(str(name))
        except ConfigError as e:
            if e.field != "model":
                raise
            raise ConfigError("workload.model", name, e.expected) from None


def _leaves(node: Any, path: str) -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _leaves(v, f"{path}[{i}]")
    else:
        yield path, node


def _container(node: Any) -> Any:
    if isinstance(node, (DictConfig, ListConfig)):
        return OmegaConf.to_container(node, resolve=True)
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        return dataclasses.asdict(node)
    return node


# fields whose +inf means something: every request at once, as vllm bench's --request-rate inf
MAY_BE_INFINITE = {"workload.rate"}


def check_finite(cfg: Any) -> None:
    """Refuse NaN or infinity anywhere in the simulator's config groups: OmegaConf accepts
    ``nan`` and ``inf`` for a float field, and a range check such as ``x <= 0`` lets NaN
    through."""
    for group in NUMERIC_GROUPS:
        for path, value in _leaves(_container(getattr(cfg, group)), group):
            if isinstance(value, float) and not math.isfinite(value) and not (
                    path in MAY_BE_INFINITE and value > 0):
                raise ConfigError(path, value, "a finite number")


def check_run_fields(cfg: Any) -> None:
    """The run's own fields: ``seed`` seeds a ``numpy.random.SeedSequence`` (an integer
    >= 0); ``progress`` is auto, true or false; ``engine`` is auto or python."""
    seed = cfg.seed
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError("seed", seed, "an integer >= 0")
    progress = getattr(cfg, "progress", "auto")
    if str(progress).lower() not in PROGRESS_VALUES:
        raise ConfigError("progress", progress, "one of auto, true, false")
    engine = getattr(cfg, "engine", "auto")
    if engine not in ENGINES:
        raise ConfigError("engine", engine, f"one of {list(ENGINES)}")


def check_cluster_scale(cfg: Any) -> None:
    """Replica counts a simulation can build (each replica is a process with its own KV cache
    and scheduler), and cluster times (``*_s``: failures, repairs, episodes) the float clock
    resolves."""
    c = cfg.cluster
    counts = [(f"cluster.{n}", getattr(c, n)) for n in ("replicas", "prefill_replicas",
                                                          "decode_replicas", "nodes")]
    a = c.get("autoscaler") if hasattr(c, "get") else getattr(c, "autoscaler", None)
    if a is not None:  # an autoscaler's pool is built at its max_replicas
        counts.append(("cluster.autoscaler.max_replicas", a.max_replicas))
    for name, value in counts:
        if value > MAX_REPLICAS:
            raise ConfigError(name, value, f"must be <= {MAX_REPLICAS}")
    for path, value in _leaves(_container(c), "cluster"):
        if path.endswith("_s") and isinstance(value, (int, float)) and value > MAX_TIME_S:
            raise ConfigError(path, value, f"must be at most {MAX_TIME_S:g} s")


def check_pools(cfg: Any) -> None:
    """Per pool (``mixed``, or ``prefill`` and ``decode``): its parallel layout; that the
    model fits the GPUs at that parallelism with room for the null block and one request's
    KV block; the KV capacity override and the swap/offload links
    (``sim.kv.build.build_kv_cache``); the calibration and dtypes its cost model needs."""
    for pool, pcfg in pool_configs(cfg).items():
        tp_field = pool_tp_field(cfg, pool)
        try:
            check_parallelism(pcfg.cluster, pcfg.model, pcfg.hardware)
            budget = replica_memory_budget(pcfg)
            kv_cfg = effective_kv_config(pcfg.kv_cache, pcfg.scheduler.name)
            build_kv_cache(kv_cfg, pcfg.hardware, budget, 0)
            build_cost_model(pcfg)
        except ConfigError as e:
            raise naming_pool_field(e, tp_field) from None


def check_prefix_hashes(cfg: Any) -> None:
    """Synthetic prefixes name ``workload.hash_block_tokens`` tokens per hash id and the
    simulator reads each id as ``cluster.prefix_block_tokens`` tokens: they must agree."""
    w, c = cfg.workload, cfg.cluster
    sp, mt = getattr(w, "system_prompt", None), getattr(w, "multi_turn", None)
    synthetic = bool(sp is not None and sp.count) or bool(mt is not None and mt.enabled)
    if synthetic and w.arrival != "trace" and w.hash_block_tokens != c.prefix_block_tokens:
        raise ConfigError("workload.hash_block_tokens", w.hash_block_tokens,
                          f"equal to cluster.prefix_block_tokens={c.prefix_block_tokens} (the "
                          "simulator reads each hash id as that many tokens)")
