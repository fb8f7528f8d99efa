"""A replica's KV cache built from its config and memory budget: the capacity (or the
engine log's ``num_gpu_blocks`` override), the per-request state blocks, swap space and the
host tier of the prefix cache."""

from __future__ import annotations

from sim.errors import ConfigError
from sim.kv.budget import GIB
from sim.kv.manager import PagedKVCache
from sim.kv.offload import HostTier
from sim.kv.swap import SwapSpace


def kv_blocks(kv_cfg, budget) -> int:
    """The KV blocks a replica's cache has: ``kv_cache.num_gpu_blocks`` when set (what users
    copy from an engine's log), else the count its memory budget derives."""
    override = getattr(kv_cfg, "num_gpu_blocks", None)
    return int(override) if override is not None else int(budget.num_gpu_blocks)


def build_kv_cache(kv_cfg, hardware, budget, num_requests: int,
                   largest_request_tokens: int = 0, lengths=None) -> PagedKVCache:
    """The KV cache of one replica from ``kv_cache=``, the hardware (PCIe for swap) and the
    memory budget (``sim.kv.budget.MemoryBudget``: capacity, block size and bytes, state blocks).

    ``kv_cache.num_gpu_blocks`` overrides the derived capacity; with ``preemption=swap`` the
    host space must hold the blocks of the largest request (``largest_request_tokens``);
    ``cpu_offload_gb`` adds a host tier under the prefix cache. ``lengths``: the requests'
    prompt and most output tokens (``PagedKVCache.set_lengths``), which size their
    sliding-window blocks.
    """
    most = int(getattr(budget, "state_blocks_per_request", 0))
    window = getattr(budget, "window", None)
    blocks = kv_blocks(kv_cfg, budget)
    if blocks < 2 + most:
        raise ConfigError("kv_cache.num_gpu_blocks", blocks, f"must be >= {2 + most} (the "
                          f"null block, {most} state block(s) and one KV block)")
    kv = PagedKVCache(blocks, budget.block_size, num_requests,
                      state_blocks=budget.fixed_state_blocks if window else most,
                      prefix_caching=bool(getattr(kv_cfg, "prefix_caching", False)),
                      window=window)
    if lengths is not None:
        kv.set_lengths(*lengths)
    if getattr(kv_cfg, "preemption", "recompute") == "swap":
        if not hardware.pcie_bandwidth > 0:
            raise ConfigError("hardware.pcie_bandwidth", hardware.pcie_bandwidth,
                              "> 0 for kv_cache.preemption=swap")
        host = int(kv_cfg.swap_space_gib * GIB) // budget.block_bytes
        need = kv.blocks_for(int(largest_request_tokens)) + most
        if host < need:
            raise ConfigError("kv_cache.swap_space_gib", kv_cfg.swap_space_gib,
                              f">= {need * budget.block_bytes / GIB:.3f} (the {need} blocks of "
                              f"the largest request)")
        kv.enable_swap(SwapSpace(host, budget.block_bytes, hardware.pcie_bandwidth))
    offload = getattr(kv_cfg, "cpu_offload_gb", 0.0)
    if offload and kv.prefix is not None:
        if not hardware.pcie_bandwidth > 0:
            raise ConfigError("hardware.pcie_bandwidth", hardware.pcie_bandwidth,
                              "> 0 for kv_cache.cpu_offload_gb")
        kv.enable_offload(HostTier(int(offload * GIB) // budget.block_bytes),
                          budget.block_bytes / hardware.pcie_bandwidth)
    return kv
