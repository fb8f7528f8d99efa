"""Schema and checks of ``cluster=``: how model copies are laid out on GPUs and routed to."""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.config.common import positive
from sim.errors import ConfigError
from sim.routers import ROUTERS


@dataclass
class FailureConfig:
    """Replica failures: exponential time between failures and a fixed repair time."""

    mtbf_s: float | None = None  # None: replicas never fail
    mttr_s: float = 60.0


@dataclass
class ClusterConfig:
    """How model copies are laid out on GPUs, and how requests reach them.

    The parallelism fields describe one replica (one serving engine); ``replicas`` identical
    copies sit behind ``router``. ``cluster=disagg`` splits prefill and decode into two pools.
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
    # ---- prefill/decode disaggregation (cluster=disagg); then `replicas` is not used
    disaggregated: bool = False
    prefill_replicas: int = 0
    decode_replicas: int = 0
    prefill_tensor_parallel_size: int | None = None  # None: tensor_parallel_size
    decode_tensor_parallel_size: int | None = None
    kv_transfer_bandwidth: float | None = None  # bytes/s per GPU; None: hardware.nvlink_bandwidth
    kv_transfer_latency_us: float = 10.0


def check_cluster(c: ClusterConfig) -> None:
    """Replica counts, router and its options, failures and the disaggregation link in range
    (one replica's parallel layout is checked by ``check_parallelism``)."""
    positive("cluster.replicas", c.replicas)
    if c.router not in ROUTERS:
        raise ConfigError("cluster.router", c.router, f"one of {sorted(ROUTERS)}")
    if c.router_load_cap < 0:
        raise ConfigError("cluster.router_load_cap", c.router_load_cap, "must be >= 0")
    positive("cluster.prefix_block_tokens", c.prefix_block_tokens)
    if c.prefix_index_blocks is not None:
        positive("cluster.prefix_index_blocks", c.prefix_index_blocks)
    if c.failure.mtbf_s is not None:
        positive("cluster.failure.mtbf_s", c.failure.mtbf_s)
    positive("cluster.failure.mttr_s", c.failure.mttr_s)
    if not c.disaggregated:
        return
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


# (group, schema name, dataclass) registered with Hydra by ``sim.app``
SCHEMAS = [
    ("cluster", "base_cluster", ClusterConfig),
]
