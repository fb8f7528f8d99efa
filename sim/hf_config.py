"""Read a local Hugging Face ``config.json`` into ``ModelConfig`` fields (never downloads).

Each supported architecture (``architectures[0]``) maps its own config names onto the
schema: e.g. Mixtral's ``num_local_experts`` and DeepSeek's ``n_routed_experts`` both become
``num_experts``; Qwen3-Next's ``full_attention_interval`` becomes ``layer_types``.
Multi-token-prediction modules (DeepSeek ``num_nextn_predict_layers``, MiniMax ``use_mtp``)
are not part of the served model and are ignored.
"""

from __future__ import annotations

import json
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from sim.config.model import MAX_LAYERS, ModelConfig
from sim.errors import ConfigError

QWEN_NEXT = "Qwen3NextForCausalLM"


def _common(c: dict) -> dict[str, Any]:
    """Fields every supported decoder names the same way (Llama's names)."""
    heads = c["num_attention_heads"]
    return {
        "num_hidden_layers": c["num_hidden_layers"],
        "hidden_size": c["hidden_size"],
        "num_attention_heads": heads,
        "num_key_value_heads": c.get("num_key_value_heads") or heads,
        "head_dim": c.get("head_dim") or c["hidden_size"] // heads,
        "intermediate_size": c["intermediate_size"],
        "vocab_size": c["vocab_size"],
        "max_position_embeddings": c["max_position_embeddings"],
        "tie_word_embeddings": bool(c.get("tie_word_embeddings", False)),
        "attention_bias": bool(c.get("attention_bias", False)),
        **_dtypes(c),
        **_layer_types(c),
    }


def _dtypes(c: dict) -> dict[str, str]:
    """``dtype`` (and ``moe_dtype``) from ``torch_dtype`` and ``quantization_config``."""
    torch_dtype = c.get("torch_dtype") or c.get("dtype") or "bfloat16"
    # as vLLM's dtype=auto: float32 checkpoints are served in float16
    dtype = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float16"}.get(torch_dtype)
    if dtype is None:
        raise ConfigError("model", f"torch_dtype={torch_dtype}", "bfloat16, float16 or float32")
    q = c.get("quantization_config")
    if not q:
        return {"dtype": dtype}
    method = str(q.get("quant_method", "")).lower()
    weights = (q.get("config_groups") or {}).get("group_0", {}).get("weights", {})
    if (method == "fp8" or str(q.get("quant_algo", "")).upper() == "FP8"
            or (method == "compressed-tensors" and weights.get("num_bits") == 8
                and weights.get("type") == "float")):
        # 128×128 block scales (DeepSeek-V3/R1, MiniMax-M2) run their own, slower kernels
        block = q.get("weight_block_size") or weights.get("strategy") == "block"
        return {"dtype": "fp8_block" if block else "fp8"}
    if method == "mxfp4":  # gpt-oss: experts in MXFP4, attention/router/embeddings bf16
        return {"dtype": dtype, "moe_dtype": "mxfp4"}
    raise ConfigError("model", f"quantization_config.quant_method={method or q}",
                      "fp8 or mxfp4 checkpoints (or none)")


def _layer_types(c: dict) -> dict[str, Any]:
    """``layer_types`` and ``sliding_window``; all-full models keep ``layer_types`` None."""
    n = c["num_hidden_layers"]
    kinds = c.get("layer_types")
    if kinds is None and c.get("full_attention_interval"):
        k = c["full_attention_interval"]
        kinds = ["linear_attention" if (i + 1) % k else "full_attention" for i in range(n)]
    elif kinds is None and c.get("use_sliding_window") and c.get("sliding_window"):
        start = c.get("max_window_layers", 0)  # Qwen2/3: layers from here on slide
        kinds = ["sliding_attention" if i >= start else "full_attention" for i in range(n)]
    elif kinds is None and c.get("sliding_window") and "use_sliding_window" not in c:
        kinds = ["sliding_attention"] * n  # Mistral/Mixtral style: every layer slides
    if kinds is None or set(kinds) == {"full_attention"}:
        return {}
    return {"layer_types": list(kinds), "sliding_window": int(c.get("sliding_window") or 0)}


def _moe_layers_all(c: dict, name: str) -> None:
    """Refuse MoE layouts other than "every layer from the first MoE one on"."""
    if c.get("mlp_only_layers") or c.get("decoder_sparse_step", 1) != 1:
        raise ConfigError("model", name, "MoE in every layer (mlp_only_layers = [], "
                          "decoder_sparse_step = 1)")


def _dense(c: dict, name: str) -> dict[str, Any]:
    out = _common(c)
    if c["architectures"][0] == "Qwen2ForCausalLM":
        out["attention_bias"] = True  # Qwen2 always has q/k/v biases
    return out


def _mixtral(c: dict, name: str) -> dict[str, Any]:
    return {**_common(c), "num_experts": c["num_local_experts"],
            "num_experts_per_tok": c["num_experts_per_tok"],
            "moe_intermediate_size": c["intermediate_size"]}


def _qwen_moe(c: dict, name: str) -> dict[str, Any]:
    _moe_layers_all(c, name)
    out = {**_common(c), "num_experts": c["num_experts"],
           "num_experts_per_tok": c["num_experts_per_tok"],
           "moe_intermediate_size": c["moe_intermediate_size"],
           "shared_expert_intermediate_size": c.get("shared_expert_intermediate_size", 0)}
    if c["architectures"][0] == QWEN_NEXT:
        out.update(attn_output_gate=True,  # Qwen3-Next's gated attention, implied by the class
                   **{f: c[f] for f in ("linear_num_key_heads", "linear_num_value_heads",
                                        "linear_key_head_dim", "linear_value_head_dim",
                                        "linear_conv_kernel_dim")})
    return out


def _deepseek_v3(c: dict, name: str) -> dict[str, Any]:
    if c.get("moe_layer_freq", 1) != 1:
        raise ConfigError("model", name, "MoE in every layer after first_k_dense_replace "
                          "(moe_layer_freq = 1)")
    return {**_common(c), "head_dim": c["qk_nope_head_dim"] + c["qk_rope_head_dim"],
            "num_experts": c["n_routed_experts"],
            "num_experts_per_tok": c["num_experts_per_tok"],
            "moe_intermediate_size": c["moe_intermediate_size"],
            "shared_expert_intermediate_size": c.get("n_shared_experts", 0)
            * c["moe_intermediate_size"],
            "first_k_dense_replace": c.get("first_k_dense_replace", 0),
            "q_lora_rank": c.get("q_lora_rank") or 0,
            **{f: c[f] for f in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                                 "v_head_dim")}}


def _gpt_oss(c: dict, name: str) -> dict[str, Any]:
    c = {**c, "layer_types": c.get("layer_types") or [
        "sliding_attention" if (i + 1) % 2 else "full_attention"
        for i in range(c["num_hidden_layers"])]}
    return {**_common(c), "num_experts": c["num_local_experts"],
            "num_experts_per_tok": c.get("num_experts_per_tok") or c["experts_per_token"],
            "moe_intermediate_size": c["intermediate_size"]}


def _gemma2(c: dict, name: str) -> dict[str, Any]:
    """Gemma-2: layers alternate sliding-window and full attention, the first sliding
    (transformers' ``Gemma2Config.layer_types``); embeddings tied by default; served in
    bfloat16 when the file says float32 (vLLM's ``_FLOAT16_NOT_SUPPORTED_MODELS``: float16 is
    numerically unstable for it)."""
    c = {**c, "layer_types": c.get("layer_types") or [
        "sliding_attention" if (i + 1) % 2 else "full_attention"
        for i in range(c["num_hidden_layers"])]}
    out = {**_common(c), "tie_word_embeddings": bool(c.get("tie_word_embeddings", True))}
    if (c.get("torch_dtype") or c.get("dtype")) == "float32":
        out["dtype"] = "bfloat16"
    return out


def _minimax_m2(c: dict, name: str) -> dict[str, Any]:
    return {**_common(c), "num_experts": c["num_local_experts"],
            "num_experts_per_tok": c["num_experts_per_tok"],
            "moe_intermediate_size": c["intermediate_size"],
            "shared_expert_intermediate_size": c.get("shared_intermediate_size", 0)}


READERS = {
    "LlamaForCausalLM": _dense,
    "MistralForCausalLM": _dense,  # Llama-shaped; a set sliding_window slides every layer
    "Qwen2ForCausalLM": _dense,
    "Qwen3ForCausalLM": _dense,
    "MixtralForCausalLM": _mixtral,
    "Qwen3MoeForCausalLM": _qwen_moe,
    QWEN_NEXT: _qwen_moe,
    "DeepseekV3ForCausalLM": _deepseek_v3,
    "GptOssForCausalLM": _gpt_oss,
    "Gemma2ForCausalLM": _gemma2,
    "MiniMaxM2ForCausalLM": _minimax_m2,
}


def model_fields(config: dict, name: str, hf_id: str = "") -> dict[str, Any]:
    """Every ``ModelConfig`` field of a parsed ``config.json`` (absent blocks at defaults)."""
    archs = config.get("architectures") or []
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else ""
    if arch not in READERS:
        raise ConfigError("model", f"{name} (architectures={archs})",
                          f"one of the supported architectures: {', '.join(READERS)}")
    layers = config.get("num_hidden_layers")
    if isinstance(layers, int) and layers > MAX_LAYERS:  # before any per-layer list is built
        raise ConfigError("model", f"{name} (num_hidden_layers={layers})",
                          f"at most {MAX_LAYERS} layers")
    try:
        read = READERS[arch](config, name)
    except ConfigError:
        raise
    except KeyError as e:
        raise ConfigError("model", name, f"a config.json with {e.args[0]!r} ({arch})") from None
    except (TypeError, ValueError, AttributeError, ZeroDivisionError) as e:
        # a field of the wrong type or value, e.g. "num_attention_heads": null or 0
        raise ConfigError("model", name, f"a config.json whose {arch} fields have their usual "
                          f"types and values ({type(e).__name__}: {e})") from None
    out = {f.name: f.default for f in fields(ModelConfig)}
    out.update(name=name, hf_id=hf_id or config.get("_name_or_path", ""), architecture=arch)
    out.update(read)
    return out


def config_path(value: str) -> Path:
    """The ``config.json`` a ``model=`` value points to (a file, or a folder holding one)."""
    path = Path(value).expanduser()
    return path / "config.json" if path.is_dir() else path


def read_hf_config(value: str) -> dict[str, Any]:
    """``ModelConfig`` fields of the local Hugging Face ``config.json`` at ``value``.

    The model's name is its folder's name (or the file's stem if not ``config.json``).
    """
    path = config_path(value)
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError("model", value, f"a readable config.json ({e.strerror or e})") from None
    except json.JSONDecodeError as e:
        raise ConfigError("model", value, f"valid JSON (line {e.lineno}: {e.msg})") from None
    except RecursionError:
        raise ConfigError("model", value, "JSON nested less deeply (too deep for Python's "
                          "parser)") from None
    except ValueError:  # the only other error of json.loads: Python's cap on integer digits
        raise ConfigError("model", value, f"integers of at most {sys.get_int_max_str_digits()} "
                          "digits (Python's parser limit)") from None
    if not isinstance(config, dict):
        raise ConfigError("model", value, "a JSON object")
    name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    return model_fields(config, name)
