"""Qwen3-8B, Qwen3-14B, gpt-oss-20b, GLM-4.5-Air and GLM-4.6: their YAMLs compose, match the
config.json each was copied from, and count the parameters of their model cards.

The config.json dicts below are the files named in each YAML's header (the gpt-oss
``layer_types`` list written as a product; its 24 entries alternate, sliding first).
"""

from __future__ import annotations

import json
from copy import deepcopy
from functools import cache
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

import conf.schema  # noqa: F401  (registers the config schemas)
from sim.builders import plain
from sim.config import check_model
from sim.config.model import ModelConfig
from sim.errors import ConfigError
from sim.hf_config import model_fields, read_hf_config
from sim.model.weights import active_parameter_count, parameter_count

REPO = Path(__file__).resolve().parents[2]

# github.com/ai-dynamo/aiconfigurator 095f58a,
# aic-core/src/aiconfigurator_core/model_configs/Qwen--Qwen3-8B_config.json
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12288,
    "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
    "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False,
    "vocab_size": 151936,
}
# github.com/citsjtu2020/LLM-Prof 8434c8d, sglang/Model_Config.md, section "Qwen3-14B"
QWEN3_14B = {
    **QWEN3_8B, "hidden_size": 5120, "intermediate_size": 17408, "max_window_layers": 40,
    "num_attention_heads": 40, "num_hidden_layers": 40,
}
# github.com/ai-dynamo/aiconfigurator 095f58a,
# aic-core/src/aiconfigurator_core/model_configs/openai--gpt-oss-20b_config.json
GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
    "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02,
    "intermediate_size": 2880, "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64,
    "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8,
    "num_local_experts": 32, "output_router_logits": False, "pad_token_id": 199999,
    "quantization_config": {
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                   "model.embed_tokens", "lm_head"],
        "quant_method": "mxfp4"},
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                     "original_max_position_embeddings": 4096, "rope_type": "yarn",
                     "truncate": False},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128,
    "swiglu_limit": 7.0, "tie_word_embeddings": False, "transformers_version": "4.55.0.dev0",
    "use_cache": True, "vocab_size": 201088,
}
# github.com/triple-mu/aiconfigurator ba4dfe3,
# src/aiconfigurator/model_configs/zai-org--GLM-4.5-Air_config.json
GLM_45_AIR = {
    "architectures": ["Glm4MoeForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
    "pad_token_id": 151329, "eos_token_id": [151329, 151336, 151338], "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 4096, "partial_rotary_factor": 0.5,
    "initializer_range": 0.02, "intermediate_size": 10944, "max_position_embeddings": 131072,
    "model_type": "glm4_moe", "moe_intermediate_size": 1408, "norm_topk_prob": True,
    "num_attention_heads": 96, "n_group": 1, "topk_group": 1, "n_routed_experts": 128,
    "n_shared_experts": 1, "routed_scaling_factor": 1.0, "num_experts_per_tok": 8,
    "first_k_dense_replace": 1, "num_hidden_layers": 46, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 1000000,
    "num_nextn_predict_layers": 1, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.54.0", "use_cache": True, "use_qk_norm": False,
    "vocab_size": 151552,
}

# github.com/ai-dynamo/aiconfigurator a0ba9ec,
# src/aiconfigurator/model_configs/zai-org--GLM-4.7-FP8_config.json (glm46.yaml's source),
# with attention_bias from THUDM slime's --add-qkv-bias for the same architecture
GLM_46 = {
    "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "num_hidden_layers": 92,
    "hidden_size": 5120, "num_attention_heads": 96, "num_key_value_heads": 8, "head_dim": 128,
    "intermediate_size": 12288, "vocab_size": 151552, "max_position_embeddings": 202752,
    "n_routed_experts": 160, "n_shared_experts": 1, "num_experts_per_tok": 8,
    "moe_intermediate_size": 1536, "first_k_dense_replace": 3, "routed_scaling_factor": 2.5,
    "torch_dtype": "bfloat16", "use_cache": True, "tie_word_embeddings": False,
    "attention_bias": True,
}
GLM = {"glm45_air": GLM_45_AIR, "glm46": GLM_46}

# total parameters from the model cards (MTP layers excluded)
PUBLISHED_TOTAL = {
    "qwen3_8b": 8.2e9,
    "qwen3_14b": 14.8e9,
    "gpt_oss_20b": 21e9,
    "glm45_air": 106e9,
    "glm46": 355e9,
}
READABLE = {"qwen3_8b": QWEN3_8B, "qwen3_14b": QWEN3_14B, "gpt_oss_20b": GPT_OSS_20B}


@cache
def _composed(name: str):
    with initialize_config_module("conf", version_base=None):
        return compose("config", overrides=[f"model={name}"])


def _model(name: str) -> ModelConfig:
    return deepcopy(plain(_composed(name)).model)


@pytest.mark.parametrize("name", sorted(PUBLISHED_TOTAL))
def test_yaml_composes_and_names_its_source(name):
    m = _model(name)
    check_model(m)
    header = (REPO / "conf" / "model" / f"{name}.yaml").read_text().split("defaults:")[0]
    assert m.name == name and m.hf_id and m.hf_id in header and "config.json" in header


@pytest.mark.parametrize("name", sorted(PUBLISHED_TOTAL))
def test_total_parameters_within_3_percent_of_the_model_card(name):
    assert parameter_count(_model(name)) == pytest.approx(PUBLISHED_TOTAL[name], rel=0.03)


@pytest.mark.parametrize("name", sorted(READABLE))
def test_config_json_reads_to_exactly_the_yaml(name, tmp_path):
    """sim.hf_config reads the source config.json into the YAML's fields, field for field."""
    from_yaml = OmegaConf.to_object(_composed(name).model)
    from_json = ModelConfig(**{**model_fields(READABLE[name], name=name),
                               "hf_id": from_yaml.hf_id})
    assert from_json == from_yaml
    path = tmp_path / name / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(READABLE[name]))
    assert read_hf_config(str(path))["num_hidden_layers"] == from_yaml.num_hidden_layers


@pytest.mark.parametrize("name", sorted(GLM))
def test_glm_fields_map_their_config_json(name):
    """No Glm4MoeForCausalLM reader exists: check the YAML against the file by hand,
    with DeepSeek-V3's mapping of the MoE names."""
    c, m = GLM[name], _model(name)
    assert m.architecture == c["architectures"][0]
    for f in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
              "head_dim", "intermediate_size", "vocab_size", "max_position_embeddings",
              "tie_word_embeddings", "attention_bias", "num_experts_per_tok",
              "moe_intermediate_size", "first_k_dense_replace"):
        assert getattr(m, f) == c[f], f
    assert m.num_experts == c["n_routed_experts"]
    assert m.shared_expert_intermediate_size == (c["n_shared_experts"]
                                                 * c["moe_intermediate_size"])
    assert m.dtype == c["torch_dtype"] and not m.moe_dtype
    assert m.layer_types is None and m.kv_lora_rank == 0  # GQA in every layer
    with pytest.raises(ConfigError, match="supported architectures"):
        model_fields(c, name)


def test_gpt_oss_20b_active_parameters_match_the_card():
    """The card: 21B total, 3.6B active (OpenAI's count: LM head in, input embedding out)."""
    assert active_parameter_count(_model("gpt_oss_20b")) == pytest.approx(3.6e9, rel=0.03)


def test_glm45_air_active_parameters_are_12b():
    """The card's "12B active": 8 routed + 1 shared expert, attention, the dense layer, the
    norms and routers come to 12.2B without embeddings; the LM head makes it 12.8B."""
    m = _model("glm45_air")
    lm_head = m.vocab_size * m.hidden_size
    assert round((active_parameter_count(m) - lm_head) / 1e9) == 12


def test_glm46_active_parameters_are_32b():
    """GLM-4.5's card (the same architecture): 355B total, 32B active; without the LM head
    (0.8B) the count is 32B too."""
    m = _model("glm46")
    lm_head = m.vocab_size * m.hidden_size
    assert round((active_parameter_count(m) - lm_head) / 1e9) == 32
