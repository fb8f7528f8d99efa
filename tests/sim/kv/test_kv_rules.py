"""Each engine's rule for its KV-cache memory (``sim.kv.rules``), by hand."""

from __future__ import annotations

import pytest

from sim.builders import plain, replica_memory_budget
from sim.kv.budget import GIB, forward_activation_bytes
from sim.kv.rules import sglang_mem_fraction_static, startup_lines

MIB = 2**20
CUDA_TOTAL = 81090 * MIB  # conf/hardware/h100_sxm.yaml: what cudaMemGetInfo reports
WEIGHTS = 8_030_261_248 * 2  # Llama-3.1-8B, bf16


def test_sglang_default_mem_fraction_static():
    """server_args: reserved = 512 + 1.5·8192 + 2·256 + tp/8·1024 MiB on an 81,559 MiB H100."""
    assert sglang_mem_fraction_static(81559 * MIB, 8192, tp=1) == round(
        (81559 - 13440) / 81559, 3) == 0.835
    assert sglang_mem_fraction_static(81559 * MIB, 8192, tp=4) == round(
        (81559 - (512 + 12288 + 1024 + 512)) / 81559, 3)  # cuda_graph_max_bs 512 from TP 4
    assert sglang_mem_fraction_static(40960 * MIB, 2048, tp=1) == round(
        (40960 - (512 + 3072 + 512 + 128)) / 40960, 3)  # below 60 GiB: no 10 GiB floor


@pytest.mark.parametrize("backend", ["vllm", "sglang", "trtllm"])
def test_kv_memory_of_llama8b_on_h100(compose_cfg, backend):
    cfg = plain(compose_cfg(f"backend={backend}", f"scheduler={backend}"))
    b = replica_memory_budget(cfg)
    other = GIB  # kv_cache.other_memory_gib
    if backend == "vllm":  # util × total − weights − the sampler's peak − non-torch
        expected = int(CUDA_TOTAL * 0.9) - WEIGHTS - 1024 * 128256 * 16 - other
    elif backend == "sglang":  # free before the weights × mem_fraction_static − weights
        expected = int((CUDA_TOTAL - other) * 0.835) - WEIGHTS
    else:  # free_gpu_memory_fraction × what a max_num_tokens prefill leaves free
        forward = forward_activation_bytes(cfg.model, cfg.scheduler, 1)
        expected = int((CUDA_TOTAL - WEIGHTS - forward - other) * 0.9)
    assert b.rule == backend and b.kv_cache_bytes == expected
    assert b.num_gpu_blocks == expected // (16 * 131072)


def test_startup_lines_read_like_the_engines_logs(compose_cfg):
    b = replica_memory_budget(plain(compose_cfg()))
    lines = startup_lines(b, 131072, 131072, 131072)
    assert lines[0] == f"Available KV cache memory: {b.kv_cache_bytes / GIB:.2f} GiB"
    assert lines[1] == f"GPU KV cache size: {b.num_gpu_blocks * 16:,} tokens"
    assert lines[2] == (f"Maximum concurrency for 131,072 tokens per request: "
                        f"{b.num_gpu_blocks / 8192:.2f}x")
    s = replica_memory_budget(plain(compose_cfg("backend=sglang")))
    assert startup_lines(s, 131072, 131072, 131072)[0].startswith(
        f"KV Cache is allocated. #tokens: {s.kv_cache_bytes // 131072}")
