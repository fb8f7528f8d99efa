"""Channels-first 3D convolutions: a kernel class on the CUDA cores.

A video VAE's causal 3D convolutions run in PyTorch's default layout (``NCDHW``:
``nn.Conv3d`` on a contiguous 5-D tensor). cuDNN's tensor-core implicit-GEMM convolutions are
written for channels-last data; 3D convolutions on channels-first data have a history of
running without them (pytorch/pytorch#57115: "nn.Conv3d is not accelerated with tensorcores
(using autocast/AMP)" in the released binaries; #42311: no NDHWC path in PyTorch then), and
fp16 inputs accumulate in fp32 (PyTorch's cuDNN convolutions use a float compute type). The
class prices such a convolution at ``efficiency`` × ``hardware.fp32_flops`` (the CUDA
cores' FMA rate), and another GPU at its own FP32 rate: HunyuanVideo's serial stage (its
decode) takes 1.45× as long on an H20 as on an H100 in the development set, the ratio of their
FP32 peaks (1.52×), where a tensor-core kernel would take 6.7× (their bf16 peaks) and a
memory-bound one 0.84× (their bandwidths). ``channels_last`` VAEs (``torch.channels_last_3d``)
keep the tensor-core GEMM pricing.

``efficiency`` is fitted by ``python -m calibration fit-vae-conv3d`` on whole jobs of the
development set (``calibration/fit_vae_conv3d.py``) into
``sim/cost/calibrated/<hardware.calibration>/kernels/conv3d.yaml``;
``model.diffusion.vae.conv3d_efficiency`` overrides it.
"""

from __future__ import annotations

import functools
import warnings

from sim.cost.kernel_files import kernel_file, read_kernel_file

FILE = "conv3d"  # sim/cost/calibrated/<calibration>/kernels/conv3d.yaml


def conv3d_path(calibration: str):
    """Where the channels-first class of ``hardware.calibration`` is (or would be) written."""
    return kernel_file(calibration, FILE)


def calibrated_conv3d_efficiency(calibration: str) -> float | None:
    """The fitted fraction of the FP32 peak (None where no fit was made)."""
    return read_kernel_file(calibration, FILE, _efficiency)


def _efficiency(doc: dict) -> float | None:
    value = (doc.get("channels_first") or {}).get("efficiency")
    return None if value is None else float(value)


def conv3d_efficiency(calibration: str, override: float | None) -> float | None:
    """``override`` where set, else the calibrated efficiency, else None with a warning
    (once): the convolutions are then priced as tensor-core GEMMs."""
    if override is not None:
        return float(override)
    eff = calibrated_conv3d_efficiency(calibration)
    if eff is None:
        _warn_uncalibrated(calibration)
    return eff


@functools.cache
def _warn_uncalibrated(calibration: str) -> None:
    warnings.warn(f"no fitted channels-first 3D convolution class for hardware calibration "
                  f"{calibration!r} (sim/cost/calibrated/{calibration}/kernels/{FILE}.yaml): "
                  "a video VAE's 3D convolutions are priced as tensor-core GEMMs "
                  "(model.diffusion.vae.conv3d_efficiency sets the class)", stacklevel=3)
