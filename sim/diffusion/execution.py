"""How a DiT step is executed: PyTorch eager or torch.compile (``model.diffusion.execution``).

In **eager** mode Python dispatches every PyTorch op as its own kernel: the norms,
modulations, QK-norms, rotary embeddings, gates and residuals that Inductor fuses into a few
kernels run as many small ones, each a pass over the activations, and the host spends a
dispatch time on every launch. The host runs ahead of the GPU, so a step takes the longer of
the two: ``max(GPU time, launches x launch_s)``; the part by which the host is longer is the
``eager.host_dispatch`` operator (bound ``host``). That is why eager Flux stops scaling past
two GPUs in xDiT's measurements while the compiled one keeps scaling: splitting the sequence
divides the GPU's work, not the number of launches.

In **compiled** mode (torch.compile's Inductor) the elementwise work is the fused kernels the
cost model prices (``sim.diffusion.dit``), and the host is assumed to keep ahead of the GPU.

The two eager costs — ``launch_s`` per kernel launch and ``unfused``, the eager kernels and
activation passes per fused one — are fitted by ``python -m calibration fit-execution`` on
the development set's eager/compile pairs and written to
``sim/cost/calibrated/<hardware.calibration>/kernels/execution.yaml``;
``model.diffusion.eager_launch_us`` / ``eager_unfused`` override them.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.cost.eager import calibrated_eager_costs, execution_path, warn_uncalibrated

__all__ = ["COMPILED", "Execution", "execution_of", "execution_path"]


@dataclass(frozen=True)
class Execution:
    """A DiT step's execution: ``mode`` and, in eager, the host's per-launch dispatch time
    and the unfused elementwise factor."""

    mode: str = "compiled"
    launch_s: float = 0.0
    unfused: float = 1.0

    @property
    def eager(self) -> bool:
        return self.mode == "eager"


COMPILED = Execution("compiled")


def execution_of(pipe, calibration: str) -> Execution:
    """The execution of pipeline ``pipe`` on GPUs of ``calibration``: its mode, with the
    pipeline's own eager costs where it sets them, else the calibrated ones (else none)."""
    if pipe.execution != "eager":
        return COMPILED
    cal = calibrated_eager_costs(calibration)
    if not cal and (pipe.eager_launch_us is None or pipe.eager_unfused is None):
        warn_uncalibrated(calibration, "eager DiT steps are priced as compiled ones "
                          "(model.diffusion.eager_launch_us / eager_unfused set them)")
    launch_us = pipe.eager_launch_us if pipe.eager_launch_us is not None \
        else cal.get("launch_us", 0.0)
    unfused = pipe.eager_unfused if pipe.eager_unfused is not None else cal.get("unfused", 1.0)
    return Execution("eager", float(launch_us) * 1e-6, float(unfused))
