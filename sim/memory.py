"""GPU memory budget of one replica: weights, activations, and what is left for the KV cache.

Mirrors how vLLM sizes its cache: usable = total HBM × gpu_memory_utilization, minus the
weights, the peak activation memory of a forward pass over ``max_num_batched_tokens`` tokens,
and non-torch memory; the rest is divided into blocks of ``block_size`` tokens over all layers.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.config import (
    DTYPE_BYTES,
    HardwareConfig,
    KVCacheConfig,
    ModelConfig,
    SchedulerConfig,
)
from sim.errors import ConfigError

GIB = 1024**3


def parameter_count(m: ModelConfig) -> int:
    """Parameters of a dense Llama-style decoder (embeddings, attention, gated MLP, norms)."""
    h, d = m.hidden_size, m.head_dim
    attn = (
        h * (m.num_attention_heads + 2 * m.num_key_value_heads) * d + m.num_attention_heads * d * h
    )
    mlp = 3 * h * m.intermediate_size
    per_layer = attn + mlp + 2 * h
    embed = m.vocab_size * h
    lm_head = 0 if m.tie_word_embeddings else m.vocab_size * h
    return m.num_hidden_layers * per_layer + embed + lm_head + h


def weight_bytes_per_gpu(m: ModelConfig, tp: int) -> int:
    """Weight memory of one GPU of a ``tp``-way replica.

    Attention heads and the MLP are split ``tp`` ways; K/V heads are replicated when there are
    fewer of them than GPUs. The vocab-parallel embedding and LM head are split too and stay
    bf16 in FP8 checkpoints; norms are bf16.
    """
    h, d = m.hidden_size, m.head_dim
    q_heads, kv_heads = m.num_attention_heads // tp, max(1, m.num_key_value_heads // tp)
    linear = h * (q_heads + 2 * kv_heads) * d + q_heads * d * h + 3 * h * m.intermediate_size // tp
    vocab = (1 if m.tie_word_embeddings else 2) * m.vocab_size * h // tp
    norms = (2 * m.num_hidden_layers + 1) * h
    return m.num_hidden_layers * linear * DTYPE_BYTES[m.dtype] + (vocab + norms) * 2


def kv_dtype_bytes(model: ModelConfig, kv: KVCacheConfig) -> int:
    """Bytes per KV element: the model's activation dtype unless the cache sets its own.

    As vLLM's ``kv_cache_dtype=auto``: FP8 weights still run bf16 activations and KV cache.
    """
    if kv.dtype != "auto":
        return DTYPE_BYTES[kv.dtype]
    return DTYPE_BYTES["bfloat16" if model.dtype == "fp8" else model.dtype]


def kv_bytes_per_token(model: ModelConfig, kv: KVCacheConfig, tp: int) -> int:
    """K and V of one token over all layers, on one GPU of a ``tp``-way replica."""
    kv_heads = max(1, model.num_key_value_heads // tp)
    return 2 * model.num_hidden_layers * kv_heads * model.head_dim * kv_dtype_bytes(model, kv)


def activation_peak_bytes(model: ModelConfig, sched: SchedulerConfig, tp: int) -> int:
    """Peak activation memory of vLLM's profiling run, per GPU (an estimate).

    The widest live tensors of a forward pass over the full token budget: hidden state and
    residual, QKV output, gate/up output and its activation; plus fp32 logits for every
    sequence the sampler may see.
    """
    t = sched.max_num_batched_tokens
    h, d = model.hidden_size, model.head_dim
    qkv = (model.num_attention_heads + 2 * model.num_key_value_heads) * d // tp
    mlp = 3 * model.intermediate_size // tp
    per_token = (2 * h + qkv + mlp) * 2
    logits = sched.max_num_seqs * model.vocab_size * 4
    return t * per_token + logits


@dataclass(frozen=True)
class MemoryBudget:
    """Where one GPU's memory goes, and the KV cache that results."""

    usable_bytes: int
    weight_bytes: int
    activation_bytes: int
    other_bytes: int
    kv_cache_bytes: int
    block_bytes: int
    num_gpu_blocks: int
    block_size: int

    @property
    def max_tokens(self) -> int:
        """Tokens the cache can hold at once across all requests."""
        return self.num_gpu_blocks * self.block_size


def memory_budget(
    model: ModelConfig, hw: HardwareConfig, sched: SchedulerConfig, kv: KVCacheConfig, tp: int
) -> MemoryBudget:
    """Size the KV cache of one replica; refuses a model that does not fit."""
    usable = int(hw.hbm_bytes * kv.gpu_memory_utilization)
    weights = weight_bytes_per_gpu(model, tp)
    acts = activation_peak_bytes(model, sched, tp)
    other = int(kv.other_memory_gib * GIB)
    free = usable - weights - acts - other
    block_bytes = kv.block_size * kv_bytes_per_token(model, kv, tp)
    if free < 2 * block_bytes:  # the null block and at least one usable block
        raise ConfigError(
            "cluster.tensor_parallel_size",
            tp,
            f"model {model.name} does not fit: {weights / GIB:.1f} GiB weights + "
            f"{acts / GIB:.1f} GiB activations + {other / GIB:.1f} GiB other per GPU exceed "
            f"{usable / GIB:.1f} GiB usable ({hw.name}, gpu_memory_utilization="
            f"{kv.gpu_memory_utilization}); use more GPUs or a larger GPU",
        )
    return MemoryBudget(
        usable, weights, acts, other, free, block_bytes, free // block_bytes, kv.block_size
    )
