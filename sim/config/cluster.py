"""Schema and checks of ``cluster=``: how model copies are laid out on GPUs and routed to."""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.config.common import positive


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
    failure: FailureConfig = field(default_factory=FailureConfig)
    # ---- prefill/decode disaggregation (cluster=disagg)
    prefill_replicas: int = 0
    decode_replicas: int = 0
    prefill_tensor_parallel_size: int | None = None  # None: tensor_parallel_size
    decode_tensor_parallel_size: int | None = None
    kv_transfer_bandwidth: float | None = None  # bytes/s; None: hardware.nvlink_bandwidth
    kv_transfer_latency_us: float = 10.0


def check_cluster(c: ClusterConfig) -> None:
    """Replica count in range (the parallel layout is checked by ``check_parallelism``)."""
    positive("cluster.replicas", c.replicas)


# (group, schema name, dataclass) registered with Hydra by ``sim.app``
SCHEMAS = [
    ("cluster", "base_cluster", ClusterConfig),
]
