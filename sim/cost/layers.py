"""Operators whose cost depends only on a step's token and sequence counts, per GPU.

One run each (callers scale by the layers of a kind):

- **Attention side of a softmax layer** (full or sliding). GQA: ``qkv_proj`` (twice the query
  width with Qwen3-Next's output gate), ``o_proj``, the residual add + RMSNorm and rotary
  kernels (plus the sigmoid gate), and the write of the new tokens' K and V into the paged
  cache. MLA: ``q_kv_a_proj`` (the fused, replicated down-projections of queries and of the
  compressed KV + rope key; ``q_proj`` and ``kv_a_proj`` when ``q_lora_rank = 0``),
  ``q_b_proj``, ``o_proj``, add + norms + rotary, and the latent cache write.
- **Gated DeltaNet layer**: ``in_proj_qkvz`` and ``in_proj_ba`` GEMMs, the short causal
  depthwise convolution (reading and writing each sequence's conv state), the gated RMSNorm
  and q/k L2 norms, and ``out_proj``.
- **Dense MLP**: ``gate_up_proj``, ``down_proj``, add + RMSNorm and SiLU·mul.
- **MoE block**: see ``sim.cost.moe``.
- With ``tp > 1`` each attention/linear layer and each dense MLP ends in an all-reduce of
  ``T·hidden`` bf16 activations over NVLink.
- **Head** (once per step): the vocab-parallel embedding (and its all-reduce), the final
  norm, the LM head over one position per sequence (bf16, as FP8 checkpoints keep it), the
  logits all-gather and the sampler.
"""

from __future__ import annotations

from sim.config import HardwareConfig
from sim.cost.base import OperatorCost
from sim.cost.moe import moe_ops
from sim.cost.pricing import ACT_BYTES, Pricer
from sim.model.layout import PerGpu


def _allreduce(p: Pricer, g: PerGpu, hw: HardwareConfig, T: int) -> list[OperatorCost]:
    if g.tp == 1:
        return []
    return [p.comm("tp_allreduce", "allreduce", T * g.hidden * ACT_BYTES, g.tp,
                   hw.nvlink_bandwidth)]


def softmax_attention_ops(p: Pricer, g: PerGpu, hw: HardwareConfig, T: int) -> list[OperatorCost]:
    """Projections, norms and cache write of one full or sliding attention layer."""
    h, dt = g.hidden, g.layer_dtype
    if g.mla:
        r, rope, heads = g.kv_lora_rank, g.qk_rope_dim, g.heads
        q_out = heads * (g.qk_nope_dim + rope)
        if g.q_lora_rank:
            ops = [p.gemm("q_kv_a_proj", T, g.q_lora_rank + r + rope, h, dt),
                   p.gemm("q_b_proj", T, q_out, g.q_lora_rank, dt)]
        else:
            ops = [p.gemm("q_proj", T, q_out, h, dt), p.gemm("kv_a_proj", T, r + rope, h, dt)]
        ops += [
            p.gemm("o_proj", T, h, heads * g.v_head_dim, dt),
            p.elementwise("attn_norm_rope", ACT_BYTES * T * (
                4 * h + 2 * g.q_lora_rank + 2 * r + 2 * (heads + 1) * rope),
                4 if g.q_lora_rank else 3),
            p.elementwise("kv_cache_write", T * (r + rope) * (ACT_BYTES + g.kv_bytes), 1),
        ]
        return ops + _allreduce(p, g, hw, T)
    d, heads, kv_heads = g.head_dim, g.heads, g.kv_heads
    gate = heads * d if g.output_gate else 0
    return [
        p.gemm("qkv_proj", T, heads * d + gate + 2 * kv_heads * d, h, dt),
        p.gemm("o_proj", T, h, heads * d, dt),
        p.elementwise("attn_norm_rope", ACT_BYTES * T * (
            4 * h + 2 * (heads + kv_heads) * d + 3 * gate), 3 if gate else 2),
        p.elementwise("kv_cache_write", T * 2.0 * kv_heads * d * (ACT_BYTES + g.kv_bytes), 1),
    ] + _allreduce(p, g, hw, T)


def linear_attention_ops(p: Pricer, g: PerGpu, hw: HardwareConfig, T: int,
                         S: int) -> list[OperatorCost]:
    """Projections, convolution and norms of one Gated DeltaNet layer."""
    h, dt = g.hidden, g.layer_dtype
    hk, hv, dk, dv = g.lin_key_heads, g.lin_value_heads, g.lin_key_dim, g.lin_value_dim
    channels = 2 * hk * dk + hv * dv  # q, k, v go through the convolution
    conv = ACT_BYTES * (2 * T * channels + channels * g.lin_conv
                        + 2 * S * channels * (g.lin_conv - 1))
    return [
        p.gemm("linear_qkvz_proj", T, 2 * hk * dk + 2 * hv * dv, h, dt),
        p.gemm("linear_ba_proj", T, 2 * hv, h, dt),
        p.elementwise("linear_conv", conv, 1),
        p.elementwise("linear_norm_gate", ACT_BYTES * T * (4 * h + 3 * hv * dv + 4 * hk * dk), 3),
        p.gemm("linear_out_proj", T, h, hv * dv, dt),
    ] + _allreduce(p, g, hw, T)


def dense_mlp_ops(p: Pricer, g: PerGpu, hw: HardwareConfig, T: int) -> list[OperatorCost]:
    """GEMMs, norm and activation of one dense gated MLP."""
    h, dt = g.hidden, g.layer_dtype
    return [
        p.gemm("gate_up_proj", T, 2 * g.inter, h, dt),
        p.gemm("down_proj", T, h, g.inter, dt),
        p.elementwise("mlp_norm_act", ACT_BYTES * T * (4 * h + 3 * g.inter), 2),
    ] + _allreduce(p, g, hw, T)


def layer_token_ops(p: Pricer, g: PerGpu, hw: HardwareConfig, T: int,
                    S: int) -> dict[str, list[OperatorCost]]:
    """One layer's token-count operators for each layer kind of ``layout.LayerCounts``."""
    attn = softmax_attention_ops(p, g, hw, T)
    ops = {"full": attn, "sliding": attn, "dense": dense_mlp_ops(p, g, hw, T)}
    if g.lin_value_heads:
        ops["linear"] = linear_attention_ops(p, g, hw, T, S)
    if g.num_experts:
        ops["moe"] = moe_ops(p, g, hw, T)
    return ops


def head_token_ops(p: Pricer, g: PerGpu, hw: HardwareConfig, T: int) -> list[OperatorCost]:
    """The step's operators outside the layers that scale with its ``T`` tokens, in step
    order: embedding (and its all-reduce), final norm."""
    h = g.hidden
    return ([p.elementwise("embedding", ACT_BYTES * T * h * 2, 1)] + _allreduce(p, g, hw, T)
            + [p.elementwise("final_norm", ACT_BYTES * T * 2 * h, 1)])


def head_seq_ops(p: Pricer, g: PerGpu, hw: HardwareConfig, S: int) -> list[OperatorCost]:
    """The step's operators after the final norm, which scale with its ``S`` sampled
    sequences: LM head, sampler (and the logits' all-gather)."""
    h, V = g.hidden, g.vocab
    ops = [
        p.gemm("lm_head", S, V // g.tp, h, "bfloat16"),
        p.elementwise("sampler", 2.0 * S * V * 4, 2),
    ]
    if g.tp > 1:
        ops.append(p.comm("logits_allgather", "allgather", S * V * ACT_BYTES, g.tp,
                          hw.nvlink_bandwidth))
    return ops


def head_ops(p: Pricer, g: PerGpu, hw: HardwareConfig, T: int,
             S: int) -> tuple[list[OperatorCost], list[OperatorCost]]:
    """Operators before the first layer and after the last one, for the whole step: the
    token-count ones come first, so summing them in order sums those of each kind apart."""
    tokens = head_token_ops(p, g, hw, T)
    return tokens[:-1], tokens[-1:] + head_seq_ops(p, g, hw, S)
