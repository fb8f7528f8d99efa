"""GEMM family: ``gemm_time`` per weight dtype, fitted on ``gemm_perf`` rows.

η_compute and η_memory each get three smooth 2-D tables, over (m, n), (m, k) and (n, k), with
knots at every power of 2 of m and every power of 4 of n and k, from 1 to 65536. They capture
the small-M regime (a GEMV reading the weights at a bandwidth that grows with the parallelism
n·k offers), the kernels' tile shapes and the k-loop length. Three more tables capture the
quantization effects of tiled kernels (``sim.cost.gemm``): (a, m), an m that is not a multiple
of 16 (FP8 kernels measured at m = 16j + 1 run 1.1–2.5× slower than at 16j, the most at
m = 257…1025); (f, m), the fill of the last 128-row tile (SGLang's FP8 GEMM at m = 129…256
costs about what m = 256 does); and (m, nk), the weight's size at every power of 2 (where it
stops fitting in L2, and how a GEMV splits it). A fixed cost for a k that is not a whole
number of 128-wide blocks is fitted with the launch latency (vLLM's block-scaled FP8 runs
k = 32, 64 on a ~0.1 ms fallback kernel). A table over the fill of the last wave of 128×128
tiles over the SMs gained under 1 point of p90 and, on noise-free synthetic timings, mistook
a smooth efficiency for a wave effect, so the form has none; nor does it multiply the compute
work by a fixed 128×128 tile (``gemm_tile``; it pads a GEMV 128-fold) unless ``gemm_tile`` is
set. The held-out split is by weight shape (n, k): whole matrices.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from calibration.families import FitResult, Settings, split, train_and_held_out
from calibration.fitting import TableBasis, TableSpec, fit_roofline_tables, knots, subsample
from sim.cost.gemm import (
    GemmEfficiency,
    gemm_axes,
    gemm_time,
    gemm_work,
    wave_quantization,
)

KEYS = ["n", "k"]
IN_BYTES = {"bfloat16": 2.0, "float16": 2.0, "fp8": 1.0, "fp8_block": 1.0, "int8": 1.0}
M_KNOTS, NK_KNOTS = knots(0, 16, 1.0), knots(0, 16)
FILL_KNOTS = knots(-1, 0, 0.25)  # the last tile half full (or less) … full
SPECS = [TableSpec(("m", "n"), (M_KNOTS, NK_KNOTS)),
         TableSpec(("m", "k"), (M_KNOTS, NK_KNOTS)),
         TableSpec(("n", "k"), (NK_KNOTS, NK_KNOTS)),
         TableSpec(("a", "m"), ((0.0, 1.0), M_KNOTS)),
         TableSpec(("f", "m"), (FILL_KNOTS, M_KNOTS)),
         TableSpec(("m", "nk"), (M_KNOTS, knots(10, 32, 1.0)))]
ALIGN_M = 16
BLOCK_K = 128


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
    axes = gemm_axes(x["m"][idx], x["n"][idx], x["k"][idx], ALIGN_M)
    X, pen = basis.matrix(axes), basis.penalty()
    partial = (np.mod(x["k"][idx], BLOCK_K) != 0).astype(float)
    pc, pm, c = fit_roofline_tables(flops[idx] / peak, nbytes[idx] / bw,
                                    rows["latency_s"].to_numpy(float)[idx], X, X, pen, pen,
                                    s.smoothing, Z=np.stack([np.ones(len(idx)), partial], 1))
    e = GemmEfficiency(basis.eta(pc), basis.eta(pm), float(c[0]), ALIGN_M, tile_m=tile[0],
                       tile_n=tile[1], block_k=BLOCK_K, partial_block_s=float(c[1]))
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
