"""Attention implementations as kernel classes: how fast a named kernel runs non-causal
attention, for the diffusion transformers' ``model.diffusion.attention_impl``.

A pipeline's attention runs whatever kernel its reference code calls, and on an H100 the
classes differ by 2x: FlashAttention-2 (and PyTorch SDPA's flash backend, which is FA2's
kernel) reaches about 35% of the bf16 peak, FlashAttention-3 about 65%. Each class is a
compute efficiency over the sequence length ``s`` (keys per query) at each measured head dim
``d``:

    eta(s, d) = eta_max(d) * s^p / (s^p + s_half^p)

(a saturating curve: short sequences leave the kernel's pipeline part-empty), fitted by
``python -m calibration fit-attention-kernels csv=...`` on kernel throughput measured on the
GPU and written to ``sim/cost/calibrated/<hardware.calibration>/kernels/attention.yaml``.
Between measured head dims the three parameters are interpolated in log2(d); outside them
the nearest measured head dim's curve is used, and beyond the longest measured sequence the
curve's own saturation holds (both said in the calibrated file). A run takes
``max(flops / (peak * eta), bytes / bandwidth)``.

On another GPU a class keeps its measured time split in two: the tensor-core part runs at
that GPU's tensor peak, and the SM part — the softmax's exponentials on the special-function
units, its max/sum/rescale on the CUDA cores, issuing it all — at that GPU's CUDA-core rate
(``hardware.fp32_flops``). FlashAttention-2 runs the softmax between its two GEMMs instead of
overlapping them (FlashAttention-3's reason to exist: on an H100 the exponentials alone take
half the matmul time at head dim 128), so a GPU with a slower tensor core and similar SMs (an
H20: 1/6.7 of the H100's tensor peak, 2/3 of its FP32) runs it much nearer its tensor roof.
``sm_share`` is the SM part's share of the time on the measured GPU; one GPU's kernel
measurements cannot split it, so it is fitted on a second GPU's end-to-end jobs by ``python
-m calibration fit-attention-split`` (``kernels/attention_split.yaml``); a class without a fit
keeps ``sm_share = 0`` (carried over by the tensor peak alone), as does a GPU whose FP32 rate
is not known.

``calibrated`` (no kernel class) keeps the backend's fitted encoder-attention tables
(``Pricer.encoder_attention``): the serving engine's own kernel.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass, replace

import numpy as np

from sim.cost.kernel_files import kernel_file, read_kernel_file
from sim.errors import ConfigError

CALIBRATED = "calibrated"
# the names a pipeline may ask for -> the measured kernel class that prices it
IMPLS = {
    "fa2": "fa2",
    "fa3": "fa3",
    "triton": "triton",
    "cudnn": "cudnn",
    "sdpa_flash": "fa2",   # torch SDPBackend.FLASH_ATTENTION runs FlashAttention-2's kernel
    "sdpa_cudnn": "cudnn",  # torch SDPBackend.CUDNN_ATTENTION
    "sdpa_math": "standard",  # torch SDPBackend.MATH: the attention matrix materialised
}
# kernels that run on one GPU architecture only (``hardware.arch``)
ARCH_ONLY = {"fa3": "hopper"}  # flash-attn 3's kernels are written for sm_90
FILE = "attention"  # sim/cost/calibrated/<calibration>/kernels/attention.yaml
SPLIT_FILE = "attention_split"  # ... kernels/attention_split.yaml: each class's sm_share


@dataclass(frozen=True)
class KernelCurve:
    """One kernel class at one head dim: ``eta(s) = eta_max * s^p / (s^p + s_half^p)``."""

    eta_max: float
    s_half: float
    power: float

    def eta(self, seq) -> np.ndarray:
        s = np.maximum(np.asarray(seq, float), 1.0)
        x = (s / self.s_half) ** self.power
        return self.eta_max * x / (1.0 + x)


@dataclass(frozen=True)
class KernelClass:
    """A kernel class: its curves by measured head dim (ascending), the peaks of the GPU they
    were measured on (0: not known) and the SM part's share of its time there."""

    name: str
    curves: dict[int, KernelCurve]
    measured_bf16_flops: float = 0.0
    measured_fp32_flops: float = 0.0
    sm_share: float = 0.0

    def slowdown(self, bf16_flops: float, fp32_flops: float,
                 sm_share: float | None = None) -> float:
        """The kernel's time on a GPU of these peaks over its time carried by the tensor peak
        alone: ``(1 - share) + share * (C_m / C) / (P_m / P)`` (``P`` tensor, ``C`` FP32
        peaks; ``m`` the measured GPU); 1 where either FP32 rate is not known."""
        share = self.sm_share if sm_share is None else sm_share
        if not (share and fp32_flops > 0 and self.measured_fp32_flops > 0
                and self.measured_bf16_flops > 0):
            return 1.0
        sm_ratio = (self.measured_fp32_flops / fp32_flops) / (self.measured_bf16_flops
                                                              / bf16_flops)
        return (1.0 - share) + share * sm_ratio

    def eta_on(self, seq, head_dim: int, bf16_flops: float, fp32_flops: float,
               sm_share: float | None = None) -> np.ndarray:
        """Efficiency against ``bf16_flops`` on a GPU of these peaks (the module doc)."""
        return self.eta(seq, head_dim) / self.slowdown(bf16_flops, fp32_flops, sm_share)

    def curve(self, head_dim: int) -> KernelCurve:
        """The curve at ``head_dim``: a measured one, interpolated in log2 between two, or the
        nearest measured one outside them."""
        dims = sorted(self.curves)
        if head_dim in self.curves:
            return self.curves[head_dim]
        if head_dim <= dims[0]:
            return self.curves[dims[0]]
        if head_dim >= dims[-1]:
            return self.curves[dims[-1]]
        hi = next(d for d in dims if d > head_dim)
        lo = dims[dims.index(hi) - 1]
        w = (math.log2(head_dim) - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
        a, b = self.curves[lo], self.curves[hi]
        return KernelCurve(a.eta_max + w * (b.eta_max - a.eta_max),
                           2 ** ((1 - w) * math.log2(a.s_half) + w * math.log2(b.s_half)),
                           a.power + w * (b.power - a.power))

    def eta(self, seq, head_dim: int) -> np.ndarray:
        return self.curve(int(head_dim)).eta(seq)


def check_impl(field: str, impl: str) -> None:
    """Refuse an implementation name the simulator has no class for."""
    if impl != CALIBRATED and impl not in IMPLS:
        raise ConfigError(field, impl, f"one of {[CALIBRATED, *IMPLS]} (sdpa_efficient, the "
                          "memory-efficient SDPA kernel, has no measurements to price it)")


def kernel_classes_path(calibration: str):
    """Where the kernel classes of ``hardware.calibration`` are (or would be) written."""
    return kernel_file(calibration, FILE)


def split_path(calibration: str):
    """Where the kernel classes' ``sm_share`` of ``hardware.calibration`` is (or would be)."""
    return kernel_file(calibration, SPLIT_FILE)


def load_kernel_classes(calibration: str) -> dict[str, KernelClass]:
    """The kernel classes fitted for ``hardware.calibration`` (empty if none were), with the
    SM shares fitted for them (0 where none was)."""
    classes = read_kernel_file(calibration, FILE, _classes_of)
    shares = read_kernel_file(calibration, SPLIT_FILE, _shares_of)
    return {k: replace(c, sm_share=shares.get(k, 0.0)) for k, c in classes.items()}


def _classes_of(doc: dict) -> dict[str, KernelClass]:
    on = doc.get("measured_on") or {}
    return classes_from_dict(doc.get("classes") or {}, float(on.get("bf16_flops") or 0.0),
                             float(on.get("fp32_flops") or 0.0))


def _shares_of(doc: dict) -> dict[str, float]:
    return {k: float(v) for k, v in (doc.get("sm_share") or {}).items()}


def classes_from_dict(block: dict, bf16_flops: float = 0.0,
                      fp32_flops: float = 0.0) -> dict[str, KernelClass]:
    """``classes:`` of the calibrated file (measured on a GPU of these peaks) -> kernel
    classes."""
    return {name: KernelClass(name, {int(d): KernelCurve(float(c["eta_max"]),
                                                         float(c["s_half"]), float(c["power"]))
                                     for d, c in curves.items()}, bf16_flops, fp32_flops)
            for name, curves in block.items()}


def check_sm_share(field: str, share) -> None:
    """An SM share is a fraction of the kernel's time: in [0, 1] (or null: the fitted one)."""
    if share is not None and not 0.0 <= share <= 1.0:
        raise ConfigError(field, share, "a fraction in [0, 1] (null: the fitted one)")


def check_arch(impl: str, arch: str, gpu: str,
               field: str = "model.diffusion.attention_impl") -> None:
    """Refuse a kernel on a GPU architecture it does not run on (an unknown one passes)."""
    need = ARCH_ONLY.get(impl)
    if need and arch and arch != need:
        raise ConfigError(field, impl, f"runs on {need} GPUs only; {gpu} is {arch} (fa2, "
                          "sdpa_flash or cudnn run there)")


def kernel_class(calibration: str, impl: str, field: str = "model.diffusion.attention_impl"
                 ) -> KernelClass | None:
    """The class that prices ``impl`` on GPUs of ``calibration``; ``None`` for ``calibrated``
    or where that GPU has no measurements of the class (the backend's encoder-attention
    tables price it then, with a warning: ``fallback_note``). ``ConfigError`` for an unknown
    name."""
    check_impl(field, impl)
    if impl == CALIBRATED:
        return None
    k = load_kernel_classes(calibration).get(IMPLS[impl])
    if k is None:
        _warn_fallback(calibration, impl)
    return k


def fallback_note(calibration: str, impl: str) -> str:
    return (f"no measured {IMPLS[impl]} kernel class for hardware calibration "
            f"{calibration!r}: {impl} attention is priced with the backend's encoder-attention "
            "tables")


@functools.cache
def _warn_fallback(calibration: str, impl: str) -> None:
    warnings.warn(fallback_note(calibration, impl), stacklevel=3)
