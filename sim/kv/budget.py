"""GPU memory budget of one replica: weights, activations, and what is left for the KV cache.

Mirrors how vLLM sizes its cache: usable = total HBM × gpu_memory_utilization, minus the
weights, the peak activation memory of a forward pass over ``max_num_batched_tokens`` tokens,
and non-torch memory; the rest is divided into blocks of ``block_size`` tokens over all layers.

Full-attention layers grow with the context. Linear-attention (Gated DeltaNet) layers hold a
fixed state per request; sliding-window layers hold the blocks of the request's last
``sliding_window`` tokens where the engine pages them by window (vLLM's hybrid KV cache
manager), or grow like full-attention layers where it keeps every token (SGLang for gpt-oss,
TensorRT-LLM: ``sim.kv.rules.sliding_paged_as_full``). The KV manager takes both kinds of
per-request blocks from the same pool (``MemoryBudget``, ``sim.kv.manager``).

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
from sim.kv.rules import kv_memory, sliding_paged_as_full
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


def _layer_kv_bytes(model: ModelConfig, kv: KVCacheConfig, tp: int) -> int:
    """Bytes one attention layer keeps per token on one GPU of ``tp``.

    Standard attention keeps K and V per KV head (replicated when fewer heads than GPUs);
    MLA keeps one latent of ``kv_lora_rank + qk_rope_head_dim`` per token, shared by all
    heads, so every GPU holds all of it (not split by TP).
    """
    if model.kv_lora_rank:
        per_layer = model.kv_lora_rank + model.qk_rope_head_dim
    else:
        per_layer = 2 * PerGpu.of(model, tp).kv_heads * model.head_dim
    return per_layer * kv_dtype_bytes(model, kv)


def paged_layers(model: ModelConfig, stage: Stage, sliding_full: bool) -> tuple[int, int]:
    """The stage's layers whose cache grows with every token, and its sliding-window layers
    that keep only their window: an engine that pages sliding-window layers as full ones
    (``sliding_full``, ``sim.kv.rules.sliding_paged_as_full``) counts them with the first."""
    kinds = layer_kinds(model)[stage.layers.start:stage.layers.stop]
    full, sliding = kinds.count("full_attention"), kinds.count("sliding_attention")
    return (full + sliding, 0) if sliding_full else (full, sliding)


def _stage_kv_bytes_per_token(model: ModelConfig, kv: KVCacheConfig, tp: int,
                              stage: Stage, sliding_full: bool = False) -> int:
    return paged_layers(model, stage, sliding_full)[0] * _layer_kv_bytes(model, kv, tp)


def kv_bytes_per_token(model: ModelConfig, kv: KVCacheConfig, tp: int, pp: int = 1,
                       sliding_full: bool = False) -> int:
    """Cache that grows with each token: the full-attention layers of the largest pipeline
    stage (and its sliding-window layers where the engine pages them as full ones), on one
    GPU of ``tp``."""
    return max(_stage_kv_bytes_per_token(model, kv, tp, s, sliding_full)
               for s in pipeline_stages(model, pp))


def window_bytes_per_token(model: ModelConfig, kv: KVCacheConfig, tp: int, pp: int = 1,
                           sliding_full: bool = False) -> int:
    """K and V per token of the sliding-window layers that keep only their window (0 where
    the engine pages them as full ones), on one GPU of ``tp`` of the largest pipeline stage."""
    return max(paged_layers(model, s, sliding_full)[1] * _layer_kv_bytes(model, kv, tp)
               for s in pipeline_stages(model, pp))


def _stage_linear_state_bytes(model: ModelConfig, tp: int, stage: Stage) -> int:
    """Fixed state of the stage's linear-attention layers per request (recurrent and
    short-convolution state, in the activation dtype)."""
    n_linear = layer_kinds(model)[stage.layers.start:stage.layers.stop].count(
        "linear_attention")
    if not n_linear:
        return 0
    g = PerGpu.of(model, tp)
    nk, nv = g.lin_key_heads, g.lin_value_heads
    recurrent = nv * model.linear_key_head_dim * model.linear_value_head_dim
    conv_dim = 2 * nk * model.linear_key_head_dim + nv * model.linear_value_head_dim
    conv = (model.linear_conv_kernel_dim - 1) * conv_dim
    return n_linear * (recurrent + conv) * activation_dtype_bytes(model)


def _stage_state_bytes(model: ModelConfig, kv: KVCacheConfig, tp: int, stage: Stage,
                       sliding_full: bool = False) -> int:
    n_sliding = paged_layers(model, stage, sliding_full)[1]
    window = n_sliding * _layer_kv_bytes(model, kv, tp) * model.sliding_window
    return window + _stage_linear_state_bytes(model, tp, stage)


def state_bytes_per_request(model: ModelConfig, kv: KVCacheConfig, tp: int,
                            pp: int = 1, sliding_full: bool = False) -> int:
    """Per-request memory of the layers that do not grow with context, per GPU of the
    pipeline stage that holds the most: an upper bound.

    Sliding-window layers paged by window: K and V of ``sliding_window`` tokens (a shorter
    request holds less: ``KVGroups``, ``sim.kv.manager``). Linear-attention (Gated DeltaNet)
    layers: the recurrent state (value heads × key dim × value dim) and the
    short-convolution state (kernel − 1 past inputs of q, k, v), in the activation dtype.
    """
    return max(_stage_state_bytes(model, kv, tp, s, sliding_full)
               for s in pipeline_stages(model, pp))


@dataclass(frozen=True)
class KVGroups:
    """vLLM's KV cache groups of a stage (``kv_cache_utils``: layers grouped by kind into
    groups of ``min(layers of each kind)`` layers, the last of a kind padded): ``size``
    layers a group, ``full`` groups of the layers whose cache grows with every token,
    ``sliding`` groups of sliding-window layers that keep their window. A block of vLLM's
    pool holds ``block_size`` tokens of one group."""

    size: int
    full: int = 1
    sliding: int = 0

    @classmethod
    def of(cls, grows: int, sliding: int) -> KVGroups:
        if not sliding:
            return cls(grows)
        size = min(grows, sliding)
        return cls(size, cdiv(grows, size), cdiv(sliding, size))

    @property
    def window_layers(self) -> int:
        """Layers of the sliding-window groups, padding included: a block of a request's
        tokens there takes ``window_layers / grows`` blocks of this simulator's cache (whose
        blocks hold ``block_size`` tokens of the ``grows`` layers)."""
        return self.sliding * self.size


def window_cap(sliding_window: int, block_size: int) -> int:
    """Blocks of tokens a request's sliding-window group holds at most: vLLM's
    ``SlidingWindowManager`` frees blocks wholly out of the window before each step, leaving
    ``cdiv(window − 1, block_size) + 1``."""
    return cdiv(sliding_window - 1, block_size) + 1


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
    gives every stage. ``state_blocks_per_request`` blocks of the pool are the most one
    running request holds besides its growing KV (0 for a model of full-attention layers
    only): ``fixed_state_blocks`` of linear-attention state, and its sliding-window layers'
    blocks where the engine pages them by window — ``window_layers / block_layers`` blocks of
    the pool per block of its tokens, for at most ``window_cap`` blocks of tokens
    (``sim.kv.manager``);
    the most any stage needs, in that stage's blocks. ``groups`` are vLLM's KV cache groups
    of the binding stage, each block of ``layer_block_bytes`` per layer (its start-up log).
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
    groups: KVGroups | None = None
    layer_block_bytes: int = 0
    sliding_window: int = 0  # keys of a sliding-window layer paged by window (0: none)
    fixed_state_blocks: int = 0
    window_layers: int = 0
    block_layers: int = 0  # layers of one block of this cache (those whose cache grows)
    window_cap: int = 0

    @property
    def window(self) -> tuple[int, int, int] | None:
        """``(window_layers, block_layers, window_cap)`` for the KV manager
        (``sim.kv.manager.state_blocks_for``), or None where no layer is paged by window."""
        return (self.window_layers, self.block_layers, self.window_cap) if \
            self.window_layers else None

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
    sliding_full = sliding_paged_as_full(rule, model, kv)
    grows, sliding = paged_layers(model, stage, sliding_full)
    layer_block_bytes = kv.block_size * _layer_kv_bytes(model, kv, tp)
    block_bytes = grows * layer_block_bytes
    where = f" on pipeline stage {i} of {pp}" if pp > 1 else ""
    if not block_bytes:
        raise ConfigError("cluster.pipeline_parallel_size", pp,
                          f"pipeline stage {i} (layers {stage.layers.start}-"
                          f"{stage.layers.stop - 1}) holds no full_attention layer, so no "
                          "paged KV cache; use fewer stages")
    state = _stage_state_bytes(model, kv, tp, stage, sliding_full)
    groups = KVGroups.of(grows, sliding)
    fixed = cdiv(_stage_linear_state_bytes(model, tp, stage), block_bytes)
    cap = window_cap(model.sliding_window, kv.block_size) if sliding else 0
    state_blocks = fixed + cdiv(groups.window_layers * cap, grows)
    # the null block, and one request's state at most plus one block of its KV
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
                        kv.block_size, state, state_blocks, i, pp, tp, rule, mem.fraction,
                        groups, layer_block_bytes, model.sliding_window if sliding else 0,
                        fixed, groups.window_layers, grows, cap)


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
    (as vLLM's ``num_gpu_blocks`` with pipeline parallelism), the largest fixed state, and
    the binding stage's sliding-window blocks.
    """
    stages = [_stage_budget(model, hw, sched, kv, tp, ep, pp, i, s, rule)
              for i, s in enumerate(pipeline_stages(model, pp))]
    binding = min(stages, key=lambda b: b.num_gpu_blocks)
    # the fixed state of the stage that holds the most; the window's blocks in the binding
    # stage's own blocks (an approximation where stages split the kinds of layer unevenly)
    fixed = max(b.fixed_state_blocks for b in stages)
    state = fixed + cdiv(binding.window_layers * binding.window_cap, binding.block_layers)
    return dataclasses.replace(
        binding, state_blocks_per_request=state,
        state_bytes_per_request=max(b.state_bytes_per_request for b in stages),
        fixed_state_blocks=fixed)
