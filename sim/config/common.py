"""Helpers shared by the config checks, and the element sizes of the dtypes."""

from __future__ import annotations

import math

from sim.errors import ConfigError

# Elements of activations and KV caches.
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "fp8": 1}
# Model weights: also block-scaled FP8 (``fp8_block``, 128×128 blocks sharing one fp32 scale,
# as DeepSeek-V3/R1 ship), 1 byte per weight (the scales add 1/4096 of that, left out).
WEIGHT_DTYPE_BYTES = {**DTYPE_BYTES, "fp8_block": 1}
FP8_DTYPES = ("fp8", "fp8_block")


def is_fp8(dtype: str) -> bool:
    """Whether weights of ``dtype`` multiply at the FP8 tensor-core peak."""
    return dtype in FP8_DTYPES


def activation_dtype(weight_dtype: str) -> str:
    """The dtype activations run in next to weights of ``weight_dtype``: bf16 for FP8 weights
    (as vLLM runs them), else the weights' own."""
    return "bfloat16" if is_fp8(weight_dtype) else weight_dtype


def positive(field: str, value: float) -> None:
    """Refuse a value that is missing, not > 0 (NaN included) or infinite, naming its field."""
    if value is None or not value > 0:
        raise ConfigError(field, value, "must be > 0")
    if not math.isfinite(value):
        raise ConfigError(field, value, "must be a finite number > 0")
