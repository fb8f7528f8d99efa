"""Schema and checks of ``kv_cache=``: the paged KV cache of one replica."""

from __future__ import annotations

from dataclasses import dataclass

from sim.config.common import DTYPE_BYTES, positive
from sim.errors import ConfigError

PREEMPTION_MODES = ("recompute", "swap")
# How sliding-window layers are paged (sim.kv.rules.sliding_paged_as_full): auto = the
# engine's default; window = only the window's blocks are kept (vLLM's hybrid KV cache
# manager); full = every token, as a full-attention layer (vLLM's
# --disable-hybrid-kv-cache-manager, SGLang's --disable-hybrid-swa-memory)
SLIDING_WINDOW_PAGING = ("auto", "window", "full")
# The block sizes each engine takes (kv_cache.block_size is vLLM's block_size, SGLang's
# page_size, TensorRT-LLM's tokens_per_block): vLLM's CacheConfig.block_size is a BlockSize,
# Literal[1, 8, 16, 32, 64, 128, 256] (vllm/config/cache.py as of v0.11; sim.kv.rules models
# 0.10.2-0.12.0); TensorRT-LLM's a power of 2 (docs/source/advanced/kv-cache-reuse.md:
# "tokens_per_block must be a power of 2"); SGLang's any page size >= 1 (server_args
# page_size, default 1; "every kernel backend is compatible with a page size > 1",
# docs/advanced_features/attention_backend.md).
VLLM_BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)
# Block counts at most this many: far above any GPU's (a few million), and within what the
# compiled event loop's int64 counters hold.
MAX_GPU_BLOCKS = 2**40


@dataclass
class KVCacheConfig:
    """Paged KV cache: block size, memory fraction, KV dtype, preemption mode, a capacity
    override, prefix caching and its host offload tier."""

    name: str = "paged"
    block_size: int = 16
    # vLLM's gpu_memory_utilization, TensorRT-LLM's free_gpu_memory_fraction (sim.kv.rules)
    gpu_memory_utilization: float = 0.9
    # SGLang's mem_fraction_static; null: SGLang's default rule for the GPU and layout
    mem_fraction_static: float | None = None
    dtype: str = "auto"
    preemption: str = "recompute"
    # Non-torch memory: CUDA context, NCCL/cuBLAS workspaces (an estimate; CUDA graphs are
    # captured after the cache is sized and are not counted by vLLM or SGLang).
    other_memory_gib: float = 1.0
    # Blocks of the cache (null block included), as an engine log's ``num_gpu_blocks``:
    # overrides the capacity derived from memory when set.
    num_gpu_blocks: int | None = None
    # vLLM's ``enable_prefix_caching``: reuse cached full blocks of a shared prompt prefix.
    prefix_caching: bool = False
    # Pinned host memory per replica for preemption by swap (vLLM's ``--swap-space``).
    swap_space_gib: float = 4.0
    # Host memory per replica that keeps cached blocks evicted from the GPU (0 = off); a
    # prefix hit there is copied back over PCIe. Needs prefix_caching.
    cpu_offload_gb: float = 0.0
    # How sliding-window layers are paged: auto (the engine's default), window or full
    # (SLIDING_WINDOW_PAGING above; sim.kv.rules).
    sliding_window_paging: str = "auto"


def check_kv_cache(k: KVCacheConfig) -> None:
    """KV-cache settings in range."""
    positive("kv_cache.block_size", k.block_size)
    if not 0 < k.gpu_memory_utilization <= 1:
        raise ConfigError("kv_cache.gpu_memory_utilization", k.gpu_memory_utilization,
                          "must be in (0, 1]")
    if k.mem_fraction_static is not None and not 0 < k.mem_fraction_static <= 1:
        raise ConfigError("kv_cache.mem_fraction_static", k.mem_fraction_static,
                          "null (SGLang's default) or in (0, 1]")
    if k.dtype != "auto" and k.dtype not in DTYPE_BYTES:
        raise ConfigError("kv_cache.dtype", k.dtype, f"'auto' or one of {sorted(DTYPE_BYTES)}")
    if k.preemption not in PREEMPTION_MODES:
        raise ConfigError("kv_cache.preemption", k.preemption, f"one of {list(PREEMPTION_MODES)}")
    if k.cpu_offload_gb < 0:
        raise ConfigError("kv_cache.cpu_offload_gb", k.cpu_offload_gb, "must be >= 0")
    if k.cpu_offload_gb and not k.prefix_caching:
        raise ConfigError("kv_cache.cpu_offload_gb", k.cpu_offload_gb,
                          "0 unless kv_cache.prefix_caching=true (it holds cached blocks)")
    if k.swap_space_gib < 0:
        raise ConfigError("kv_cache.swap_space_gib", k.swap_space_gib, "must be >= 0")
    if k.num_gpu_blocks is not None and not 2 <= k.num_gpu_blocks <= MAX_GPU_BLOCKS:
        raise ConfigError("kv_cache.num_gpu_blocks", k.num_gpu_blocks,
                          f"null (derive from memory) or an int >= 2 and <= {MAX_GPU_BLOCKS}")
    if k.other_memory_gib < 0:
        raise ConfigError("kv_cache.other_memory_gib", k.other_memory_gib, "must be >= 0")
    if k.sliding_window_paging not in SLIDING_WINDOW_PAGING:
        raise ConfigError("kv_cache.sliding_window_paging", k.sliding_window_paging,
                          f"one of {list(SLIDING_WINDOW_PAGING)}")


def check_block_size(k: KVCacheConfig, backend: str) -> None:
    """``kv_cache.block_size`` is a size the engine ``backend`` (``backend.name``) takes."""
    size = k.block_size
    if backend == "vllm" and size not in VLLM_BLOCK_SIZES:
        raise ConfigError("kv_cache.block_size", size, f"one of {list(VLLM_BLOCK_SIZES)}, the "
                          "block sizes backend=vllm takes (vLLM's CacheConfig.block_size)")
    if backend == "trtllm" and size & (size - 1):
        raise ConfigError("kv_cache.block_size", size, "a power of 2 (e.g. 16, 32, 64, 128), "
                          "the block sizes backend=trtllm takes (TensorRT-LLM's "
                          "tokens_per_block)")


# (group, schema name, dataclass) registered with Hydra by ``conf.schema``
SCHEMAS = [
    ("kv_cache", "base_kv_cache", KVCacheConfig),
]
