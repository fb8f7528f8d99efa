"""Schemas and checks of ``cost_model=``: roofline or constant step times."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sim.config.common import positive
from sim.config.hardware import check_calibration_name
from sim.errors import ConfigError


@dataclass
class RooflineCostConfig:
    """Roofline cost model: per-operator max(compute, memory) time plus host overhead."""

    name: str = "roofline"
    # Fixed CPU time of one engine step (scheduling, input preparation, output processing);
    # None: the calibrated value of this hardware and backend.
    host_overhead_ms: float | None = None
    # CPU time per sequence in the step; None: the calibrated value.
    host_overhead_per_seq_us: float | None = None
    # CPU time per request whose prompt starts in the step; None: the calibrated value.
    host_overhead_per_new_request_us: float | None = None
    # CPU time per token scheduled in the step; None: the calibrated value.
    host_overhead_per_token_us: float | None = None
    # Speed of the deployment's compute-bound kernels relative to the profiled tables the
    # efficiencies were fitted on (every FLOP roof times this; bandwidths unchanged): a
    # serving GPU runs at the SM clock its power and thermal limits allow, the tables were
    # measured at locked clocks. None: the calibrated file's ``compute:`` block (1 without).
    compute_scale: float | None = None
    # Calibrated parameters sim/cost/calibrated/<calibration>/<backend>.yaml;
    # "auto" takes hardware.calibration; or the path of one calibrated .yaml file
    # (``python -m calibration from-bench`` writes one from your own benchmark results).
    calibration: str = "auto"


HOST_FIELDS = ("host_overhead_ms", "host_overhead_per_seq_us",
               "host_overhead_per_new_request_us", "host_overhead_per_token_us")


@dataclass
class ConstantCostConfig:
    """Every step takes ``step_time_ms`` regardless of the batch (tests, queueing theory)."""

    name: str = "constant"
    step_time_ms: float = 10.0


SCALE_RANGE = (0.05, 4.0)  # of cost_model.compute_scale; 1: the profiled tables' speed


def check_scale(field: str, value) -> float:
    """``value`` as a scale in ``SCALE_RANGE``, or one ``ConfigError`` naming ``field``."""
    try:
        scale = float(value)
    except (TypeError, ValueError):
        scale = float("nan")
    if not SCALE_RANGE[0] <= scale <= SCALE_RANGE[1]:
        raise ConfigError(field, value, f"must be in [{SCALE_RANGE[0]:g}, {SCALE_RANGE[1]:g}] "
                          "(1: the profiled tables' speed)")
    return scale


def check_cost_model(c: RooflineCostConfig | ConstantCostConfig) -> None:
    """Cost-model parameters in range."""
    if c.name == "constant":
        positive("cost_model.step_time_ms", c.step_time_ms)
    elif c.name == "roofline":
        for key in HOST_FIELDS:
            value = getattr(c, key)
            if value is not None and value < 0:
                raise ConfigError(f"cost_model.{key}", value, "must be >= 0")
        if c.compute_scale is not None:
            check_scale("cost_model.compute_scale", c.compute_scale)
        if c.calibration != "auto" and not str(c.calibration).endswith((".yaml", ".yml")):
            check_calibration_name("cost_model.calibration", c.calibration)
        elif c.calibration != "auto" and not Path(c.calibration).is_file():
            raise ConfigError("cost_model.calibration", c.calibration,
                              "a calibration name, or the path of a calibrated .yaml file "
                              "(python -m calibration from-bench writes one)")
    else:
        raise ConfigError("cost_model.name", c.name, "one of ['constant', 'roofline']")


# (group, schema name, dataclass) registered with Hydra by ``conf.schema``
SCHEMAS = [
    ("cost_model", "base_roofline", RooflineCostConfig),
    ("cost_model", "base_constant", ConstantCostConfig),
]
