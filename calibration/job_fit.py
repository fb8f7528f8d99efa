"""One number of the diffusion cost model fitted on whole jobs: what ``fit-attention-split``
and ``fit-vae-conv3d`` share.

Rows of a CSV in the layout of ``../shared/data/diffusion/xdit_dev.csv`` are mapped and priced
as ``validate-diffusion`` does (``calibration.validate_diffusion``); the rows on the fit GPUs
whose pipeline has the fitted part are the fit, those on the held-out GPUs only predicted.
The number minimises the fit rows' squared log error (scipy ``minimize_scalar``, bounded);
``report`` prints every row and the errors per split and GPU before and after.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
from scipy.optimize import minimize_scalar

import conf
from calibration.fitting import signed_error_summary
from calibration.silicon_rows import hardware_doc
from calibration.validate_diffusion import plan_rows, read_rows, simulate_rows
from sim.errors import ConfigError

HARDWARE = Path(conf.__file__).parent / "hardware"


def rows_on(table: pd.DataFrame, gpus: list[str], keep: Callable[[str], bool]) -> pd.DataFrame:
    """The mapped rows on ``gpus`` whose model ``keep`` accepts."""
    ok = table[(table["reason"] == "") & table["hardware"].isin(list(gpus))]
    kept = ok["model"].map({m: bool(keep(m)) for m in ok["model"].unique()})
    return ok[kept.astype(bool)].reset_index(drop=True)


def fit_calibration(gpus: list[str], held_out_gpus: list[str]) -> str:
    """The one hardware calibration of the fit GPUs (``ConfigError`` naming the field if the
    GPUs are none, overlap the held-out ones, or span several calibrations)."""
    if not gpus:
        raise ConfigError("gpus", list(gpus), "at least one hardware name to fit on")
    for key, names in (("gpus", gpus), ("held_out_gpus", held_out_gpus)):
        unknown = [g for g in names if not (HARDWARE / f"{g}.yaml").is_file()]
        if unknown:
            raise ConfigError(key, list(names), f"no conf/hardware file for {unknown}; have "
                              f"{sorted(f.stem for f in HARDWARE.glob('*.yaml'))}")
    if set(gpus) & set(held_out_gpus):
        raise ConfigError("held_out_gpus", list(held_out_gpus),
                          f"must not hold out a GPU it fits on ({list(gpus)})")
    cals = {g: (hardware_doc(g) or {}).get("calibration") for g in gpus}
    if None in cals.values() or len(set(cals.values())) != 1:
        raise ConfigError("gpus", list(gpus), "hardware names of one calibration "
                          f"(conf/hardware/<name>.yaml calibration:), got {cals}")
    return next(iter(cals.values()))


def split_rows(csv: str, gpus: list[str], held_out_gpus: list[str],
               keep: Callable[[str], bool]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The CSV's mapped rows whose model ``keep`` accepts: those on ``gpus`` (the fit) and
    those on ``held_out_gpus`` (only predicted)."""
    table = plan_rows(read_rows(Path(csv)))
    return rows_on(table, gpus, keep), rows_on(table, held_out_gpus, keep)


def labelled(fit_rows: pd.DataFrame, held_rows: pd.DataFrame) -> pd.DataFrame:
    """Both splits in one table with a ``split`` column (``fit`` / ``held_out``)."""
    return pd.concat([fit_rows.assign(split="fit"), held_rows.assign(split="held_out")],
                     ignore_index=True)


def predict(rows: pd.DataFrame, backend: str, overrides: list[str]) -> pd.DataFrame:
    """Every row priced with ``overrides``; ``err_pct`` signed. A row the simulator refuses
    (a plan that does not fit in memory) has ``reason`` and no prediction."""
    cfg = SimpleNamespace(backend=backend, overrides=list(overrides))
    return simulate_rows(rows.drop(columns=["pred_s", "err_pct"], errors="ignore"), cfg)


def fit_scalar(rows: pd.DataFrame, backend: str, key: str, bounds: tuple[float, float],
               xatol: float) -> float:
    """The value of override ``key`` in ``bounds`` that minimises the rows' squared log
    error."""
    def loss(x: float) -> float:
        p = predict(rows, backend, [f"{key}={float(x):.6g}"])
        p = p[p["reason"] == ""]
        return float(np.sum(np.log(p["pred_s"] / p["meas_s"]) ** 2))

    return float(minimize_scalar(loss, bounds=bounds, method="bounded",
                                 options={"xatol": xatol}).x)


def errors(p: pd.DataFrame) -> dict:
    """n, median and p90 absolute % error and the signed median of the predicted rows."""
    return signed_error_summary(p.loc[p["reason"] == "", "err_pct"])


def report(rows: pd.DataFrame, before: pd.DataFrame, after: pd.DataFrame) -> dict:
    """Print every row before and after and the errors per (split, GPU); those errors."""
    shown = rows[["split", "model", "hardware", "plan", "meas_s"]].assign(
        pred_before_s=before["pred_s"], err_before_pct=before["err_pct"],
        pred_after_s=after["pred_s"], err_after_pct=after["err_pct"],
        reason=after["reason"].str.slice(0, 70))
    print(shown.round(1).to_string(index=False))
    table_err: dict = {}
    print("\n| split | hardware | n | median abs % before -> after | p90 abs % | signed median % |")
    print("|---|---|---:|---:|---:|---:|")
    for (split, hw), idx in rows.groupby(["split", "hardware"]).groups.items():
        b, a = errors(before.loc[idx]), errors(after.loc[idx])
        table_err.setdefault(split, {})[hw] = {"before": b, "after": a}
        if a["signed_median_pct"] is not None and b["signed_median_pct"] is not None:
            print(f"| {split} | {hw} | {a['n']} | {b['median_abs_pct']} -> "
                  f"{a['median_abs_pct']} | {b['p90_abs_pct']} -> {a['p90_abs_pct']} | "
                  f"{b['signed_median_pct']:+} -> {a['signed_median_pct']:+} |")
    return table_err


def row_labels(rows: pd.DataFrame) -> list[str]:
    """``model hardware plan`` of every row (the fit files' record of what was used)."""
    return [f"{r.model} {r.hardware} {r.plan}" for r in rows.itertuples()]
