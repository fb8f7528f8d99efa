"""Elementwise family: memory-bound kernels (norms, rotary, activation, residual add).

The cost model prices them as ``nbytes / (peak_bw · elementwise_eta_memory) + kernels ·
elementwise_launch_s`` (``sim.cost.pricing.Pricer.elementwise``); the same two numbers are
fitted here on Vidur's per-op timings. Held out: whole (model, op) tables.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from calibration.families import FitResult, Settings, split, train_and_held_out
from calibration.fitting import LOSS_SCALE

KEYS = ["source"]


def elementwise_time(eta_memory: float, launch_s: float, nbytes, kernels, peak_bw: float):
    """The cost model's elementwise time (see module doc)."""
    return np.asarray(nbytes, dtype=np.float64) / (peak_bw * eta_memory) + kernels * launch_s


def fit(rows: pd.DataFrame, hw, s: Settings) -> FitResult:
    """``elementwise_eta_memory`` and ``elementwise_launch_s`` from the rows."""
    out = FitResult()
    if rows is None or rows.empty:
        return out
    rows = rows.reset_index(drop=True)
    bw = float(hw.hbm_bandwidth)
    hold = split(rows, KEYS, s)
    tr = rows[~hold]
    nb, kern = tr["nbytes"].to_numpy(float), tr["kernels"].to_numpy(float)
    y = np.log(tr["latency_s"].to_numpy(float))
    r = least_squares(lambda p: np.log(elementwise_time(p[0], p[1] * 1e-6, nb, kern, bw)) - y,
                      [0.7, 3.0], bounds=([1e-3, 0.0], [1.5, 1e3]), loss="soft_l1",
                      f_scale=LOSS_SCALE)
    eta, launch = float(f"{r.x[0]:.5g}"), float(f"{r.x[1] * 1e-6:.5g}")
    pred = elementwise_time(eta, launch, rows["nbytes"], rows["kernels"].to_numpy(float), bw)
    out.params = {"elementwise_eta_memory": eta, "elementwise_launch_s": launch}
    out.errors["elementwise"] = train_and_held_out(pred, rows, hold)
    return out


def predict(eff, rows: pd.DataFrame, hw) -> tuple[np.ndarray, np.ndarray]:
    """(label, predicted seconds) of every row."""
    pred = elementwise_time(eff.elementwise_eta_memory, eff.elementwise_launch_s,
                            rows["nbytes"], rows["kernels"].to_numpy(float),
                            float(hw.hbm_bandwidth))
    return np.full(len(rows), "elementwise", dtype=object), pred
