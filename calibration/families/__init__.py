"""One module per operator family: how its rows are split, fitted and predicted.

Each family module has ``fit(rows, hw, settings) -> FitResult`` and
``predict(eff, rows, hw) -> (family label per row, predicted seconds)``; predictions always go
through the time functions of ``sim.cost.operators`` that the simulator evaluates.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from calibration.fitting import error_stats, held_out_mask


@dataclass(frozen=True)
class Settings:
    """Fit settings shared by every family (``conf/calibration/calibration.yaml``)."""

    held_out_fraction: float = 0.2
    seed: int = 0
    max_train_rows: int = 12000
    smoothing: float = 0.1


@dataclass
class FitResult:
    """Fitted parameters of one family (keyed as in ``Efficiency``), errors and notes."""

    params: dict = field(default_factory=dict)
    errors: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def split(rows: pd.DataFrame, keys: list[str], s: Settings) -> np.ndarray:
    """Held-out mask: a seeded fraction of the distinct shapes ``keys``."""
    return held_out_mask(rows, keys, s.held_out_fraction, s.seed)


def train_and_held_out(pred: np.ndarray, rows: pd.DataFrame, hold: np.ndarray) -> dict:
    """Error statistics of predictions on the fitted and the held-out rows."""
    meas = rows["latency_s"].to_numpy(float)
    return {"train": error_stats(pred[~hold], meas[~hold]),
            "held_out": error_stats(pred[hold], meas[hold])}
