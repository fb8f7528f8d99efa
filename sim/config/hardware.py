"""Schema and checks of ``hardware=``: one GPU's datasheet peaks."""

from __future__ import annotations

from dataclasses import dataclass

from sim.config.common import positive
from sim.config.model import ModelConfig
from sim.errors import ConfigError

# GPU memory at most 1 PiB: thousands of times any GPU's (the largest hold 288 GB), and few
# enough bytes that the KV blocks they make stay countable in the event loop's int64 counters
# (an absurd 1e30 bytes would make ~1e26 blocks and overflow them).
MAX_MEMORY_BYTES = 2**50


@dataclass
class HardwareConfig:
    """One GPU's datasheet peaks. Bandwidths are bytes/s per direction."""

    name: str = "???"
    device_name: str = ""
    # architecture: hopper, ada, ampere, blackwell, cdna3, ...; "" unknown. Kernels that run on
    # one architecture only are refused elsewhere (FlashAttention-3: hopper)
    arch: str = ""
    bf16_flops: float = 0.0
    fp8_flops: float | None = None
    # FP32 on the CUDA cores (not the tensor cores), dense, datasheet; 0: not known. The SMs'
    # own throughput: what a kernel's softmax, exponentials and bookkeeping run at
    # (sim.cost.attention_kernels carries an attention kernel class to another GPU by it)
    fp32_flops: float = 0.0
    hbm_bandwidth: float = 0.0
    hbm_bytes: float = 0.0  # the board's memory as nvidia-smi reports it (SGLang sizes by it)
    # what cudaMemGetInfo reports as total (vLLM and TensorRT-LLM size by it); 0: hbm_bytes
    cuda_total_bytes: float = 0.0
    nvlink_bandwidth: float = 0.0
    pcie_bandwidth: float = 0.0
    gpus_per_node: int = 8  # GPUs joined by NVLink in one node (the tensor-parallel limit)
    # Network between nodes, per GPU and direction (pipeline stages on different nodes): the
    # defaults are one 400 Gb/s InfiniBand NDR / ConnectX-7 port per GPU (DGX H100), and a
    # latency added to the calibrated send latency when a transfer leaves the node.
    internode_bandwidth: float = 50e9
    internode_latency_us: float = 5.0
    num_sms: int = 132  # streaming multiprocessors (compute units): GEMM wave quantization
    # Name of the calibrated efficiency file in sim/cost/calibrated/ that this GPU uses.
    calibration: str = "h100_sxm"


def check_calibration_name(field: str, name: str) -> None:
    """A calibration is named by its folder in ``sim/cost/calibrated/``: one plain name."""
    if not name or any(c in name for c in "/\\") or name in (".", ".."):
        raise ConfigError(field, name, "the name of a folder in sim/cost/calibrated/ "
                          "(e.g. h100_sxm)")


def check_hardware(h: HardwareConfig, model: ModelConfig) -> None:
    """Datasheet peaks must be positive, and the GPU must run the model's dtype."""
    for f in ("bf16_flops", "hbm_bandwidth", "hbm_bytes", "nvlink_bandwidth", "pcie_bandwidth",
              "internode_bandwidth", "gpus_per_node", "num_sms"):
        positive(f"hardware.{f}", getattr(h, f))
    if h.fp8_flops is not None and h.fp8_flops < 0:
        raise ConfigError("hardware.fp8_flops", h.fp8_flops, "must be >= 0 (0 or null: no FP8)")
    if not h.fp32_flops >= 0:
        raise ConfigError("hardware.fp32_flops", h.fp32_flops, "must be >= 0 (0: not known)")
    if not h.cuda_total_bytes >= 0:
        raise ConfigError("hardware.cuda_total_bytes", h.cuda_total_bytes,
                          "must be >= 0 (0: hbm_bytes)")
    for f in ("hbm_bytes", "cuda_total_bytes"):
        if getattr(h, f) > MAX_MEMORY_BYTES:
            raise ConfigError(f"hardware.{f}", getattr(h, f), f"must be at most "
                              f"{MAX_MEMORY_BYTES:.4g} bytes (1 PiB per GPU)")
    if h.internode_latency_us < 0:
        raise ConfigError("hardware.internode_latency_us", h.internode_latency_us, "must be >= 0")
    check_calibration_name("hardware.calibration", h.calibration)
    if model.dtype in ("fp8", "fp8_block") and not h.fp8_flops:
        raise ConfigError("model.dtype", model.dtype, f"{h.name} has no FP8 tensor cores")


# (group, schema name, dataclass) registered with Hydra by ``conf.schema``
SCHEMAS = [
    ("hardware", "base_hardware", HardwareConfig),
]
