"""Schema and checks of ``cluster=``: how model copies are laid out on GPUs and routed to."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from sim.config.autoscaler import AutoscalerConfig, check_autoscaler
from sim.config.common import positive
from sim.config.diffusion_cluster import (
    DiffusionBatchingConfig,
    DiffusionJobCostConfig,
    DiffusionParallelConfig,
    cluster_kind,
)
from sim.errors import ConfigError
from sim.routers import ROUTERS

MAX_PREFIX_BLOCK_TOKENS = 1 << 20  # longer than any model's context window


@dataclass
class FailureConfig:
    """Replica failures: exponential time between failures and a fixed repair time."""

    mtbf_s: float | None = None  # None: replicas never fail
    mttr_s: float | None = 60.0  # None: a failed replica is lost for good
    # a request whose replicas failed more than this many times fails (retries_exhausted);
    # None: retried without limit
    max_retries: int | None = None


@dataclass
class StragglerConfig:
    """Slow replicas: every step of a straggler takes ``factor`` times as long (host
    overhead and KV copies included), for the whole run or in episodes."""

    factor: float = 2.0
    # ceil(fraction × replicas) stragglers, chosen at random (the run's fault stream) ...
    fraction: float = 0.0
    # ... or these replica ids (run-wide: the prefill pool first in a disaggregated cluster)
    replicas: list[int] | None = None
    mtbs_s: float | None = None  # mean time between slow episodes; None: slow all the run
    duration_s: float = 60.0  # length of one slow episode


@dataclass
class LinkDegradationConfig:
    """Episodes during which the KV-transfer link of a disaggregated cluster is slower."""

    mtbd_s: float | None = None  # mean time between degraded episodes; None: never
    duration_s: float = 10.0  # length of one episode
    bandwidth_factor: float = 0.1  # the link's bandwidth × this during an episode, in (0, 1]
    added_latency_us: float = 0.0  # added to a transfer that starts during an episode


@dataclass
class ClusterConfig:
    """How model copies are laid out on GPUs, and how requests reach them.

    The parallelism fields describe one replica (one serving engine); ``replicas`` identical
    copies sit behind ``router``. ``cluster=disagg`` splits prefill and decode into two pools.
    ``kind: diffusion`` serves diffusion jobs on ``nodes`` nodes instead (``cluster=diffusion``)
    and ``kind: mixed`` runs both side by side (``cluster=mixed``): the fields from ``kind``
    on, checked by ``sim.config.diffusion_cluster.check_diffusion_cluster``.
    """

    name: str = "single"
    # ---- one replica's parallel layout
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    # MoE experts are split over this many GPUs (1: experts are tensor-parallel instead)
    expert_parallel_size: int = 1
    # attention data parallelism inside one engine (DeepSeek-style); experts span tp × dp GPUs
    data_parallel_size: int = 1
    # ---- replicas and routing
    replicas: int = 1
    router: str = "round_robin"
    # prefix_affinity: a replica may take a request for its cached prefix only while it has at
    # most this many more outstanding requests than the least loaded replica
    router_load_cap: int = 8
    prefix_block_tokens: int = 512  # tokens per hash of the workload's hash_ids (Mooncake)
    prefix_index_blocks: int | None = None  # per-replica LRU of hashes; None: its KV capacity
    failure: FailureConfig = field(default_factory=FailureConfig)
    straggler: StragglerConfig = field(default_factory=StragglerConfig)
    link_degradation: LinkDegradationConfig = field(default_factory=LinkDegradationConfig)
    # replicas added and removed as the run goes (sim.engine.autoscaler; policy none: fixed)
    autoscaler: AutoscalerConfig = field(default_factory=AutoscalerConfig)
    # ---- prefill/decode disaggregation (cluster=disagg); then `replicas` is not used
    disaggregated: bool = False
    prefill_replicas: int = 0
    decode_replicas: int = 0
    prefill_tensor_parallel_size: int | None = None  # None: tensor_parallel_size
    decode_tensor_parallel_size: int | None = None
    kv_transfer_bandwidth: float | None = None  # bytes/s per GPU; None: hardware.nvlink_bandwidth
    kv_transfer_latency_us: float = 10.0
    # ---- diffusion node pool (cluster=diffusion, cluster=mixed; sim.config.diffusion_cluster)
    kind: str = "llm"  # llm (replicas) | diffusion (nodes) | mixed (both)
    nodes: int = 1  # nodes of hardware.gpus_per_node GPUs each
    policy: str = "fcfs"  # fcfs | sjf (shortest predicted job first) | priority
    preemption: bool = True  # priority: pause lower-priority jobs at a step boundary
    gpus_per_job: int = 8  # each job's gang (GPUs of one node), unless elastic
    # choose each job's gang from the queue and its parallel efficiency
    # (sim.diffusion.policies.gang)
    elastic: bool = False
    # elastic, with more than one job waiting: the largest power-of-two gang whose parallel
    # efficiency (time on 1 GPU / (g x time on g GPUs)) is at least this
    elastic_efficiency: float = 0.8
    parallel: DiffusionParallelConfig = field(default_factory=DiffusionParallelConfig)
    batching: DiffusionBatchingConfig = field(default_factory=DiffusionBatchingConfig)
    # a job on a failed node resumes from its last completed step (else from the start)
    checkpointing: bool = False
    job_cost: DiffusionJobCostConfig = field(default_factory=DiffusionJobCostConfig)


def pool_size(c: ClusterConfig, nodes: bool = False) -> int:
    """Replicas the cluster builds: both pools of a disaggregated one, an autoscaler's
    ``max_replicas`` (some start off), else ``replicas`` (``nodes``: the diffusion nodes of
    ``cluster=diffusion``: ``max_replicas`` or ``nodes``)."""
    if c.disaggregated and not nodes:
        return c.prefill_replicas + c.decode_replicas
    a = getattr(c, "autoscaler", None)
    if a is not None and a.policy != "none":
        return a.max_replicas
    return c.nodes if nodes else c.replicas


def check_cluster(c: ClusterConfig) -> None:
    """Replica counts, router and its options, failures and the disaggregation link in range
    (one replica's parallel layout is checked by ``check_parallelism``)."""
    positive("cluster.replicas", c.replicas)
    if c.router not in ROUTERS:
        raise ConfigError("cluster.router", c.router, f"one of {sorted(ROUTERS)}")
    if c.router_load_cap < 0:
        raise ConfigError("cluster.router_load_cap", c.router_load_cap, "must be >= 0")
    positive("cluster.prefix_block_tokens", c.prefix_block_tokens)
    if c.prefix_block_tokens > MAX_PREFIX_BLOCK_TOKENS:
        # each id's block is hashed in engine blocks: a block longer than any context would
        # only allocate hashes for tokens no prompt has
        raise ConfigError("cluster.prefix_block_tokens", c.prefix_block_tokens,
                          f"at most {MAX_PREFIX_BLOCK_TOKENS:,} tokens per hash id "
                          "(Mooncake's traces: 512)")
    if c.prefix_index_blocks is not None:
        positive("cluster.prefix_index_blocks", c.prefix_index_blocks)
    if c.disaggregated:
        _check_disaggregation(c)
    check_faults(c)  # after the replica counts, which straggler ids are checked against
    if getattr(c, "autoscaler", None) is not None:
        check_autoscaler(c, nodes=cluster_kind(c) == "diffusion")


def _check_disaggregation(c: ClusterConfig) -> None:
    for f in ("prefill_replicas", "decode_replicas"):
        if getattr(c, f) < 1:
            raise ConfigError(f"cluster.{f}", getattr(c, f),
                              "must be >= 1 in a disaggregated cluster (cluster.disaggregated)")
    for f in ("prefill_tensor_parallel_size", "decode_tensor_parallel_size",
              "kv_transfer_bandwidth"):
        if getattr(c, f) is not None:
            positive(f"cluster.{f}", getattr(c, f))
    if c.kv_transfer_latency_us < 0:
        raise ConfigError("cluster.kv_transfer_latency_us", c.kv_transfer_latency_us,
                          "must be >= 0")


def _at_least(field: str, value, low: float, what: str = "") -> None:
    if value is None or not math.isfinite(value) or value < low:
        raise ConfigError(field, value, what or f"must be a finite number >= {low}")


def check_faults(c: ClusterConfig) -> None:
    """Failures, stragglers and link degradation in range; straggler ids name replicas."""
    f, s, d = c.failure, c.straggler, c.link_degradation
    for name, value in (("failure.mtbf_s", f.mtbf_s), ("failure.mttr_s", f.mttr_s),
                        ("straggler.mtbs_s", s.mtbs_s), ("link_degradation.mtbd_s", d.mtbd_s)):
        if value is not None:  # None: never (mtbf, mtbs, mtbd) or no repair (mttr)
            positive(f"cluster.{name}", value)
    if f.max_retries is not None and f.max_retries < 0:
        raise ConfigError("cluster.failure.max_retries", f.max_retries,
                          "must be >= 0 (null: retry without limit)")
    _at_least("cluster.straggler.factor", s.factor, 1.0,
              "must be a finite number >= 1 (how many times slower a straggler steps)")
    if not 0.0 <= s.fraction <= 1.0:
        raise ConfigError("cluster.straggler.fraction", s.fraction, "must be in [0, 1]")
    n = pool_size(c)
    bad = [r for r in s.replicas or () if not 0 <= r < n]
    if bad or len(set(s.replicas or ())) != len(s.replicas or ()):
        raise ConfigError("cluster.straggler.replicas", list(s.replicas),
                          f"distinct replica ids in [0, {n - 1}]")
    positive("cluster.straggler.duration_s", s.duration_s)
    positive("cluster.link_degradation.duration_s", d.duration_s)
    if not 0.0 < d.bandwidth_factor <= 1.0:
        raise ConfigError("cluster.link_degradation.bandwidth_factor", d.bandwidth_factor,
                          "must be in (0, 1]")
    _at_least("cluster.link_degradation.added_latency_us", d.added_latency_us, 0.0)


# (group, schema name, dataclass) registered with Hydra by ``conf.schema``
SCHEMAS = [
    ("cluster", "base_cluster", ClusterConfig),
]
