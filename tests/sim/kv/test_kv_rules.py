"""Each engine's rule for its KV-cache memory (``sim.kv.rules``), by hand."""

from __future__ import annotations

import dataclasses

import pytest

from sim.builders import plain, replica_memory_budget
from sim.kv.budget import GIB, KVGroups, forward_activation_bytes, window_cap
from sim.kv.rules import sglang_mem_fraction_static, sliding_paged_as_full, startup_lines

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
    lines = startup_lines(b, 131072, 131072, 131072, 8192)
    assert lines[0] == f"Available KV cache memory: {b.kv_cache_bytes / GIB:.2f} GiB"
    assert lines[1] == f"GPU KV cache size: {b.num_gpu_blocks * 16:,} tokens"
    assert lines[2] == (f"Maximum concurrency for 131,072 tokens per request: "
                        f"{b.num_gpu_blocks / 8192:.2f}x")
    s = replica_memory_budget(plain(compose_cfg("backend=sglang")))
    assert startup_lines(s, 131072, 131072, 131072, 8192)[0].startswith(
        f"KV Cache is allocated. #tokens: {s.kv_cache_bytes // 131072}")


def test_engines_page_sliding_window_layers_their_way(compose_cfg):
    """vLLM keeps a sliding layer's window (hybrid KV cache manager); SGLang keeps every token
    for gpt-oss (it forces disable_hybrid_swa_memory) but not for Gemma-2; TensorRT-LLM keeps
    every token (no max_attention_window); kv_cache.sliding_window_paging overrides."""
    for model, expected in (("gpt_oss_20b", {"vllm": False, "sglang": True, "trtllm": True}),
                            ("gemma2_2b", {"vllm": False, "sglang": False, "trtllm": True})):
        cfg = plain(compose_cfg(f"model={model}"))
        for rule, full in expected.items():
            assert sliding_paged_as_full(rule, cfg.model, cfg.kv_cache) is full
        for paging, full in (("window", False), ("full", True)):
            kv = dataclasses.replace(cfg.kv_cache, sliding_window_paging=paging)
            assert all(sliding_paged_as_full(r, cfg.model, kv) is full for r in expected)


def test_vllm_groups_and_log_lines_for_gpt_oss_by_hand(compose_cfg):
    """gpt-oss-20b on two GPUs: 12 sliding and 12 full layers, two KV cache groups of 12
    layers; a block is 16 tokens of 12 layers' K and V (4 KV heads per GPU, head dim 64,
    bf16). vLLM logs blocks // 2 groups × 16 tokens, and a concurrency of blocks over
    cdiv(8192, 16) blocks of the full group plus cdiv(min(127 + 8192, 8192), 16) + 1 of the
    sliding one (as its published log of this deployment: 2,591,776 tokens, 316.07x)."""
    over = ("model=gpt_oss_20b", "cluster.tensor_parallel_size=2",
            "scheduler.max_model_len=8192")
    b = replica_memory_budget(plain(compose_cfg(*over)))
    page = 16 * 2 * 4 * 64 * 2
    assert b.layer_block_bytes == page and b.block_bytes == 12 * page
    assert (b.groups.size, b.groups.full, b.groups.sliding) == (12, 1, 1)
    blocks = b.kv_cache_bytes // (12 * page)
    lines = startup_lines(b, 12 * page // 16, 8192, 131072, 8192)
    assert lines[1] == f"GPU KV cache size: {blocks // 2 * 16:,} tokens"
    assert lines[2] == (f"Maximum concurrency for 8,192 tokens per request: "
                        f"{blocks / (512 + 513):.2f}x")
    # --disable-hybrid-kv-cache-manager: one group of all 24 layers, every token kept
    f = replica_memory_budget(plain(compose_cfg(*over, "kv_cache.sliding_window_paging=full")))
    assert (f.groups.size, f.groups.full, f.groups.sliding) == (24, 1, 0)
    assert f.block_bytes == 24 * page and f.state_blocks_per_request == 0
    blocks = f.kv_cache_bytes // (24 * page)
    lines = startup_lines(f, 24 * page // 16, 8192, 131072, 8192)
    assert lines[1] == f"GPU KV cache size: {blocks * 16:,} tokens"
    assert lines[2] == f"Maximum concurrency for 8,192 tokens per request: {blocks / 512:.2f}x"


def test_kv_groups_pad_the_sliding_layers():
    """vLLM groups by min(layers of each kind); the last group of a kind is padded: 10 full
    and 52 sliding layers (Gemma-3-27B) make one full group and six sliding groups of 10."""
    g = KVGroups.of(10, 52)
    assert (g.size, g.full, g.sliding, g.window_layers) == (10, 1, 6, 60)
    assert KVGroups.of(36, 0) == KVGroups(36)
    assert window_cap(128, 16) == 9 and window_cap(4096, 16) == 257 and window_cap(129, 16) == 9
