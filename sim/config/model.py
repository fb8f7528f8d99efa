"""Schema and checks of ``model=``: a decoder's Hugging Face ``config.json`` fields."""

from __future__ import annotations

from dataclasses import dataclass

from sim.config.common import DTYPE_BYTES, positive
from sim.errors import ConfigError


@dataclass
class ModelConfig:
    """A decoder-only transformer, with the fields of its Hugging Face ``config.json``."""

    name: str = "???"
    hf_id: str = ""
    num_hidden_layers: int = 32
    hidden_size: int = 4096
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    head_dim: int = 128
    intermediate_size: int = 14336
    vocab_size: int = 128256
    max_position_embeddings: int = 131072
    tie_word_embeddings: bool = False
    dtype: str = "bfloat16"


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
