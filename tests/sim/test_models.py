"""The shipped model YAMLs against published figures, and their memory plans.

Parameter counts are checked against each model card. "Active" parameters follow each
vendor's own convention: DeepSeek and OpenAI leave the input embedding out (a lookup of one
row) but count the LM head; Qwen and Mistral count both embedding matrices.
"""

from __future__ import annotations

import math
from copy import deepcopy
from functools import cache
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

from sim.builders import plain
from sim.config import check_model
from sim.config.model import ModelConfig
from sim.errors import ConfigError
from sim.kv.budget import GIB, kv_bytes_per_token, memory_budget, state_bytes_per_request
from sim.model.weights import active_parameter_count, parameter_count, weight_bytes_per_gpu

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p.stem for p in (REPO / "conf" / "model").glob("*.yaml")
                 if "kind: diffusion" not in p.read_text())  # LLMs (pipelines: tests/sim/diffusion)

# total parameters from the model cards (MTP / draft modules excluded)
TOTAL = {
    "llama3_8b": 8.03e9, "llama3_70b": 70.6e9, "llama3_405b": 405.9e9, "qwen3_32b": 32.8e9,
    "mixtral_8x7b": 46.7e9, "qwen3_30b_a3b": 30.5e9, "qwen3_235b_a22b": 235e9,
    "gpt_oss_120b": 116.83e9, "deepseek_v3": 671e9, "deepseek_r1": 671e9,
    "qwen3_next_80b_a3b": 80e9, "minimax_m2": 230e9,
    "gemma2_2b": 2.61e9, "gemma2_9b": 9.24e9, "gemma2_27b": 27.2e9,  # tied embeddings
}
# active parameters (published, whether the card counts the input embedding)
ACTIVE = {
    "mixtral_8x7b": (12.9e9, True),
    "qwen3_235b_a22b": (22e9, True),
    "gpt_oss_120b": (5.13e9, False),
    "deepseek_v3": (37e9, False),  # README: 36.6B "including 0.9B for the output head"
    "deepseek_r1": (37e9, False),
}


@cache
def _composed(name: str):
    with initialize_config_module("conf", version_base=None):
        return plain(compose("config", overrides=[f"model={name}"]))


def _cfg(name: str):
    """The plain config groups of ``model=name`` (composed once per module; a copy)."""
    return deepcopy(_composed(name))


def _model(name: str) -> ModelConfig:
    return _cfg(name).model


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_yaml_is_valid_and_names_its_source(name):
    m = _model(name)
    check_model(m)
    header = (REPO / "conf" / "model" / f"{name}.yaml").read_text().split("defaults:")[0]
    assert m.name == name and m.hf_id in header and "config.json" in header
    assert m.architecture.endswith("ForCausalLM")


@pytest.mark.parametrize("name", sorted(TOTAL))
def test_total_parameters_match_model_cards(name):
    assert parameter_count(_model(name)) == pytest.approx(TOTAL[name], rel=0.015)


@pytest.mark.parametrize("name", sorted(ACTIVE))
def test_active_parameters_match_model_cards(name):
    published, with_embedding = ACTIVE[name]
    m = _model(name)
    assert active_parameter_count(m, with_embedding) == pytest.approx(published, rel=0.015)


def test_qwen3_30b_a3b_counts():
    """The card: 30.5B total, 29.9B non-embedding, 3.3B activated.

    By Qwen's convention (both embedding matrices counted) we get 3.353B: the card's 3.3B
    is that number cut to two digits (1.6% below), so check it at the card's precision.
    """
    m = _model("qwen3_30b_a3b")
    embeddings = 2 * m.vocab_size * m.hidden_size
    assert parameter_count(m) - embeddings == pytest.approx(29.9e9, rel=0.015)
    assert 3.3e9 <= active_parameter_count(m, count_embedding=True) < 3.4e9


def test_qwen3_next_active_parameters_by_hand():
    """The card's "3B activated" is the A3B label; the exact count from config.json:

    12 gated full-attention layers: q (2048 → 16·256·2), k and v (2048 → 2·256), o (4096 →
    2048); 36 Gated DeltaNet layers: in_proj_qkvz (2048 → 2·2048 + 2·4096), in_proj_ba
    (2048 → 64), conv (8192 × 4), A_log, dt_bias, norm (128), out_proj (4096 → 2048);
    48 MoE layers of 10 routed + 1 shared expert (3·2048·512 each) and a 2048 × 512 router.
    Without embedding and LM head that is 3.25B, which the label rounds to 3B.
    """
    m = _model("qwen3_next_80b_a3b")
    full = 2048 * 8192 + 2 * 2048 * 512 + 4096 * 2048
    linear = 2048 * 12288 + 2048 * 64 + 8192 * 4 + 2 * 32 + 128 + 4096 * 2048
    moe = 11 * 3 * 2048 * 512 + 2048 * 512
    norms = (2 * 48 + 1) * 2048
    lm_head = 151936 * 2048
    expected = 12 * full + 36 * linear + 48 * moe + norms + lm_head
    assert active_parameter_count(m) == expected
    assert round((expected - lm_head) / 1e9) == 3
    assert parameter_count(m) == pytest.approx(80e9, rel=0.015)


def test_minimax_m2_active_rounds_to_its_label():
    """MiniMax-M2: "230B total, 10B active" (labels); we count 9.8B without embeddings."""
    m = _model("minimax_m2")
    lm_head = m.vocab_size * m.hidden_size
    assert round((active_parameter_count(m) - lm_head) / 1e9) == 10


def test_mla_caches_one_latent_per_token_not_split_by_tp():
    cfg = _cfg("deepseek_v3")
    per_token = (512 + 64) * 61 * 2  # kv_lora_rank + qk_rope_head_dim, 61 layers, bf16
    assert per_token == 70_272
    for tp in (1, 8):
        assert kv_bytes_per_token(cfg.model, cfg.kv_cache, tp) == per_token
    assert state_bytes_per_request(cfg.model, cfg.kv_cache, 8) == 0


def test_gpt_oss_fixed_state_and_growing_kv_by_hand():
    """18 full layers grow; 18 sliding layers hold 128 tokens of K and V per request."""
    cfg = _cfg("gpt_oss_120b")
    m, kv = cfg.model, cfg.kv_cache
    per_layer_token = 2 * 8 * 64 * 2  # K and V, 8 KV heads, head dim 64, bf16
    assert kv_bytes_per_token(m, kv, 1) == 18 * per_layer_token
    assert state_bytes_per_request(m, kv, 1) == 18 * per_layer_token * 128
    b = memory_budget(m, cfg.hardware, cfg.scheduler, kv, 1)
    assert b.state_bytes_per_request == 18 * per_layer_token * 128
    # vLLM's sliding-window group of 18 layers keeps at most cdiv(127, 16) + 1 blocks
    assert (b.window_layers, b.block_layers, b.window_cap) == (18, 18, 9)
    assert b.state_blocks_per_request == 9
    assert b.weight_bytes < 64 * GIB  # MXFP4 experts: one H100 holds the model
    # engines that keep every token of a sliding layer: all 36 layers grow, no state
    for rule in ("sglang", "trtllm"):
        b = memory_budget(m, cfg.hardware, cfg.scheduler, kv, 1, rule=rule)
        assert b.block_bytes == 16 * 36 * per_layer_token and b.state_blocks_per_request == 0
    assert kv_bytes_per_token(m, kv, 1, sliding_full=True) == 36 * per_layer_token


def test_qwen3_next_fixed_state_and_growing_kv_by_hand():
    """tp = 4: 12 full layers grow; 36 Gated DeltaNet layers hold a fixed state."""
    cfg = _cfg("qwen3_next_80b_a3b")
    m, kv = cfg.model, cfg.kv_cache
    kv_per_token = 12 * 2 * 1 * 256 * 2  # 2 KV heads over 4 GPUs: one (replicated) each
    assert kv_bytes_per_token(m, kv, 4) == kv_per_token
    recurrent = 8 * 128 * 128  # 32 value heads / 4 GPUs, key dim × value dim
    conv = 3 * (2 * 4 * 128 + 8 * 128)  # kernel − 1 past inputs of q, k (4 heads), v (8)
    state = 36 * (recurrent + conv) * 2
    assert state_bytes_per_request(m, kv, 4) == state
    b = memory_budget(m, cfg.hardware, cfg.scheduler, kv, 4)
    assert b.state_blocks_per_request == math.ceil(state / (16 * kv_per_token)) == 51
    assert b.block_bytes == 16 * kv_per_token and b.num_gpu_blocks > 0


def test_405b_on_one_gpu_is_refused_with_the_message():
    cfg = _cfg("llama3_405b")
    with pytest.raises(ConfigError, match=r"cluster.tensor_parallel_size=1: model llama3_405b "
                                          r"does not fit: .* GiB weights"):
        memory_budget(cfg.model, cfg.hardware, cfg.scheduler, cfg.kv_cache, 1)


def test_deepseek_fp8_does_not_fit_eight_h100s():
    """671B FP8 weights (~627 GiB) exceed 8 × 80 GB at 0.9 utilization, as in practice."""
    cfg = _cfg("deepseek_v3")
    with pytest.raises(ConfigError, match="deepseek_v3 does not fit"):
        memory_budget(cfg.model, cfg.hardware, cfg.scheduler, cfg.kv_cache, 8)


def test_experts_split_over_expert_parallel_gpus():
    m = _model("qwen3_30b_a3b")
    expert = 3 * 2048 * 768 * 2  # one bf16 expert of one layer
    # ep = 4: 32 of the 128 experts per GPU, each whole
    assert weight_bytes_per_gpu(m, 1) - weight_bytes_per_gpu(m, 1, ep=4) == 48 * 96 * expert
    mixtral = _model("mixtral_8x7b")
    # 2 GPUs: 8 half experts (ep = 1) weigh as much as 4 whole ones (ep = 2)
    assert weight_bytes_per_gpu(mixtral, 2, ep=2) == weight_bytes_per_gpu(mixtral, 2)


def test_mxfp4_experts_weigh_4_25_bits():
    m = _model("gpt_oss_120b")
    experts = 36 * 128 * 3 * 2880 * 2880
    as_bf16 = ModelConfig(**{**vars(m), "moe_dtype": ""})
    assert weight_bytes_per_gpu(as_bf16, 1) - weight_bytes_per_gpu(m, 1) == pytest.approx(
        experts * (2 - 4.25 / 8), abs=1)


@pytest.mark.parametrize("change, field", [
    ({"layer_types": ["full_attention"] * 3}, "model.layer_types"),
    ({"layer_types": ["full_attention", "mamba"] * 16}, "model.layer_types"),
    ({"layer_types": ["linear_attention"] * 32}, "model.layer_types"),
    ({"layer_types": ["sliding_attention", "full_attention"] * 16}, "model.sliding_window"),
    ({"num_experts": 8, "num_experts_per_tok": 9, "moe_intermediate_size": 64},
     "model.num_experts_per_tok"),
    ({"num_experts": 8, "num_experts_per_tok": 2}, "model.moe_intermediate_size"),
    ({"moe_dtype": "int4"}, "model.moe_dtype"),
    ({"kv_lora_rank": 512}, "model.qk_nope_head_dim"),
])
def test_bad_architecture_fields_name_the_field(change, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        check_model(ModelConfig(name="bad", **change))
