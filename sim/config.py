"""Typed schemas of the simulator's config groups (model, hardware, scheduler, ...).

Each YAML under ``conf/<group>/`` starts from one of these dataclasses (registered in
``sim.app``), so a wrong type or an unknown key fails when Hydra composes the config.
Range and cross-field checks that a type cannot express live in ``check_*`` functions.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.errors import ConfigError

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "fp8": 1}


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


@dataclass
class HardwareConfig:
    """One GPU's datasheet peaks. Bandwidths are bytes/s per direction."""

    name: str = "???"
    device_name: str = ""
    bf16_flops: float = 0.0
    fp8_flops: float | None = None
    hbm_bandwidth: float = 0.0
    hbm_bytes: float = 0.0
    nvlink_bandwidth: float = 0.0
    pcie_bandwidth: float = 0.0
    gpus_per_node: int = 8  # GPUs joined by NVLink in one node (the tensor-parallel limit)
    # Name of the calibrated efficiency file in sim/cost/calibrated/ that this GPU uses.
    calibration: str = "h100_sxm"


@dataclass
class SchedulerConfig:
    """Batching policy of one serving instance and its limits (vLLM names)."""

    name: str = "vllm"
    max_num_seqs: int = 1024
    max_num_batched_tokens: int = 8192
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    # None: the model's max_position_embeddings.
    max_model_len: int | None = None


@dataclass
class KVCacheConfig:
    """Paged KV cache: block size, memory fraction, KV dtype and preemption mode."""

    name: str = "paged"
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    dtype: str = "auto"
    preemption: str = "recompute"
    # Memory outside weights and activations: CUDA context, NCCL/cuBLAS workspaces, CUDA graphs.
    other_memory_gib: float = 1.0


@dataclass
class ClusterConfig:
    """How one model copy is laid out on GPUs."""

    name: str = "single"
    tensor_parallel_size: int = 1


@dataclass
class RooflineCostConfig:
    """Roofline cost model: per-operator max(compute, memory) time plus host overhead."""

    name: str = "roofline"
    # Fixed CPU time of one engine step (scheduling, input preparation, output processing).
    host_overhead_ms: float = 0.5
    # CPU time per sequence in the step.
    host_overhead_per_seq_us: float = 2.0
    # Calibrated efficiency file; "auto" takes hardware.calibration.
    calibration: str = "auto"


@dataclass
class ConstantCostConfig:
    """Every step takes ``step_time_ms`` regardless of the batch (tests, queueing theory)."""

    name: str = "constant"
    step_time_ms: float = 10.0


def _positive(field: str, value: float) -> None:
    if value is None or value <= 0:
        raise ConfigError(field, value, "must be > 0")


def check_model(m: ModelConfig) -> None:
    """Range checks of a model's architecture fields."""
    for f in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
              "head_dim", "intermediate_size", "vocab_size", "max_position_embeddings"):
        _positive(f"model.{f}", getattr(m, f))
    if m.num_attention_heads % m.num_key_value_heads:
        raise ConfigError("model.num_key_value_heads", m.num_key_value_heads,
                          f"must divide num_attention_heads={m.num_attention_heads}")
    if m.dtype not in DTYPE_BYTES:
        raise ConfigError("model.dtype", m.dtype, f"one of {sorted(DTYPE_BYTES)}")


def check_hardware(h: HardwareConfig, model: ModelConfig) -> None:
    """Datasheet peaks must be positive, and the GPU must run the model's dtype."""
    for f in ("bf16_flops", "hbm_bandwidth", "hbm_bytes", "nvlink_bandwidth", "pcie_bandwidth"):
        _positive(f"hardware.{f}", getattr(h, f))
    if model.dtype == "fp8" and not h.fp8_flops:
        raise ConfigError("model.dtype", model.dtype, f"{h.name} has no FP8 tensor cores")


def check_scheduler(s: SchedulerConfig, model: ModelConfig) -> None:
    """Scheduler limits must admit at least one token of one request."""
    if s.name != "vllm":
        raise ConfigError("scheduler.name", s.name, "one of ['vllm']")
    _positive("scheduler.max_num_seqs", s.max_num_seqs)
    _positive("scheduler.max_num_batched_tokens", s.max_num_batched_tokens)
    if s.long_prefill_token_threshold < 0:
        raise ConfigError("scheduler.long_prefill_token_threshold",
                          s.long_prefill_token_threshold, "must be >= 0 (0 = off)")
    if s.max_model_len is not None:
        _positive("scheduler.max_model_len", s.max_model_len)
        if s.max_model_len > model.max_position_embeddings:
            raise ConfigError("scheduler.max_model_len", s.max_model_len,
                              f"must be <= model.max_position_embeddings="
                              f"{model.max_position_embeddings}")
    max_len = s.max_model_len or model.max_position_embeddings
    if not s.enable_chunked_prefill and s.max_num_batched_tokens < max_len:
        # as vLLM: without chunking a whole prompt must fit in one step's budget
        raise ConfigError("scheduler.max_num_batched_tokens", s.max_num_batched_tokens,
                          f"must be >= max_model_len={max_len} when enable_chunked_prefill "
                          "is false")


def check_kv_cache(k: KVCacheConfig) -> None:
    """KV-cache settings in range."""
    _positive("kv_cache.block_size", k.block_size)
    if not 0 < k.gpu_memory_utilization <= 1:
        raise ConfigError("kv_cache.gpu_memory_utilization", k.gpu_memory_utilization,
                          "must be in (0, 1]")
    if k.dtype != "auto" and k.dtype not in DTYPE_BYTES:
        raise ConfigError("kv_cache.dtype", k.dtype, f"'auto' or one of {sorted(DTYPE_BYTES)}")
    if k.preemption != "recompute":
        raise ConfigError("kv_cache.preemption", k.preemption, "one of ['recompute']")
    if k.other_memory_gib < 0:
        raise ConfigError("kv_cache.other_memory_gib", k.other_memory_gib, "must be >= 0")


def check_cluster(c: ClusterConfig, model: ModelConfig, hw: HardwareConfig) -> None:
    """Tensor parallelism must split heads evenly and stay inside one NVLink node."""
    tp = c.tensor_parallel_size
    _positive("cluster.tensor_parallel_size", tp)
    if tp > hw.gpus_per_node:
        raise ConfigError("cluster.tensor_parallel_size", tp,
                          f"must be <= hardware.gpus_per_node={hw.gpus_per_node} (one NVLink node)")
    if model.num_attention_heads % tp:
        raise ConfigError("cluster.tensor_parallel_size", tp,
                          f"must divide model.num_attention_heads={model.num_attention_heads}")


def check_cost_model(c: RooflineCostConfig | ConstantCostConfig) -> None:
    """Cost-model parameters in range."""
    if c.name == "constant":
        _positive("cost_model.step_time_ms", c.step_time_ms)
    elif c.name == "roofline":
        if c.host_overhead_ms < 0:
            raise ConfigError("cost_model.host_overhead_ms", c.host_overhead_ms, "must be >= 0")
        if c.host_overhead_per_seq_us < 0:
            raise ConfigError("cost_model.host_overhead_per_seq_us",
                              c.host_overhead_per_seq_us, "must be >= 0")
    else:
        raise ConfigError("cost_model.name", c.name, "one of ['constant', 'roofline']")
