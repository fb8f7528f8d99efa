"""The report of ``python -m calibration validate``: signed errors per row, the per-backend
summary, the worst rows, the rows not simulated, and the written files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.files import atomic_write, write_text

METRICS = ("ttft", "tpot")
SHOWN = ["id", "backend", "model", "tp", "ep", "dtype", "isl", "osl", "concurrency",
         "pred_ttft_ms", "meas_ttft_ms", "ttft_err_pct", "pred_tpot_ms", "meas_tpot_ms",
         "tpot_err_pct", "note"]


def add_errors(table: pd.DataFrame) -> pd.DataFrame:
    """Signed % error columns ``<metric>_err_pct`` = (pred − meas) / meas × 100."""
    for m in METRICS:
        table[f"{m}_err_pct"] = (table[f"pred_{m}_ms"] / table[f"meas_{m}_ms"] - 1.0) * 100
    return table


def error_summary(table: pd.DataFrame) -> dict:
    """``{backend: {metric: {n, median_abs_pct_error, p90_abs_pct_error}}}`` over simulated rows
    (plus ``all``)."""
    out: dict[str, dict] = {}
    done = table[table["pred_ttft_ms"].notna()]
    for name, part in [*done.groupby("backend"), ("all", done)]:
        out[name] = {}
        for m in METRICS:
            ape = part[f"{m}_err_pct"].abs().dropna().to_numpy()
            out[name][m] = {
                "n": int(len(ape)),
                "median_abs_pct_error": round(float(np.median(ape)), 2) if len(ape) else None,
                "p90_abs_pct_error": round(float(np.percentile(ape, 90)), 2) if len(ape) else None,
            }
    return out


def worst_rows(table: pd.DataFrame, k: int) -> pd.DataFrame:
    """The ``k`` rows of largest absolute error per backend and metric."""
    parts = []
    for m in METRICS:
        t = table[table[f"{m}_err_pct"].notna()].assign(metric=m, abs_err=lambda d, m=m:
                                                       d[f"{m}_err_pct"].abs())
        parts.append(t.sort_values("abs_err", ascending=False).groupby("backend").head(k))
    return pd.concat(parts) if parts else table.head(0)


def _fmt(df: pd.DataFrame) -> str:
    return df.to_string(index=False, float_format=lambda v: f"{v:.1f}")


def format_report(table: pd.DataFrame, summary: dict, k: int) -> str:
    """The printed report: per-row errors, the per-backend summary, worst rows, unsupported."""
    done = table[table["pred_ttft_ms"].notna()]
    skipped = table[table["reason"] != ""]
    parts = ["Per-row errors (err% = (pred - meas) / meas * 100; pred = mean over the measured "
             "requests):", _fmt(done[SHOWN]) if len(done) else "(no row simulated)", "",
             "Absolute % error per backend and metric:"]
    rows = [{"backend": b, "metric": m, **v} for b, d in summary.items() for m, v in d.items()]
    parts += [_fmt(pd.DataFrame(rows)) if rows else "(none)", ""]
    if len(done) and k:
        w = worst_rows(done, k)
        parts += [f"Worst {k} rows per backend and metric:",
                  _fmt(w[["metric", *SHOWN[:9], "pred_ttft_ms", "meas_ttft_ms", "ttft_err_pct",
                          "pred_tpot_ms", "meas_tpot_ms", "tpot_err_pct",
                          "pred_decode_step_ms", "pred_host_share"]]), ""]
    parts.append(f"Rows not simulated: {len(skipped)} of {len(table)}")
    if len(skipped):
        g = (skipped.groupby(["model_path", "backend", "reason"], dropna=False)
             .agg(rows=("id", "size"), example=("id", "first")).reset_index())
        parts.append(g.to_string(index=False, max_colwidth=110))
    return "\n".join(parts)


def write_outputs(outdir: Path, table: pd.DataFrame, doc: dict) -> None:
    """``rows.parquet`` (every row, simulated or not) and ``validate.json``."""
    outdir.mkdir(parents=True, exist_ok=True)
    atomic_write(outdir / "rows.parquet", lambda p: table.to_parquet(p, index=False))
    write_text(outdir / "validate.json", json.dumps(doc, indent=2, default=str) + "\n")
