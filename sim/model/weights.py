"""The parameters of a model and their bytes on one GPU of a replica.

Parameter layout per layer, as in the Hugging Face / vLLM modules:

- attention: q, k, v, o projections (q twice as wide with ``attn_output_gate``); MLA: q_a
  (h × q_lora_rank) and q_b, or q_proj; kv_a_proj_with_mqa (h × (kv_lora_rank + rope));
  kv_b (kv_lora_rank × heads × (nope + v)); o (heads × v × h); Gated DeltaNet: in_proj_qkvz,
  in_proj_ba, a depthwise conv over q, k, v, out_proj;
- MLP: gated (gate, up, down = 3 × h × I) dense, or a router (h × E) and E experts of
  3 × h × I_moe, plus shared experts; two RMSNorms.

Tensor parallelism splits heads and FFN columns; K/V heads are replicated when fewer than
GPUs; MLA's down-projections (q_a, kv_a) are replicated. Routed experts are split over
``ep`` GPUs and each expert ``max(1, tp // ep)`` ways (ep = 1: every expert tensor-parallel).
Shared experts split ``tp`` ways like a dense MLP (attention is tensor-parallel, so every GPU
sees all tokens; see ``sim.cost.moe``). Embeddings, LM head, norms, biases, routers and
convolutions stay 16-bit in FP8 checkpoints (per-tensor ``fp8`` and block-scaled
``fp8_block`` alike: 1 byte per weight).

Pipeline parallelism (``pp`` stages) splits the layers as vLLM does
(``sim.config.parallel.pipeline_stage_layers``): the first stage also holds the embedding, the
last the final norm and LM head.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.config import ModelConfig
from sim.config.common import WEIGHT_DTYPE_BYTES
from sim.config.model import MOE_DTYPE_BYTES, expert_dtype, layer_kinds
from sim.config.parallel import pipeline_stage_layers
from sim.model.layout import PerGpu

SMALL_BYTES = 2  # norms, biases, routers, conv weights, embeddings: 16-bit


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` of integers."""
    return -(-a // b)


@dataclass(frozen=True)
class Stage:
    """One pipeline stage: the indices of its layers, and whether it is the first (embedding)
    or the last (final norm, LM head, sampler)."""

    layers: range
    first: bool = True
    last: bool = True


def pipeline_stages(m: ModelConfig, pp: int = 1) -> list[Stage]:
    """The ``pp`` stages of ``m``, first stage first, with vLLM's layer split."""
    out, start = [], 0
    counts = pipeline_stage_layers(m.num_hidden_layers, pp)
    for i, n in enumerate(counts):
        out.append(Stage(range(start, start + n), i == 0, i == len(counts) - 1))
        start += n
    return out


def whole_model(m: ModelConfig) -> Stage:
    """The one stage of an unsplit model."""
    return Stage(range(m.num_hidden_layers))


@dataclass(frozen=True)
class _Weights:
    """Parameter counts on one GPU, by storage class (summed over layers)."""

    linear: int  # GEMM weights in the model dtype
    experts: int  # routed-expert weights in the expert dtype
    small: int  # 16-bit: norms, biases, routers, convolutions
    vocab: int  # 16-bit: embedding and LM head

    @property
    def total(self) -> int:
        return self.linear + self.experts + self.small + self.vocab


def _attention_weights(m: ModelConfig, kind: str, tp: int) -> tuple[int, int]:
    """(linear, small) parameters of one layer's attention (or linear attention) per GPU."""
    g = PerGpu.of(m, tp)
    h, q = m.hidden_size, g.heads
    if kind == "linear_attention":
        nk, nv = g.lin_key_heads, g.lin_value_heads
        key, val = nk * m.linear_key_head_dim, nv * m.linear_value_head_dim
        linear = h * (2 * key + 2 * val) + h * 2 * nv + val * h  # qkvz, ba, out_proj
        small = (2 * key + val) * m.linear_conv_kernel_dim + 2 * nv + m.linear_value_head_dim
        return linear, small
    if m.kv_lora_rank:
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank:
            q_proj, small = h * m.q_lora_rank + m.q_lora_rank * q * qk, m.q_lora_rank
        else:
            q_proj, small = h * q * qk, 0
        kv_a = h * (m.kv_lora_rank + m.qk_rope_head_dim)
        kv_b = m.kv_lora_rank * q * (m.qk_nope_head_dim + m.v_head_dim)
        return q_proj + kv_a + kv_b + q * m.v_head_dim * h, small + m.kv_lora_rank
    d, kvh = m.head_dim, g.kv_heads
    q_out = q * d * (2 if m.attn_output_gate else 1)
    linear = h * q_out + 2 * h * kvh * d + q * d * h
    small = q_out + 2 * kvh * d + h if m.attention_bias else 0
    return linear, small


def _weights(m: ModelConfig, tp: int = 1, ep: int = 1, active: bool = False,
             stage: Stage | None = None) -> _Weights:
    """Every parameter of one GPU's share of ``stage`` (default: the whole model);
    ``active``: only the top-k routed experts."""
    st = stage or whole_model(m)
    h = m.hidden_size
    linear = small = experts = 0
    kinds = layer_kinds(m)[st.layers.start:st.layers.stop]
    for kind in set(kinds):
        n = kinds.count(kind)
        lin, sm = _attention_weights(m, kind, tp)
        linear, small = linear + n * lin, small + n * sm
    moe_from = m.first_k_dense_replace if m.num_experts else m.num_hidden_layers
    n_moe = len(range(max(st.layers.start, moe_from), st.layers.stop))
    linear += (len(st.layers) - n_moe) * cdiv(3 * h * m.intermediate_size, tp)
    if n_moe:
        local = m.num_experts_per_tok if active else cdiv(m.num_experts, ep)
        per_expert = cdiv(3 * h * m.moe_intermediate_size, max(1, tp // ep))
        experts = n_moe * local * per_expert
        linear += n_moe * cdiv(3 * h * m.shared_expert_intermediate_size, tp)
        small += n_moe * h * m.num_experts  # router, replicated
    small += (2 * len(st.layers) + st.last) * h  # two norms per layer, the final norm
    # a tied LM head is the embedding matrix, held again by the last stage when pp > 1
    matrices = st.first + st.last - (st.first and st.last and m.tie_word_embeddings)
    vocab = matrices * cdiv(m.vocab_size * h, tp)
    return _Weights(linear, experts, small, vocab)


def parameter_count(m: ModelConfig) -> int:
    """Parameters of the model (embeddings, layers, LM head), without MTP/draft modules."""
    return _weights(m).total


def active_parameter_count(m: ModelConfig, count_embedding: bool = False) -> int:
    """Parameters one token's forward pass multiplies by: every attention and dense-MLP
    weight, the router, the top-k routed and the shared experts, the norms and the LM head.

    The input embedding is a lookup of one row, so it is left out (as DeepSeek and OpenAI
    count "active" parameters) unless ``count_embedding`` (as Qwen's and Mistral's model cards
    do). With tied embeddings the one matrix counts once, as the LM head.
    """
    w = _weights(m, active=True)
    embed = m.vocab_size * m.hidden_size
    if m.tie_word_embeddings:
        return w.total
    return w.total - (0 if count_embedding else embed)


def stage_weight_bytes(m: ModelConfig, tp: int, ep: int, stage: Stage) -> int:
    """Weight memory of one GPU of pipeline stage ``stage`` (see ``weight_bytes_per_gpu``)."""
    w = _weights(m, tp, ep, stage=stage)
    experts = w.experts * MOE_DTYPE_BYTES[expert_dtype(m)]
    return int(w.linear * WEIGHT_DTYPE_BYTES[m.dtype] + experts
               + (w.small + w.vocab) * SMALL_BYTES)


def weight_bytes_per_gpu(m: ModelConfig, tp: int, ep: int = 1, pp: int = 1) -> int:
    """Weight memory of one GPU of the heaviest stage of a ``tp × pp`` replica whose
    experts span ``ep`` GPUs.

    Heads and FFN columns split ``tp`` ways (K/V heads replicated when fewer than GPUs);
    routed experts split ``ep`` ways and each expert ``max(1, tp // ep)`` ways, shared experts
    ``tp`` ways; the vocab-parallel embedding (first stage) and LM head (last
    stage) split too and stay bf16 in FP8 checkpoints.
    """
    return max(stage_weight_bytes(m, tp, ep, s) for s in pipeline_stages(m, pp))
