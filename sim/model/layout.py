"""Where a model's layers and tensors sit in one replica: per-GPU shapes and pipeline stages.

A replica runs on ``tp × pp`` GPUs. Each pipeline stage holds a contiguous run of layers
(split as vLLM's ``get_pp_indices`` does: the remainder goes to the stages before the last);
inside a stage, attention heads, the dense FFN and, without expert parallelism, every routed
expert are split ``tp`` ways. With ``ep = tp`` the routed experts are instead placed whole,
``num_experts / ep`` per GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.config import ModelConfig
from sim.config.model import MOE_DTYPE_BYTES, expert_dtype, layer_kinds
from sim.config.parallel import pipeline_stage_layers

ATTENTION_KINDS = ("full", "sliding", "linear")
FFN_KINDS = ("dense", "moe")
_KIND = {"full_attention": "full", "sliding_attention": "sliding", "linear_attention": "linear"}


@dataclass(frozen=True)
class LayerCounts:
    """How many layers of each kind one pipeline stage holds.

    Every layer has one attention-side kind (``full``: softmax attention over the whole
    context, GQA or MLA; ``sliding``: keys capped at the window; ``linear``: Gated DeltaNet)
    and one FFN-side kind (``dense`` MLP or ``moe``).
    """

    full: int = 0
    sliding: int = 0
    linear: int = 0
    dense: int = 0
    moe: int = 0

    def of(self, kind: str) -> int:
        """Number of layers of ``kind`` (one of ATTENTION_KINDS + FFN_KINDS)."""
        return getattr(self, kind)

    @property
    def layers(self) -> int:
        """Layers in the stage."""
        return self.full + self.sliding + self.linear


def stage_layer_counts(model: ModelConfig, pp: int) -> list[LayerCounts]:
    """Layer kinds held by each of the ``pp`` pipeline stages, first stage first."""
    attn = [_KIND[k] for k in layer_kinds(model)]
    moe_from = model.first_k_dense_replace if model.num_experts else model.num_hidden_layers
    ffn = ["moe" if i >= moe_from else "dense" for i in range(model.num_hidden_layers)]
    out, start = [], 0
    for n in pipeline_stage_layers(model.num_hidden_layers, pp):
        kinds = attn[start:start + n] + ffn[start:start + n]
        out.append(LayerCounts(**{k: kinds.count(k) for k in ATTENTION_KINDS + FFN_KINDS}))
        start += n
    return out


@dataclass(frozen=True)
class PerGpu:
    """Per-GPU dimensions of one layer of each kind, for a ``tp``-way, ``ep``-way replica."""

    hidden: int
    vocab: int
    tp: int
    ep: int
    layer_dtype: str
    kv_bytes: float
    # softmax attention (GQA)
    heads: int
    kv_heads: int
    head_dim: int
    output_gate: bool
    window: int
    # multi-head latent attention (mla False: GQA)
    mla: bool
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_dim: int
    qk_rope_dim: int
    v_head_dim: int
    # FFN
    inter: int  # dense MLP, per GPU
    num_experts: int  # routed experts over all GPUs
    local_experts: int  # routed experts held by one GPU
    topk: int
    expert_inter: int  # FFN size of one routed expert as one GPU holds it
    shared_inter: int  # shared experts' FFN size as one GPU holds it
    expert_dtype: str
    expert_w_bytes: float
    # Gated DeltaNet
    lin_key_heads: int
    lin_value_heads: int
    lin_key_dim: int
    lin_value_dim: int
    lin_conv: int

    @classmethod
    def of(cls, m: ModelConfig, tp: int, ep: int = 1, kv_bytes: float = 0.0) -> PerGpu:
        """Per-GPU shapes of ``m``; ``ep`` is 1 (experts tensor-parallel) or ``tp``. Heads
        split ``tp`` ways (the config checks that ``tp`` divides the query and linear-attention
        heads); K/V heads are replicated when fewer than the GPUs."""
        edt = expert_dtype(m)
        return cls(
            hidden=m.hidden_size, vocab=m.vocab_size, tp=tp, ep=ep, layer_dtype=m.dtype,
            kv_bytes=float(kv_bytes),
            heads=m.num_attention_heads // tp, kv_heads=max(1, m.num_key_value_heads // tp),
            head_dim=m.head_dim, output_gate=m.attn_output_gate,
            window=m.sliding_window,
            mla=m.kv_lora_rank > 0, q_lora_rank=m.q_lora_rank, kv_lora_rank=m.kv_lora_rank,
            qk_nope_dim=m.qk_nope_head_dim, qk_rope_dim=m.qk_rope_head_dim,
            v_head_dim=m.v_head_dim,
            inter=m.intermediate_size // tp,
            num_experts=m.num_experts, local_experts=max(1, m.num_experts // ep),
            topk=m.num_experts_per_tok,
            expert_inter=m.moe_intermediate_size // (1 if ep > 1 else tp),
            shared_inter=m.shared_expert_intermediate_size // tp,
            expert_dtype=edt, expert_w_bytes=float(MOE_DTYPE_BYTES[edt]),
            lin_key_heads=m.linear_num_key_heads // tp,
            lin_value_heads=m.linear_num_value_heads // tp,
            lin_key_dim=m.linear_key_head_dim, lin_value_dim=m.linear_value_head_dim,
            lin_conv=m.linear_conv_kernel_dim,
        )
