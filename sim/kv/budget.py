"""GPU memory budget of one replica: weights, activations, and what is left for the KV cache.

Mirrors how vLLM sizes its cache: usable = total HBM × gpu_memory_utilization, minus the
weights, the peak activation memory of a forward pass over ``max_num_batched_tokens`` tokens,
and non-torch memory; the rest is divided into blocks of ``block_size`` tokens over all layers.

Only full-attention layers grow with the context. Sliding-window layers and linear-attention
(Gated DeltaNet) layers hold a fixed amount per request, which the KV manager budgets as
``state_blocks_per_request`` blocks taken from the same pool.

The weights (parameter layout per layer, their split over tensor, expert and pipeline
parallelism, bytes per GPU) are ``sim.model.weights``'s.

Pipeline parallelism (``pp`` stages) splits the layers as vLLM does
(``sim.config.parallel.pipeline_stage_layers``): the first stage also holds the embedding, the
last the final norm and LM head (and the sampler's logits). Each stage's GPUs size their own
cache, and vLLM then gives every stage the smallest ``num_gpu_blocks`` of all stages; the
per-GPU figures here are those of the worst stage.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sim.config import (
    DTYPE_BYTES,
    HardwareConfig,
    KVCacheConfig,
    ModelConfig,
    SchedulerConfig,
)
from sim.config.common import activation_dtype
from sim.config.model import layer_kinds
from sim.errors import ConfigError
from sim.kv.rules import kv_memory
from sim.model.layout import PerGpu
from sim.model.weights import Stage, cdiv, pipeline_stages, stage_weight_bytes, whole_model
from sim.schedulers import SCHEDULERS

GIB = 1024**3
SAMPLER_BYTES = 4 + 4 + 8  # per request and vocab entry: fp32 logits, sorted copy, int64 indices


def activation_dtype_bytes(model: ModelConfig) -> int:
    """Bytes of one activation element: bf16 when the weights are FP8 (as vLLM runs them)."""
    return DTYPE_BYTES[activation_dtype(model.dtype)]


def kv_dtype_bytes(model: ModelConfig, kv: KVCacheConfig) -> int:
    """Bytes per KV element: the model's activation dtype unless the cache sets its own.

    As vLLM's ``kv_cache_dtype=auto``: FP8 weights still run bf16 activations and KV cache.
    """
    if kv.dtype != "auto":
        return DTYPE_BYTES[kv.dtype]
    return activation_dtype_bytes(model)


def _stage_kv_bytes_per_token(model: ModelConfig, kv: KVCacheConfig, tp: int,
                              stage: Stage) -> int:
    kinds = layer_kinds(model)[stage.layers.start:stage.layers.stop]
    if model.kv_lora_rank:
        per_layer = model.kv_lora_rank + model.qk_rope_head_dim
    else:
        per_layer = 2 * PerGpu.of(model, tp).kv_heads * model.head_dim
    return kinds.count("full_attention") * per_layer * kv_dtype_bytes(model, kv)


def kv_bytes_per_token(model: ModelConfig, kv: KVCacheConfig, tp: int, pp: int = 1) -> int:
    """Cache that grows with each token: the full-attention layers of the largest pipeline
    stage, on one GPU of ``tp``.

    Standard attention keeps K and V per KV head (replicated when fewer heads than GPUs);
    MLA keeps one latent of ``kv_lora_rank + qk_rope_head_dim`` per token, shared by all
    heads, so every GPU holds all of it (not split by TP).
    """
    return max(_stage_kv_bytes_per_token(model, kv, tp, s) for s in pipeline_stages(model, pp))


def _stage_state_bytes(model: ModelConfig, kv: KVCacheConfig, tp: int, stage: Stage) -> int:
    kinds = layer_kinds(model)[stage.layers.start:stage.layers.stop]
    n_sliding, n_linear = kinds.count("sliding_attention"), kinds.count("linear_attention")
    g = PerGpu.of(model, tp)
    sliding = n_sliding * 2 * g.kv_heads * model.head_dim * model.sliding_window
    state = sliding * kv_dtype_bytes(model, kv)
    if n_linear:
        nk, nv = g.lin_key_heads, g.lin_value_heads
        recurrent = nv * model.linear_key_head_dim * model.linear_value_head_dim
        conv_dim = 2 * nk * model.linear_key_head_dim + nv * model.linear_value_head_dim
        conv = (model.linear_conv_kernel_dim - 1) * conv_dim
        state += n_linear * (recurrent + conv) * activation_dtype_bytes(model)
    return state


def state_bytes_per_request(model: ModelConfig, kv: KVCacheConfig, tp: int,
                            pp: int = 1) -> int:
    """Fixed per-request memory of the layers that do not grow with context, per GPU of the
    pipeline stage that holds the most.

    Sliding-window layers: K and V of ``sliding_window`` tokens, an upper bound (a shorter
    request holds less; a prefill chunk briefly needs its own tokens on top). Linear-attention
    (Gated DeltaNet) layers: the recurrent state (value heads × key dim × value dim) and the
    short-convolution state (kernel − 1 past inputs of q, k, v), in the activation dtype.
    """
    return max(_stage_state_bytes(model, kv, tp, s) for s in pipeline_stages(model, pp))


def _attention_width(m: ModelConfig, kind: str, tp: int) -> int:
    """Widest per-token output of one layer's attention projections, per GPU."""
    g = PerGpu.of(m, tp)
    q = g.heads
    if kind == "linear_attention":
        key = g.lin_key_heads * m.linear_key_head_dim
        nv = g.lin_value_heads
        return 2 * key + 2 * nv * m.linear_value_head_dim + 2 * nv
    if m.kv_lora_rank:
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        latent = m.kv_lora_rank + m.qk_rope_head_dim
        return q * qk + latent + q * (m.qk_nope_head_dim + m.v_head_dim)
    gate = 2 if m.attn_output_gate else 1
    return (q * gate + 2 * g.kv_heads) * m.head_dim


def activation_peak_bytes(
    model: ModelConfig, sched: SchedulerConfig, tp: int, ep: int = 1,
    stage: Stage | None = None,
) -> int:
    """Peak activation memory of vLLM's profiling run, per GPU of ``stage`` (default: the
    whole model on one stage; an estimate of what ``torch_peak_increase`` measures).

    The larger of the forward pass and the sampler that follows it (the forward's tensors
    are freed by then). The forward (``forward_activation_bytes``) runs the full token budget.
    On the last stage the sampler runs on the logits of ``min(max_num_batched_tokens,
    max_num_seqs)`` requests (``_dummy_sampler_run``): the fp32 logits, and top-k/top-p's
    sorted fp32 copy with its int64 indices (``apply_top_k_top_p``), 16 bytes per request and
    vocabulary entry. With tensor parallelism every GPU gathers the whole vocabulary.
    """
    m, t, st = model, sched.max_num_batched_tokens, stage or whole_model(model)
    if not len(st.layers):
        return 0
    kinds = layer_kinds(m)[st.layers.start:st.layers.stop]
    attn = max(_attention_width(m, kind, tp) for kind in set(kinds))
    moe_from = m.first_k_dense_replace if m.num_experts else m.num_hidden_layers
    g = PerGpu.of(m, tp, ep)
    widths = []
    if st.layers.start < moe_from:
        widths.append(3 * g.inter)
    if st.layers.stop > moe_from:
        routed = 3 * g.expert_inter + m.hidden_size
        widths.append(m.num_experts_per_tok * routed + 3 * g.shared_inter)
    forward = t * (2 * m.hidden_size + attn + max(widths)) * activation_dtype_bytes(m)
    requests = min(t, sched.max_num_seqs)
    sampler = requests * m.vocab_size * SAMPLER_BYTES if st.last else 0
    return max(forward, sampler)


def forward_activation_bytes(model: ModelConfig, sched: SchedulerConfig, tp: int,
                             ep: int = 1, stage: Stage | None = None) -> int:
    """Peak activations of one forward pass over ``max_num_batched_tokens`` tokens, per GPU of
    ``stage`` (TensorRT-LLM's dummy prefill, which samples one token per request):
    ``activation_peak_bytes`` without the sampler."""
    last_free = dataclasses.replace(stage or whole_model(model), last=False)
    return activation_peak_bytes(model, sched, tp, ep, last_free)


@dataclass(frozen=True)
class MemoryBudget:
    """Where one GPU's memory goes, and the KV cache that results.

    With pipeline parallelism the figures are those of the binding stage (the one with the
    fewest blocks; ``stage`` counts from 0), and ``num_gpu_blocks`` is that minimum, as vLLM
    gives every stage. ``state_blocks_per_request`` blocks of the pool are the fixed state
    one running request holds besides its growing KV (sliding-window and linear-attention
    layers; 0 otherwise): the most any stage needs, in that stage's blocks.
    """

    usable_bytes: int
    weight_bytes: int
    activation_bytes: int
    other_bytes: int
    kv_cache_bytes: int
    block_bytes: int
    num_gpu_blocks: int
    block_size: int
    state_bytes_per_request: int = 0
    state_blocks_per_request: int = 0
    stage: int = 0
    pipeline_parallel_size: int = 1
    tensor_parallel_size: int = 1
    rule: str = "vllm"  # the engine whose rule sized it (sim.kv.rules)
    memory_fraction: float = 0.9  # that rule's fraction

    @property
    def max_tokens(self) -> int:
        """Tokens the cache can hold at once across all requests (ignoring fixed state)."""
        return self.num_gpu_blocks * self.block_size


def _stage_budget(model: ModelConfig, hw: HardwareConfig, sched: SchedulerConfig,
                  kv: KVCacheConfig, tp: int, ep: int, pp: int, i: int,
                  stage: Stage, rule: str) -> MemoryBudget:
    """One stage's own budget (its GPUs alone) under engine ``rule``, refusing a stage that
    does not fit."""
    weights = stage_weight_bytes(model, tp, ep, stage)
    # what the engine's own profiling pass measures: vLLM's forward + sampler, TensorRT-LLM's
    # prefill; SGLang profiles nothing (its reserve is inside mem_fraction_static)
    if rule == "vllm":
        acts = activation_peak_bytes(model, sched, tp, ep, stage)
    elif rule == "trtllm":
        acts = forward_activation_bytes(model, sched, tp, ep, stage)
    else:
        acts = 0
    other = int(kv.other_memory_gib * GIB)
    chunk = SCHEDULERS[sched.name].prefill_chunk(sched)
    mem = kv_memory(rule, hw, kv, chunk, weights, acts, other, tp, pp)
    usable, free = mem.usable_bytes, mem.kv_bytes
    block_bytes = kv.block_size * _stage_kv_bytes_per_token(model, kv, tp, stage)
    where = f" on pipeline stage {i} of {pp}" if pp > 1 else ""
    if not block_bytes:
        raise ConfigError("cluster.pipeline_parallel_size", pp,
                          f"pipeline stage {i} (layers {stage.layers.start}-"
                          f"{stage.layers.stop - 1}) holds no full_attention layer, so no "
                          "paged KV cache; use fewer stages")
    state = _stage_state_bytes(model, kv, tp, stage)
    state_blocks = cdiv(state, block_bytes)
    # the null block, and one request's fixed state plus one block of its KV
    if free < (2 + state_blocks) * block_bytes:
        raise ConfigError(
            "cluster.tensor_parallel_size",
            tp,
            f"model {model.name} does not fit{where}: {weights / GIB:.1f} GiB weights + "
            f"{acts / GIB:.1f} GiB activations + {other / GIB:.1f} GiB other per GPU exceed "
            f"{usable / GIB:.1f} GiB usable ({hw.name}, {rule}'s rule with memory fraction "
            f"{mem.fraction}); use more GPUs (tensor_parallel_size or "
            "pipeline_parallel_size) or a larger GPU",
        )
    return MemoryBudget(usable, weights, acts, other, free, block_bytes, free // block_bytes,
                        kv.block_size, state, state_blocks, i, pp, tp, rule, mem.fraction)


def memory_budget(
    model: ModelConfig,
    hw: HardwareConfig,
    sched: SchedulerConfig,
    kv: KVCacheConfig,
    tp: int,
    ep: int = 1,
    pp: int = 1,
    rule: str = "vllm",
) -> MemoryBudget:
    """Size the KV cache of one ``tp × pp`` replica by engine ``rule`` (``sim.kv.rules``);
    refuses a model that does not fit.

    Each stage sizes its own cache; the replica gets the smallest block count of all stages
    (as vLLM's ``num_gpu_blocks`` with pipeline parallelism) and the largest fixed state.
    """
    stages = [_stage_budget(model, hw, sched, kv, tp, ep, pp, i, s, rule)
              for i, s in enumerate(pipeline_stages(model, pp))]
    binding = min(stages, key=lambda b: b.num_gpu_blocks)
    return dataclasses.replace(
        binding, state_blocks_per_request=max(b.state_blocks_per_request for b in stages),
        state_bytes_per_request=max(b.state_bytes_per_request for b in stages))
