"""Schema and checks of ``model=``: a decoder's Hugging Face ``config.json`` fields."""

from __future__ import annotations

from dataclasses import dataclass, fields

from sim.config.common import WEIGHT_DTYPE_BYTES, positive
from sim.config.diffusion_model import DiffusionPipelineConfig, check_diffusion_pipeline
from sim.errors import ConfigError

# per-layer lists are built, so a typo such as 1e12 layers is refused rather than allocated
MAX_LAYERS = 10_000
LAYER_KINDS = ("full_attention", "sliding_attention", "linear_attention")
# Bytes per routed-expert weight: the layer dtypes, plus OCP MXFP4 (4-bit values and one
# 8-bit scale per 32 of them = 4.25 bits), the format gpt-oss ships its experts in.
MOE_DTYPE_BYTES = {**WEIGHT_DTYPE_BYTES, "mxfp4": 4.25 / 8}


@dataclass
class ModelConfig:
    """A decoder-only transformer, with the fields of its Hugging Face ``config.json``.

    Dense GQA/MQA decoders need only the first block. The optional blocks describe mixture of
    experts, multi-head latent attention (MLA), sliding-window layers and hybrid
    linear-attention layers; their defaults mean "not present".
    """

    name: str = "???"
    hf_id: str = ""
    architecture: str = ""  # config.json "architectures"[0], e.g. LlamaForCausalLM
    # llm: a decoder served token by token; diffusion: an image/video pipeline whose
    # architecture is the ``diffusion`` block (sim.config.diffusion_model)
    kind: str = "llm"
    diffusion: DiffusionPipelineConfig | None = None
    num_hidden_layers: int = 32
    hidden_size: int = 4096
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    head_dim: int = 128
    intermediate_size: int = 14336
    vocab_size: int = 128256
    max_position_embeddings: int = 131072
    tie_word_embeddings: bool = False
    # weights of the transformer layers: bfloat16, float16, fp8 (per-tensor scales) or
    # fp8_block (128x128 block scales: quantization_config.weight_block_size)
    dtype: str = "bfloat16"
    attention_bias: bool = False  # q/k/v/o projections carry biases (gpt-oss, Qwen2)
    # q_proj also emits a sigmoid gate per head and channel (Qwen3-Next): twice as wide
    attn_output_gate: bool = False
    # ---- mixture of experts (num_experts = 0: dense MLP in every layer)
    num_experts: int = 0  # routed experts (HF num_local_experts / num_experts / n_routed_experts)
    num_experts_per_tok: int = 0  # top-k
    moe_intermediate_size: int = 0  # FFN size of one routed expert
    shared_expert_intermediate_size: int = 0  # FFN size of all shared experts together
    first_k_dense_replace: int = 0  # leading layers with a dense MLP (DeepSeek)
    # routed-expert weights when they differ from ``dtype`` ("" = same as dtype; e.g. mxfp4)
    moe_dtype: str = ""
    # ---- multi-head latent attention (kv_lora_rank = 0: ordinary attention)
    q_lora_rank: int = 0  # 0: queries projected directly from the hidden state
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # ---- per-layer kinds: full_attention, sliding_attention, linear_attention
    # (None: every layer full_attention)
    layer_types: list[str] | None = None
    sliding_window: int = 0  # keys a sliding_attention layer sees
    # ---- linear attention layers (Qwen3-Next Gated DeltaNet): fixed recurrent state
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0


def expert_dtype(m: ModelConfig) -> str:
    """The dtype the routed experts' weights are stored in."""
    return m.moe_dtype or m.dtype


def layer_kinds(m: ModelConfig) -> list[str]:
    """The kind of every layer (``layer_types``, or all full attention)."""
    return list(m.layer_types) if m.layer_types is not None else ["full_attention"] * (
        m.num_hidden_layers)


def _check_moe(m: ModelConfig) -> None:
    if m.moe_dtype and m.moe_dtype not in MOE_DTYPE_BYTES:
        raise ConfigError("model.moe_dtype", m.moe_dtype,
                          f"'' (same as dtype) or one of {sorted(MOE_DTYPE_BYTES)}")
    if not m.num_experts:
        return
    positive("model.moe_intermediate_size", m.moe_intermediate_size)
    if not 1 <= m.num_experts_per_tok <= m.num_experts:
        raise ConfigError("model.num_experts_per_tok", m.num_experts_per_tok,
                          f"must be in [1, num_experts={m.num_experts}]")
    if m.first_k_dense_replace > m.num_hidden_layers:
        raise ConfigError("model.first_k_dense_replace", m.first_k_dense_replace,
                          f"must be <= num_hidden_layers={m.num_hidden_layers}")


def _check_layers(m: ModelConfig) -> None:
    if m.kv_lora_rank:
        for f in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            positive(f"model.{f}", getattr(m, f))
    if m.layer_types is None:
        return
    kinds = list(m.layer_types)
    if len(kinds) != m.num_hidden_layers:
        raise ConfigError("model.layer_types", f"{len(kinds)} entries",
                          f"one per layer (num_hidden_layers={m.num_hidden_layers})")
    unknown = sorted(set(kinds) - set(LAYER_KINDS))
    if unknown:
        raise ConfigError("model.layer_types", unknown[0], f"each one of {list(LAYER_KINDS)}")
    if "full_attention" not in kinds:
        # the paged KV cache is sized per token of the full-attention layers
        raise ConfigError("model.layer_types", "no full_attention layer",
                          "at least one full_attention layer")
    if "sliding_attention" in kinds:
        positive("model.sliding_window", m.sliding_window)
    if "linear_attention" in kinds:
        for f in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                  "linear_value_head_dim", "linear_conv_kernel_dim"):
            positive(f"model.{f}", getattr(m, f))


MODEL_KINDS = ("llm", "diffusion")


def check_model(m: ModelConfig) -> None:
    """Range checks of a model's architecture fields."""
    if m.kind not in MODEL_KINDS:
        raise ConfigError("model.kind", m.kind, f"one of {list(MODEL_KINDS)}")
    if m.kind == "diffusion":
        if m.diffusion is None:
            raise ConfigError("model.diffusion", None, "a pipeline block (kind: diffusion)")
        check_diffusion_pipeline(m.diffusion)
    for f in fields(ModelConfig):
        v = getattr(m, f.name)
        if isinstance(v, int) and not isinstance(v, bool) and v < 0:  # 0: block absent
            raise ConfigError(f"model.{f.name}", v, "must be >= 0")
    for f in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
              "head_dim", "intermediate_size", "vocab_size", "max_position_embeddings"):
        positive(f"model.{f}", getattr(m, f))
    if m.num_hidden_layers > MAX_LAYERS:
        raise ConfigError("model.num_hidden_layers", m.num_hidden_layers,
                          f"must be <= {MAX_LAYERS} (the largest models have a few hundred)")
    if m.num_attention_heads % m.num_key_value_heads:
        raise ConfigError("model.num_key_value_heads", m.num_key_value_heads,
                          f"must divide num_attention_heads={m.num_attention_heads}")
    if m.dtype not in WEIGHT_DTYPE_BYTES:
        raise ConfigError("model.dtype", m.dtype, f"one of {sorted(WEIGHT_DTYPE_BYTES)}")
    _check_moe(m)
    _check_layers(m)


# (group, schema name, dataclass) registered with Hydra by ``conf.schema``
SCHEMAS = [
    ("model", "base_model", ModelConfig),
]
