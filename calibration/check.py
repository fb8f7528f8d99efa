"""``python -m calibration check``: predict every measured row with the current parameters.

Prints n, median and p90 absolute % error per family label (and the same on the held-out
shapes), writes ``check.json`` (``{family: {n, median_abs_pct_error, p90_abs_pct_error, …}}``)
and ``predictions.parquet`` (one row per measurement) into the run's output dir.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.files import atomic_write, write_text
from analysis.inputs import fields_of, read_yaml
from calibration import data
from calibration.config import hardware_config
from calibration.families import attention, comm, elementwise, gemm, moe
from calibration.families import encoder_attention as encoder
from calibration.fit import HELD_OUT_KEYS, settings
from calibration.fitting import held_out_mask
from sim.cost.calibration_file import load_calibration
from sim.cost.operators import Efficiency
from sim.errors import ConfigError


def predict_all(eff, measured: data.Measured, hw, s) -> pd.DataFrame:
    """One frame of every row: family label, measured and predicted seconds, held-out flag."""
    parts = []
    for family, rows in measured.frames.items():
        if rows.empty:
            continue
        if family == "gemm":
            lab, pred = gemm.predict(eff, rows, hw)
        elif family.startswith("attention"):
            lab, pred = attention.predict(eff, family, rows, hw)
        elif family == "comm":
            lab, pred = comm.predict(eff, rows, hw)
        elif family == "moe":
            lab, pred = moe.predict(eff, rows, hw)
        elif family == "encoder_attention":
            lab, pred = encoder.predict(eff, rows, hw)
        else:
            lab, pred = elementwise.predict(eff, rows, hw)
        keys = HELD_OUT_KEYS["attention" if family.startswith("attention") else family]
        held = held_out_mask(rows, keys, s.held_out_fraction, s.seed)
        parts.append(rows.assign(family=lab, measured_s=rows["latency_s"], predicted_s=pred,
                                 held_out=held).drop(columns=["latency_s"]))
    out = pd.concat(parts, ignore_index=True)
    out["abs_pct_error"] = np.abs(out["predicted_s"] / out["measured_s"] - 1.0) * 100
    return out


def summarize(rows: pd.DataFrame) -> dict:
    """``{family: {n, median_abs_pct_error, p90_abs_pct_error, held_out_…}}``; families without
    predictions have ``predicted: false`` and null errors."""
    out = {}
    for family, g in rows.groupby("family", sort=True):
        ape, ho = g["abs_pct_error"], g.loc[g["held_out"], "abs_pct_error"]
        out[family] = {"n": int(len(g)), **_stats(ape, ""), "held_out_n": int(len(ho)),
                       **_stats(ho, "held_out_"), "predicted": bool(ape.notna().all())}
    return out


def _stats(ape: pd.Series, prefix: str) -> dict:
    ape = ape.dropna()
    if ape.empty:
        return {f"{prefix}median_abs_pct_error": None, f"{prefix}p90_abs_pct_error": None}
    return {f"{prefix}median_abs_pct_error": round(float(ape.median()), 2),
            f"{prefix}p90_abs_pct_error": round(float(np.percentile(ape, 90)), 2)}


def table(summary: dict) -> str:
    """The printed table: one line per family."""
    lines = [f"{'family':44s} {'n':>7s} {'median':>7s} {'p90':>7s} | {'held-out n':>10s} "
             f"{'median':>7s} {'p90':>7s}"]
    for fam, v in summary.items():
        lines.append(f"{fam:44s} {v['n']:7d} {_pct(v['median_abs_pct_error'])} "
                     f"{_pct(v['p90_abs_pct_error'])} | {v['held_out_n']:10d} "
                     f"{_pct(v['held_out_median_abs_pct_error'])} "
                     f"{_pct(v['held_out_p90_abs_pct_error'])}")
    return "\n".join(lines)


def _pct(v) -> str:
    return f"{'—':>6s} " if v is None else f"{v:6.2f}%"


def run(cfg, outdir: Path) -> dict:
    """Check the current parameters of (hardware, backend) on ``data_dir``'s rows."""
    t0 = time.perf_counter()
    hw = hardware_config(cfg.hardware)
    name = cfg.calibration or hw.get("calibration") or cfg.hardware
    if str(name).endswith(".yaml"):  # a calibrated file anywhere (e.g. a fit's out=)
        if not Path(name).is_file():
            raise ConfigError("calibration", name, "file not found")
        what = "a calibrated file of python -m calibration fit (a YAML mapping)"
        doc = read_yaml(name, "calibration", what)
        with fields_of(name, "calibration", what):
            eff = Efficiency.from_dict(doc["parameters"])
    else:
        eff, _ = load_calibration(name, cfg.backend, "calibration")
    measured = data.read(cfg)
    rows = predict_all(eff, measured, hw, settings(cfg))
    summary = summarize(rows)
    print(f"calibration {name}/{cfg.backend} on {cfg.data_dir} ({measured.format}): "
          f"{len(rows)} rows")
    print(table(summary))
    outdir.mkdir(parents=True, exist_ok=True)
    write_text(outdir / "check.json", json.dumps(summary, indent=2))
    atomic_write(outdir / "predictions.parquet", lambda p: rows.to_parquet(p, index=False))
    print(f"wrote {outdir / 'check.json'} and predictions.parquet in "
          f"{time.perf_counter() - t0:.1f}s")
    return summary
