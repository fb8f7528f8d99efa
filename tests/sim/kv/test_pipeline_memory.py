"""Memory plan with pipeline parallelism, one memory budget per run, shared experts under
expert parallelism, and block-scaled FP8 weights."""

from __future__ import annotations

import dataclasses
import logging
from copy import deepcopy

import numpy as np
import pytest

from cli.app import log_memory_budgets
from sim.builders import build_replica_parts, plain, replica_memory_budget
from sim.config import HardwareConfig, KVCacheConfig, ModelConfig, SchedulerConfig
from sim.cost import RooflineCostModel
from sim.cost.calibration_file import load_calibration
from sim.cost.operators import Efficiency, gemm_time
from sim.errors import ConfigError
from sim.kv.budget import GIB, kv_bytes_per_token, memory_budget
from sim.model.layout import PerGpu
from sim.model.weights import (
    parameter_count,
    pipeline_stages,
    stage_weight_bytes,
    weight_bytes_per_gpu,
)
from sim.records import LogHistogram
from sim.state import RequestTable

# 5 layers, so vLLM's split over 2 stages is uneven: [3, 2]
TINY = ModelConfig(name="tiny", num_hidden_layers=5, hidden_size=64, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, intermediate_size=128, vocab_size=1000)
SCHED = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256)
KV = KVCacheConfig(block_size=16, gpu_memory_utilization=0.5, other_memory_gib=0.0)
HW = HardwareConfig(hbm_bytes=4 * 2**20)


def test_stages_split_layers_as_vllm():
    stages = pipeline_stages(TINY, 2)
    assert [len(s.layers) for s in stages] == [3, 2]
    assert [(s.first, s.last) for s in stages] == [(True, False), (False, True)]
    assert stages[1].layers == range(3, 5)


def test_pipeline_memory_by_hand():
    attn = 64 * 64 + 2 * 64 * 2 * 16 + 64 * 64  # q, k, v (2 KV heads), o
    mlp = 3 * 64 * 128
    embed = 1000 * 64
    first = 2 * (3 * (attn + mlp) + 3 * 2 * 64 + embed)  # bf16: layers, norms, embedding
    last = 2 * (2 * (attn + mlp) + (2 * 2 + 1) * 64 + embed)  # final norm, LM head
    stages = pipeline_stages(TINY, 2)
    assert [stage_weight_bytes(TINY, 1, 1, s) for s in stages] == [first, last]
    assert weight_bytes_per_gpu(TINY, 1, pp=2) == first
    # the stages together hold the whole model once
    assert first + last == weight_bytes_per_gpu(TINY, 1) == 2 * parameter_count(TINY)

    per_layer_token = 2 * 2 * 16 * 2  # K and V of 2 heads of 16, bf16
    assert kv_bytes_per_token(TINY, KV, 1, pp=2) == 3 * per_layer_token
    usable = int(4 * 2**20 * 0.5)
    acts = 256 * (2 * 64 + (4 + 2 * 2) * 16 + 3 * 128) * 2  # hidden+residual, qkv, gate/up
    # only the last stage samples: the larger of the forward and the sampler's peak
    last_acts = max(acts, 8 * 1000 * 16)
    blocks = [(usable - first - acts) // (16 * 3 * per_layer_token),
              (usable - last - last_acts) // (16 * 2 * per_layer_token)]
    b = memory_budget(TINY, HW, SCHED, KV, 1, pp=2)
    assert b.num_gpu_blocks == min(blocks)  # vLLM: every stage gets the smallest count
    assert b.stage == int(np.argmin(blocks)) and b.pipeline_parallel_size == 2
    one = memory_budget(TINY, HW, SCHED, KV, 1)
    assert one.num_gpu_blocks == (usable - first - last - last_acts) // (
        16 * 5 * per_layer_token)
    assert b.num_gpu_blocks > 2 * one.num_gpu_blocks


def test_tied_embeddings_are_held_by_first_and_last_stage():
    tied = dataclasses.replace(TINY, tie_word_embeddings=True)
    embed = 2 * 1000 * 64
    one, two = (sum(stage_weight_bytes(tied, 1, 1, s) for s in pipeline_stages(tied, pp))
                for pp in (1, 2))
    assert two - one == embed


def test_stage_without_full_attention_is_refused():
    hybrid = dataclasses.replace(TINY, layer_types=["sliding_attention"] * 3
                                 + ["full_attention"] * 2, sliding_window=8)
    with pytest.raises(ConfigError, match="cluster.pipeline_parallel_size=2.*stage 0"):
        memory_budget(hybrid, HW, SCHED, KV, 1, pp=2)
    b = memory_budget(hybrid, HW, SCHED, KV, 1)
    assert b.state_bytes_per_request == 3 * 2 * 2 * 16 * 8 * 2


def test_shipped_models_split_into_stages_without_loss(compose_cfg):
    for name in ("deepseek_v3", "qwen3_next_80b_a3b", "gpt_oss_120b", "llama3_405b"):
        m = plain(compose_cfg(f"model={name}")).model
        whole = weight_bytes_per_gpu(m, 8)
        assert sum(stage_weight_bytes(m, 8, 1, s) for s in pipeline_stages(m, 4)) == whole
        assert weight_bytes_per_gpu(m, 8, pp=4) < whole / 3.5


def test_llama_405b_needs_two_stages_of_eight_h100(compose_cfg):
    tp8 = ("model=llama3_405b", "hardware=h100_sxm", "cluster.tensor_parallel_size=8")
    with pytest.raises(ConfigError, match="does not fit"):
        replica_memory_budget(plain(compose_cfg(*tp8)))
    b = replica_memory_budget(plain(compose_cfg(*tp8, "cluster.pipeline_parallel_size=2")))
    assert 45 < b.weight_bytes / GIB < 50  # 405.9e9 bf16 parameters over 16 GPUs
    assert b.stage == 1  # the last stage also holds the sampler's logits
    assert b.num_gpu_blocks * b.block_size > 100_000


@pytest.fixture
def tiny_table():
    n = 2
    return RequestTable(np.zeros(n), np.full(n, 16, np.int64), np.full(n, 4, np.int64))


def test_logged_blocks_match_the_replica(compose_cfg, caplog, tiny_table):
    cfg = compose_cfg("model=llama3_70b", "cluster.tensor_parallel_size=4",
                      "cluster.pipeline_parallel_size=2")
    meta = build_replica_parts(cfg, tiny_table, LogHistogram()).meta
    with caplog.at_level(logging.INFO, logger="sim"):
        log_memory_budgets(cfg)
    assert f"num_gpu_blocks={meta['num_gpu_blocks']} " in caplog.text
    assert "4×2" in caplog.text
    p = plain(cfg)
    pp1 = memory_budget(p.model, p.hardware, p.scheduler, p.kv_cache, 4)
    assert meta["num_gpu_blocks"] > pp1.num_gpu_blocks  # the pp-blind budget differed
    assert meta["pipeline_parallel_size"] == 2 and meta["state_blocks_per_request"] == 0
    assert meta["active_parameters"] == meta["parameters"] - 128256 * 8192  # dense: no embed


def test_meta_reports_expert_parallel_budget(compose_cfg, tiny_table):
    cfg = compose_cfg("model=qwen3_30b_a3b", "cluster.tensor_parallel_size=2",
                      "cluster.expert_parallel_size=2")
    meta = build_replica_parts(cfg, tiny_table, LogHistogram()).meta
    assert meta["num_gpu_blocks"] == replica_memory_budget(plain(cfg)).num_gpu_blocks
    assert 3.0e9 < meta["active_parameters"] < 3.5e9


MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
           shared_expert_intermediate_size=48, first_k_dense_replace=1)


def test_shared_experts_split_tensor_parallel_under_expert_parallelism():
    m = dataclasses.replace(TINY, **MOE)
    h = 64
    shared = 3 * h * 48
    # ep = 1: shared and routed experts split 2 ways; ep = 2: routed experts 4 whole per GPU,
    # the shared experts still split 2 ways (attention is tensor-parallel: all tokens on
    # every GPU, as the cost model prices them)
    routed_tp, routed_ep = 8 * 3 * h * 32 // 2, 4 * 3 * h * 32
    assert routed_tp == routed_ep  # same bytes, placed differently
    assert weight_bytes_per_gpu(m, 2, ep=2) == weight_bytes_per_gpu(m, 2)
    assert PerGpu.of(m, 2, 2, 2).shared_inter * 3 * h == shared // 2


def _model(dtype: str) -> ModelConfig:
    return dataclasses.replace(TINY, hidden_size=1024, num_attention_heads=8, head_dim=128,
                               intermediate_size=4096, dtype=dtype, **MOE)


def _cost(m: ModelConfig, eff: Efficiency, hw: HardwareConfig):
    return RooflineCostModel(m, hw, 1, 2, eff)


def _ops(model) -> dict:
    return {op.name: op for op in model.breakdown(np.array([64]), np.array([0]))}


@pytest.fixture(scope="module")
def h100_eff() -> Efficiency:
    return load_calibration("h100_sxm", "vllm")[0]


@pytest.fixture
def h100(compose_cfg) -> HardwareConfig:
    return plain(compose_cfg("hardware=h100_sxm")).hardware


def test_fp8_block_weights_take_one_byte():
    assert weight_bytes_per_gpu(_model("fp8_block"), 1) == weight_bytes_per_gpu(_model("fp8"), 1)
    assert weight_bytes_per_gpu(_model("fp8_block"), 1) < weight_bytes_per_gpu(
        _model("bfloat16"), 1)


def test_fp8_block_uses_its_own_efficiency(h100_eff, h100):
    assert "fp8_block" in h100_eff.gemm and "fp8_block" in h100_eff.moe
    hw = h100
    block = _ops(_cost(_model("fp8_block"), h100_eff, hw))
    fp8 = _ops(_cost(_model("fp8"), h100_eff, hw))
    op = block["qkv_proj"]
    n = (8 + 2 * 2) * 128
    t, _ = gemm_time(h100_eff.gemm["fp8_block"], 64, n, 1024, hw.fp8_flops, hw.hbm_bandwidth,
                     1, num_sms=hw.num_sms)
    assert op.count == 5 and op.time_s == pytest.approx(5 * float(t))  # one run per layer
    assert op.dtype == "fp8" and op.flops == fp8["qkv_proj"].flops
    assert op.bytes == fp8["qkv_proj"].bytes  # 1 byte per weight, like per-tensor FP8
    assert op.time_s != fp8["qkv_proj"].time_s
    assert block["experts"].time_s != fp8["experts"].time_s


def test_fp8_block_falls_back_to_fp8_then_refuses(h100_eff, h100):
    no_block = deepcopy(h100_eff)
    del no_block.gemm["fp8_block"], no_block.moe["fp8_block"]
    fallback = _ops(_cost(_model("fp8_block"), no_block, h100))
    fp8 = _ops(_cost(_model("fp8"), h100_eff, h100))
    assert fallback["qkv_proj"].time_s == fp8["qkv_proj"].time_s
    assert fallback["experts"].time_s == fp8["experts"].time_s
    del no_block.gemm["fp8"], no_block.moe["fp8"]
    with pytest.raises(ConfigError, match="model.dtype='fp8_block'.*fp8_block \\(nor fp8\\)"):
        _cost(_model("fp8_block"), no_block, h100)
    a100 = dataclasses.replace(h100, name="a100", fp8_flops=None)
    with pytest.raises(ConfigError, match="no FP8 tensor cores"):
        _cost(_model("fp8_block"), h100_eff, a100)


def test_deepseek_ships_block_scaled_fp8(compose_cfg):
    for name in ("deepseek_v3", "deepseek_r1"):
        m = plain(compose_cfg(f"model={name}")).model
        assert m.dtype == "fp8_block"
    with pytest.raises(ConfigError, match="kv_cache.dtype"):
        from sim.config import check_kv_cache

        check_kv_cache(dataclasses.replace(KV, dtype="fp8_block"))  # weights only
