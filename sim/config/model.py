"""Schema and checks of ``model=``: a decoder's Hugging Face ``config.json`` fields."""

from __future__ import annotations

from dataclasses import dataclass

from sim.config.common import DTYPE_BYTES, positive
from sim.errors import ConfigError


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
    num_hidden_layers: int = 32
    hidden_size: int = 4096
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    head_dim: int = 128
    intermediate_size: int = 14336
    vocab_size: int = 128256
    max_position_embeddings: int = 131072
    tie_word_embeddings: bool = False
    dtype: str = "bfloat16"  # weights of the transformer layers (bfloat16, float16, fp8)
    # ---- mixture of experts (num_experts = 0: dense MLP in every layer)
    num_experts: int = 0  # routed experts (HF num_local_experts / num_experts / n_routed_experts)
    num_experts_per_tok: int = 0  # top-k
    moe_intermediate_size: int = 0  # FFN size of one routed expert
    shared_expert_intermediate_size: int = 0  # FFN size of all shared experts together
    first_k_dense_replace: int = 0  # leading layers with a dense MLP (DeepSeek)
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


def check_model(m: ModelConfig) -> None:
    """Range checks of a model's architecture fields."""
    for f in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
              "head_dim", "intermediate_size", "vocab_size", "max_position_embeddings"):
        positive(f"model.{f}", getattr(m, f))
    if m.num_attention_heads % m.num_key_value_heads:
        raise ConfigError("model.num_key_value_heads", m.num_key_value_heads,
                          f"must divide num_attention_heads={m.num_attention_heads}")
    if m.dtype not in DTYPE_BYTES:
        raise ConfigError("model.dtype", m.dtype, f"one of {sorted(DTYPE_BYTES)}")


# (group, schema name, dataclass) registered with Hydra by ``sim.app``
SCHEMAS = [
    ("model", "base_model", ModelConfig),
]
