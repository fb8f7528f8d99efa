"""Schema and checks of ``backend=``: the serving engine whose kernels the costs imitate.

The same model on the same GPU runs at different speeds under vLLM, SGLang and TensorRT-LLM
(different kernels and host overheads), so the calibrated efficiencies are per
(``hardware.calibration``, ``backend.name``): ``sim/cost/calibrated/<hardware>/<backend>.yaml``.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.errors import ConfigError

BACKENDS = ("vllm", "sglang", "trtllm")


@dataclass
class BackendConfig:
    """Which engine's measured kernels and host overheads the cost model uses."""

    name: str = "vllm"


def check_backend(b: BackendConfig) -> None:
    """The backend must be one the project has calibration tables for."""
    if b.name not in BACKENDS:
        raise ConfigError("backend.name", b.name, f"one of {list(BACKENDS)}")


# (group, schema name, dataclass) registered with Hydra by ``sim.app``
SCHEMAS = [
    ("backend", "base_backend", BackendConfig),
]
