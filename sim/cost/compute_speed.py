"""The deployment's compute speed: one scale of every FLOP roof (``cost_model.compute_scale``).

The efficiencies of ``sim/cost/calibrated/`` were fitted on operator tables profiled at
locked clocks; a serving GPU runs at the SM clock its power and thermal limits allow. The
scale multiplies the tensor-core (BF16, FP8) and CUDA-core (FP32) peaks; bandwidths, memory
and launch latencies stay. Fitted per deployment with the frontend costs
(``calibration.frontend_fit``, ``python -m calibration from-bench ... fit_compute=true``) or
alone (``calibration.compute_fit``).
"""

from __future__ import annotations

import dataclasses

from sim.config.cost import check_scale


def compute_scale(cost_model, calibrated: dict) -> float:
    """``cost_model.compute_scale``, else the calibrated file's ``compute:`` block's
    ``scale`` (1 where the file has none)."""
    given = getattr(cost_model, "compute_scale", None)
    if given is not None:
        return float(given)
    block = calibrated.get("compute") or {}
    if "scale" not in block:
        return 1.0
    return check_scale("cost_model.calibration (its compute.scale)", block["scale"])


def scaled_compute(hw, scale: float):
    """``hw`` (a plain ``HardwareConfig``, as ``sim.builders.plain`` makes it) with every
    FLOP roof (tensor-core BF16 and FP8, CUDA-core FP32) times ``scale``; bandwidths and
    memory unchanged."""
    if scale == 1.0:
        return hw
    return dataclasses.replace(hw, bf16_flops=hw.bf16_flops * scale,
                               fp8_flops=None if hw.fp8_flops is None else hw.fp8_flops * scale,
                               fp32_flops=hw.fp32_flops * scale)
