"""How each serving engine decides, at start-up, how much GPU memory its KV cache gets.

The engines differ, and the difference decides how many requests fit and when preemption
starts. Read from their source (the versions named; ``docs/fidelity.md`` quotes the lines):

- **vLLM** (v1 engine, 0.10.2–0.12.0, ``gpu_worker.determine_available_memory``):
  ``total × gpu_memory_utilization − weights − peak activations − non-torch memory``, where
  ``total`` is what ``cudaMemGetInfo`` reports and the peak is that of the profile run: one
  forward pass over ``max_num_batched_tokens`` tokens split into ``min(tokens,
  max_num_seqs)`` requests, then the sampler on those requests' logits (fp32, with the
  top-k/top-p sort: ``sim.kv.budget.activation_peak_bytes``). CUDA-graph memory is captured
  after the cache is allocated and is not subtracted.
- **SGLang** (0.5.3–0.5.5, ``model_runner.profile_max_num_token``): ``free_before_weights ×
  mem_fraction_static − weights``, with ``mem_fraction_static`` by default
  ``(gpu_mem − reserved) / gpu_mem`` (``server_args._handle_gpu_memory_settings``: reserved =
  512 + 1.5 × max(chunked_prefill_size, 2048) + 2 × cuda_graph_max_bs + tp·pp/8 × 1024 MiB,
  at least 10 GiB on GPUs over 60 GiB; ``gpu_mem`` is nvidia-smi's total). No activation
  profiling.
- **TensorRT-LLM** (PyTorch backend, ``_util.KvCacheCreator``): ``free_gpu_memory_fraction
  × (total − peak memory of a dummy prefill of max_num_tokens)``: the fraction (0.9 by
  default) of what is left free after weights, that pass's activations and non-torch memory.

How each engine pages **sliding-window layers** (``sliding_paged_as_full``), read from the
same sources (``docs/fidelity.md`` quotes them):

- **vLLM** (0.10.2, 0.11.0: ``v1/core/kv_cache_utils.py``, ``single_type_kv_cache_manager``):
  the hybrid KV cache manager, on by default, groups the layers by kind into groups of
  ``min(layers of each kind)`` layers sharing one pool of blocks; a request's sliding-window
  group holds the blocks of its last ``sliding_window`` tokens only (at most
  ``cdiv(window − 1, block) + 1``). ``--disable-hybrid-kv-cache-manager`` (or a KV connector)
  turns every sliding-window layer into a full-attention one for the cache.
- **SGLang** (0.5.3–0.5.5, ``server_args._handle_model_specific_adjustments``): forces
  ``disable_hybrid_swa_memory`` for gpt-oss (``GptOssForCausalLM``), so its sliding layers
  keep every token; other sliding-window models get its SWA pool (sized with
  ``swa_full_tokens_ratio`` 0.8; here paged like vLLM's window, an approximation).
- **TensorRT-LLM** (1.0–1.2, PyTorch backend): ``KvCacheConfig.max_attention_window`` is unset
  by ``trtllm-serve``, so the cache manager sizes every layer for the whole sequence; the
  window only shapes the attention kernel.

``kv_cache.gpu_memory_utilization`` is vLLM's fraction and TensorRT-LLM's
``free_gpu_memory_fraction``; ``kv_cache.mem_fraction_static`` is SGLang's (null: its default
rule). ``kv_cache.other_memory_gib`` stands for the non-torch memory (CUDA context, NCCL and
cuBLAS workspaces), an estimate: no engine computes it, each measures it.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1024**2
RULES = ("vllm", "sglang", "trtllm")
# architectures whose sliding-window layers SGLang keeps whole (disable_hybrid_swa_memory)
SGLANG_SWA_DISABLED = frozenset({"GptOssForCausalLM"})


def sliding_paged_as_full(rule: str, model, kv) -> bool:
    """Whether engine ``rule`` keeps every token of a sliding-window layer in its cache (pages
    it as a full-attention layer) rather than only the window's (module doc);
    ``kv_cache.sliding_window_paging`` overrides the engine's default."""
    paging = getattr(kv, "sliding_window_paging", "auto")
    if paging != "auto":
        return paging == "full"
    if rule == "trtllm":
        return True
    if rule == "sglang":
        return model.architecture in SGLANG_SWA_DISABLED
    return False


@dataclass(frozen=True)
class KVMemory:
    """One GPU's KV-cache memory under an engine's rule, and what the rule started from."""

    rule: str
    usable_bytes: int  # what the rule hands out before weights and activations
    kv_bytes: int
    fraction: float  # the memory fraction the rule used


def sglang_mem_fraction_static(gpu_mem_bytes: float, chunked_prefill_size: int, tp: int,
                               pp: int = 1) -> float:
    """SGLang's default ``mem_fraction_static`` (``_handle_gpu_memory_settings``), from
    nvidia-smi's total memory; ``cuda_graph_max_bs`` is its default for GPUs of 60–160 GiB
    (256 below TP 4, else 512)."""
    gpu_mem = gpu_mem_bytes / MIB
    max_bs = 256 if tp < 4 else 512
    reserved = 512 + max(chunked_prefill_size, 2048) * 1.5 + max_bs * 2 + tp * pp / 8 * 1024
    if gpu_mem > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mem - reserved) / gpu_mem, 3)


def kv_memory(rule: str, hw, kv, chunk: int, weights: int, activations: int, other: int,
              tp: int, pp: int = 1) -> KVMemory:
    """One GPU's KV bytes under ``rule`` (module doc); ``chunk`` is the scheduler's prefill
    chunk (SGLang's ``chunked_prefill_size``), ``activations`` the peak of the engine's own
    profiling pass (vLLM's, or TensorRT-LLM's prefill; SGLang has none)."""
    total = hw.cuda_total_bytes or hw.hbm_bytes
    if rule == "sglang":
        frac = kv.mem_fraction_static or sglang_mem_fraction_static(hw.hbm_bytes, chunk, tp, pp)
        free_before = total - other  # after the CUDA context and NCCL, before the weights
        usable = int(free_before * frac)
        return KVMemory(rule, usable, usable - weights, frac)
    frac = kv.gpu_memory_utilization
    if rule == "trtllm":
        left = total - weights - activations - other
        return KVMemory(rule, int(total * frac), int(left * frac), frac)
    usable = int(total * frac)
    return KVMemory("vllm", usable, usable - weights - activations - other, frac)


def startup_lines(budget, kv_bytes_per_token: int, max_model_len: int, context_len: int,
                  max_num_batched_tokens: int) -> list[str]:
    """The lines the engine of ``budget.rule`` logs at start-up about its KV cache, with this
    simulator's numbers (a ``sim.kv.budget.MemoryBudget``): what to compare with a real log.
    vLLM counts its blocks of ``budget.groups.size`` layers and divides them among its KV
    cache groups (full and sliding-window)."""
    gib = 1024**3
    if budget.rule == "sglang":
        t = budget.kv_cache_bytes // max(kv_bytes_per_token, 1)
        half = t * kv_bytes_per_token / 2 / gib
        pool = min(max(int(t / context_len * 512), 2048), 4096)
        return [f"KV Cache is allocated. #tokens: {t}, K size: {half:.2f} GB, "
                f"V size: {half:.2f} GB",
                f"max_total_num_tokens={t}, max_running_requests={min(t // 2, pool)} "
                f"(mem_fraction_static={budget.memory_fraction})"]
    if budget.rule == "trtllm":
        t = budget.kv_cache_bytes // max(kv_bytes_per_token, 1)
        return [f"Estimated max tokens in KV cache : {t}"]
    tokens, concurrency = vllm_kv_capacity(budget, max_model_len, max_num_batched_tokens)
    return [f"Available KV cache memory: {budget.kv_cache_bytes / gib:.2f} GiB",
            f"GPU KV cache size: {tokens:,} tokens",
            f"Maximum concurrency for {max_model_len:,} tokens per request: "
            f"{concurrency:.2f}x"]


def vllm_kv_capacity(budget, max_model_len: int, max_num_batched_tokens: int
                     ) -> tuple[int, float]:
    """The "GPU KV cache size" tokens and "Maximum concurrency" vLLM logs for ``budget``: its
    blocks of ``budget.groups.size`` layers divided among its KV cache groups
    (``_report_kv_cache_config``), and over the blocks one request of ``max_model_len``
    tokens may take (``get_max_concurrency_for_kv_cache_config``: each full group holds
    max_model_len tokens, each sliding group ``min(window − 1 + max_num_batched_tokens,
    max_model_len)`` plus one block, ``SlidingWindowSpec.max_memory_usage_bytes``)."""
    g, bs = budget.groups, budget.block_size
    blocks = budget.kv_cache_bytes // (budget.layer_block_bytes * g.size)
    window = min(budget.sliding_window - 1 + max_num_batched_tokens, max_model_len)
    per_request = g.full * -(-max_model_len // bs) + g.sliding * (-(-window // bs) + 1)
    return blocks // (g.full + g.sliding) * bs, blocks / per_request
