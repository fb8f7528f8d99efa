"""Schema and checks of ``kv_cache=``: the paged KV cache of one replica."""

from __future__ import annotations

from dataclasses import dataclass

from sim.config.common import DTYPE_BYTES, positive
from sim.errors import ConfigError


@dataclass
class KVCacheConfig:
    """Paged KV cache: block size, memory fraction, KV dtype and preemption mode."""

    name: str = "paged"
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    dtype: str = "auto"
    preemption: str = "recompute"
    # Memory outside weights and activations: CUDA context, NCCL/cuBLAS workspaces, CUDA graphs.
    other_memory_gib: float = 1.0


def check_kv_cache(k: KVCacheConfig) -> None:
    """KV-cache settings in range."""
    positive("kv_cache.block_size", k.block_size)
    if not 0 < k.gpu_memory_utilization <= 1:
        raise ConfigError("kv_cache.gpu_memory_utilization", k.gpu_memory_utilization,
                          "must be in (0, 1]")
    if k.dtype != "auto" and k.dtype not in DTYPE_BYTES:
        raise ConfigError("kv_cache.dtype", k.dtype, f"'auto' or one of {sorted(DTYPE_BYTES)}")
    if k.preemption != "recompute":
        raise ConfigError("kv_cache.preemption", k.preemption, "one of ['recompute']")
    if k.other_memory_gib < 0:
        raise ConfigError("kv_cache.other_memory_gib", k.other_memory_gib, "must be >= 0")


# (group, schema name, dataclass) registered with Hydra by ``sim.app``
SCHEMAS = [
    ("kv_cache", "base_kv_cache", KVCacheConfig),
]
