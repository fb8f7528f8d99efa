"""GEMM family: ``gemm_time`` per weight dtype, fitted on ``gemm_perf`` rows.

η_compute and η_memory each get three smooth 2-D tables, over (m, n), (m, k) and (n, k), with
knots at every power of 2 of m and every power of 4 of n and k, from 1 to 65536. They capture
the small-M regime (a GEMV reading the weights at a bandwidth that grows with the parallelism
n·k offers), the kernels' tile shapes and the k-loop length. One more factor each for an m
that is not a multiple of 16 (FP8 kernels measured at m = 16j + 1 run up to 20% slower than
at 16j). Tile-and-wave quantization over the SMs is an option of the form
(``GemmEfficiency.tile_m/tile_n``); on the aiconfigurator H100 tables a fixed 128×128 tile
made held-out errors worse (cuBLAS switches tiles with the shape), so the fit leaves it off
unless ``gemm_tile`` is set. The held-out split is by weight shape (n, k): whole matrices.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import scipy.sparse as sp

from calibration.families import FitResult, Settings, split, train_and_held_out
from calibration.fitting import TableBasis, TableSpec, fit_roofline_tables, knots, subsample
from sim.cost.operators import GemmEfficiency, gemm_time, gemm_work, wave_quantization

KEYS = ["n", "k"]
IN_BYTES = {"bfloat16": 2.0, "float16": 2.0, "fp8": 1.0, "fp8_block": 1.0, "int8": 1.0}
M_KNOTS, NK_KNOTS = knots(0, 16, 1.0), knots(0, 16)
SPECS = [TableSpec(("m", "n"), (M_KNOTS, NK_KNOTS)),
         TableSpec(("m", "k"), (M_KNOTS, NK_KNOTS)),
         TableSpec(("n", "k"), (NK_KNOTS, NK_KNOTS))]
ALIGN_M = 16


def peak_flops(hw, dtype: str) -> float | None:
    """Dense peak of the tensor cores for ``dtype`` (None: the GPU has none)."""
    if dtype.startswith("fp8") or dtype == "int8":
        return float(hw.fp8_flops) if hw.get("fp8_flops") else None
    return float(hw.bf16_flops)


def label(dtype: str) -> str:
    """Family label of one dtype's rows (``check`` table, ``errors`` block)."""
    return f"gemm_{dtype}"


def _shape(rows: pd.DataFrame):
    return {c: rows[c].to_numpy(float) for c in ("m", "n", "k")}


def fit_dtype(rows: pd.DataFrame, hw, dtype: str, s: Settings, tile: tuple[int, int] = (0, 0)):
    """``GemmEfficiency`` of one dtype, and its errors through ``gemm_time``."""
    x = _shape(rows)
    peak, bw, in_b = peak_flops(hw, dtype), float(hw.hbm_bandwidth), IN_BYTES[dtype]
    flops, nbytes = gemm_work(x["m"], x["n"], x["k"], in_b)
    if tile[0] and tile[1]:
        flops = flops * wave_quantization(x["m"], x["n"], tile[0], tile[1], int(hw.num_sms))
    hold = split(rows, KEYS, s)
    idx = subsample(~hold, s.max_train_rows, s.seed)
    basis = TableBasis(SPECS)
    m = x["m"][idx]
    unaligned = ((m > ALIGN_M) & (np.mod(m, ALIGN_M) != 0)).astype(float)[:, None]
    X = sp.hstack([basis.matrix({k: v[idx] for k, v in x.items()}), sp.csr_matrix(unaligned)],
                  format="csr")
    pen = basis.penalty()
    pen = sp.hstack([pen, sp.csr_matrix((pen.shape[0], 1))], format="csr")
    pc, pm, launch = fit_roofline_tables(flops[idx] / peak, nbytes[idx] / bw,
                                         rows["latency_s"].to_numpy(float)[idx], X, X, pen, pen,
                                         s.smoothing)
    e = GemmEfficiency(basis.eta(pc[:-1]), basis.eta(pm[:-1]), float(launch[0]), ALIGN_M,
                       float(np.exp(pc[-1])), float(np.exp(pm[-1])), *tile)
    e = GemmEfficiency.from_dict(e.to_dict())  # report errors of the rounded file values
    pred = predict_dtype(e, rows, hw, dtype)
    return e, train_and_held_out(pred, rows, hold)


def predict_dtype(e: GemmEfficiency, rows: pd.DataFrame, hw, dtype: str) -> np.ndarray:
    """Predicted seconds of each row through the simulator's ``gemm_time``."""
    x = _shape(rows)
    t, _ = gemm_time(e, x["m"], x["n"], x["k"], peak_flops(hw, dtype), float(hw.hbm_bandwidth),
                     IN_BYTES[dtype], num_sms=int(hw.num_sms))
    return np.asarray(t, dtype=np.float64)


def fit(rows: pd.DataFrame, hw, s: Settings, tile: tuple[int, int] = (0, 0)) -> FitResult:
    """One ``GemmEfficiency`` per dtype present in ``rows`` that the GPU has a peak for."""
    out = FitResult()
    for dtype, part in rows.groupby("dtype", sort=True):
        if dtype not in IN_BYTES or peak_flops(hw, dtype) is None:
            out.notes.append(f"gemm {dtype}: skipped (no peak or byte width for it)")
            continue
        part = part.reset_index(drop=True)
        e, err = fit_dtype(part, hw, dtype, s, tile)
        out.params[dtype] = e
        out.errors[label(dtype)] = err
    return out


def predict(eff, rows: pd.DataFrame, hw) -> tuple[np.ndarray, np.ndarray]:
    """(label, predicted seconds) of every row whose dtype has fitted parameters (NaN else)."""
    labels = np.array([label(d) for d in rows["dtype"]], dtype=object)
    pred = np.full(len(rows), np.nan)
    for dtype, idx in rows.groupby("dtype").indices.items():
        if dtype in eff.gemm and peak_flops(hw, dtype) is not None:
            pred[idx] = predict_dtype(eff.gemm[dtype], rows.iloc[idx], hw, dtype)
    return labels, pred
