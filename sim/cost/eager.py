"""PyTorch eager execution: the host's dispatch time per kernel launch.

Without CUDA graphs or a compiled graph, Python dispatches every kernel of a forward pass
one by one; the host runs ahead of the GPU, so a step takes ``max(GPU time, launches ×
launch_s)``. Used by eager DiT steps (``sim.diffusion.execution``) and by LLM steps that
replay no CUDA graph where the engine's model code then runs eager (``sim.cost.cuda_graphs``:
TensorRT-LLM's and SGLang's, and every step under ``backend.enforce_eager``, vLLM's
``--enforce-eager`` and SGLang's ``--disable-cuda-graph``; ``sim.cost.roofline``).
``launch_us`` (and the DiT's ``unfused`` factor) are fitted per hardware calibration by
``python -m calibration fit-execution`` on eager/compiled pairs of measured runs, into
``sim/cost/calibrated/<hardware.calibration>/kernels/execution.yaml``.
"""

from __future__ import annotations

import functools
import warnings

from sim.cost.kernel_files import kernel_file, read_kernel_file

FILE = "execution"  # sim/cost/calibrated/<calibration>/kernels/execution.yaml


def execution_path(calibration: str):
    """Where the eager costs of ``hardware.calibration`` are (or would be) written."""
    return kernel_file(calibration, FILE)


def calibrated_eager_costs(calibration: str) -> dict:
    """``{"launch_us": …, "unfused": …}`` fitted for ``calibration`` (empty if none were)."""
    return dict(read_kernel_file(calibration, FILE, _eager_costs))


def _eager_costs(doc: dict) -> tuple:
    e = doc.get("eager") or {}
    return tuple((k, float(e[k])) for k in ("launch_us", "unfused") if k in e)


def eager_launch_s(calibration: str, override_us: float | None, what: str | None) -> float:
    """Seconds of host dispatch per kernel launch: ``override_us`` where set, else the
    calibrated value, else 0, with a warning (once) naming ``what`` is priced without it
    (None: no warning, for steps the user did not ask to run eager)."""
    if override_us is not None:
        return float(override_us) * 1e-6
    launch_us = calibrated_eager_costs(calibration).get("launch_us")
    if launch_us is None:
        if what is not None:
            warn_uncalibrated(calibration, what)
        return 0.0
    return launch_us * 1e-6


@functools.cache
def warn_uncalibrated(calibration: str, what: str) -> None:
    warnings.warn(f"no fitted eager-mode costs for hardware calibration {calibration!r} "
                  f"(sim/cost/calibrated/{calibration}/kernels/{FILE}.yaml): {what}",
                  stacklevel=3)
