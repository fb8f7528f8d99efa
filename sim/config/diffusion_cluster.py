"""Schema and checks of the diffusion side of ``cluster=``: the node pool of
``cluster=diffusion`` and ``cluster=mixed`` (``sim.diffusion.pool``).

These blocks are fields of ``ClusterConfig`` (``cluster.nodes``, ``cluster.policy``,
``cluster.parallel.ulysses``, ...), so ``cluster=single|disagg`` compose as before and leave
them at their defaults. GPUs per node come from ``hardware.gpus_per_node``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.config.common import positive
from sim.errors import ConfigError

CLUSTER_KINDS = ("llm", "diffusion", "mixed")
DIFFUSION_POLICIES = ("fcfs", "sjf", "priority")
PLAN_MODES = ("auto", "fixed")
DEGREES = ("ulysses", "ring", "cfg", "pipefusion", "data", "tensor")
JOB_COST_MODELS = ("roofline", "constant")


@dataclass
class DiffusionParallelConfig:
    """How a job's work is split over its gang (xDiT's degrees; ``sim.diffusion.job``).

    ``plan: auto`` picks the fastest valid plan on the gang (``DiffusionCost.best``) unless a
    degree is set above 1; then (or with ``plan: fixed``) the degrees are the plan and must
    multiply to ``cluster.gpus_per_job``.
    """

    plan: str = "auto"  # auto | fixed
    ulysses: int = 1
    ring: int = 1
    cfg: int = 1
    pipefusion: int = 1
    data: int = 1
    tensor: int = 1


@dataclass
class DiffusionBatchingConfig:
    """Batching of same-shape image requests (same model, resolution, steps, guidance and
    priority; never videos) into one job of at most ``max_images`` images."""

    max_images: int = 1  # 1: no batching
    # a batch that is not full waits at most this long after its first request arrived
    # before it queues (0: requests already queued together are batched when one starts)
    max_wait_s: float = 0.0


@dataclass
class DiffusionJobCostConfig:
    """How long a job takes: ``roofline`` (``sim.diffusion.cost.DiffusionCostModel``: the
    pipeline's operators on the hardware) or ``constant`` (``sim.diffusion.constant_cost``:
    the fixed times below, for tests and queueing-theory checks)."""

    name: str = "roofline"  # roofline | constant
    # constant only: text encoding per job (one GPU), one denoising step and the VAE decode
    # of one image (or video) on one GPU; steps 0 in the workload means ``default_steps``
    encode_ms: float = 0.0
    step_ms: float = 100.0
    decode_ms: float = 0.0
    default_steps: int = 50
    # constant only: speed-up on g GPUs is 1 + parallel_efficiency × (g − 1) (1: linear)
    parallel_efficiency: float = 1.0


def cluster_kind(c) -> str:
    """What the cluster serves: ``llm`` (replicas), ``diffusion`` (nodes) or ``mixed``."""
    return getattr(c, "kind", "llm")


def plan_degrees(p: DiffusionParallelConfig) -> dict[str, int]:
    """The six degrees of ``cluster.parallel`` by name."""
    return {d: int(getattr(p, d)) for d in DEGREES}


def fixed_plan(p: DiffusionParallelConfig) -> bool:
    """Whether ``cluster.parallel`` fixes the plan (``plan: fixed``, or a degree above 1)."""
    return p.plan == "fixed" or any(v > 1 for v in plan_degrees(p).values())


def check_diffusion_cluster(c, gpus_per_node: int) -> None:
    """The node pool's fields in range: nodes, policy, gang size against the node, the plan's
    degrees against the gang, the elastic efficiency bar, batching, the job cost (``c`` is a
    ``ClusterConfig``)."""
    if c.kind not in CLUSTER_KINDS:
        raise ConfigError("cluster.kind", c.kind, f"one of {list(CLUSTER_KINDS)}")
    if c.kind == "llm":
        return
    positive("cluster.nodes", c.nodes)
    if c.policy not in DIFFUSION_POLICIES:
        raise ConfigError("cluster.policy", c.policy, f"one of {list(DIFFUSION_POLICIES)}")
    positive("cluster.gpus_per_job", c.gpus_per_job)
    if c.gpus_per_job > gpus_per_node:
        raise ConfigError("cluster.gpus_per_job", c.gpus_per_job,
                          f"must be <= hardware.gpus_per_node={gpus_per_node} (a job's gang "
                          "never spans nodes)")
    p = c.parallel
    if p.plan not in PLAN_MODES:
        raise ConfigError("cluster.parallel.plan", p.plan, f"one of {list(PLAN_MODES)}")
    degrees = plan_degrees(p)
    for d, v in degrees.items():
        positive(f"cluster.parallel.{d}", v)
    if fixed_plan(p):
        product = math.prod(degrees.values())
        if c.elastic:
            raise ConfigError("cluster.elastic", True, "false when cluster.parallel fixes the "
                              "plan (elastic chooses each job's gang size and plan: leave the "
                              "degrees at 1)")
        if product != c.gpus_per_job:
            label = "×".join(f"{d}={v}" for d, v in degrees.items() if v > 1) or "all 1"
            raise ConfigError("cluster.parallel", label,
                              f"degrees must multiply to cluster.gpus_per_job={c.gpus_per_job}"
                              f" (they multiply to {product})")
    eff = getattr(c, "elastic_efficiency", None)  # None: a ClusterConfig without the field
    if eff is not None and not (math.isfinite(eff) and 0 < eff <= 1):
        raise ConfigError("cluster.elastic_efficiency", eff, "must be in (0, 1] (the parallel "
                          "efficiency an elastic gang must keep while other jobs wait)")
    positive("cluster.batching.max_images", c.batching.max_images)
    if not (math.isfinite(c.batching.max_wait_s) and c.batching.max_wait_s >= 0):
        raise ConfigError("cluster.batching.max_wait_s", c.batching.max_wait_s,
                          "must be a finite number >= 0")
    check_job_cost(c.job_cost)


def check_job_cost(j: DiffusionJobCostConfig) -> None:
    """``cluster.job_cost``: a known model; the constant model's times in range."""
    if j.name not in JOB_COST_MODELS:
        raise ConfigError("cluster.job_cost.name", j.name, f"one of {list(JOB_COST_MODELS)}")
    if j.name != "constant":
        return
    positive("cluster.job_cost.step_ms", j.step_ms)
    for f in ("encode_ms", "decode_ms"):
        v = getattr(j, f)
        if not (math.isfinite(v) and v >= 0):
            raise ConfigError(f"cluster.job_cost.{f}", v, "must be a finite number >= 0")
    positive("cluster.job_cost.default_steps", j.default_steps)
    if not 0 < j.parallel_efficiency <= 1:
        raise ConfigError("cluster.job_cost.parallel_efficiency", j.parallel_efficiency,
                          "must be in (0, 1]")
