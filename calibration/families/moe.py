"""MoE family: the routed experts' grouped GEMMs through ``moe_time``, from ``moe_perf`` rows.

A row (``num_tokens`` T routed top-k over E experts, expert FFN ``inter``, split ``tp`` ways
and over ``ep`` GPUs) becomes the arguments the cost model passes for one GPU: ``T/ep`` tokens,
``inter/tp``, ``E/ep`` local experts and the distinct local experts the measurement touched:
aiconfigurator's ``balanced`` routing spreads the T·k token-expert pairs evenly, so
``min(E, T·k)/ep`` experts are read (the simulator passes the expectation under uniform random
routing, ``E·(1 − (1 − k/E)^T)/ep``, which is what power-law rows are predicted with). The
efficiency is a ``GemmEfficiency`` over the per-expert GEMM
shape (``moe_axes``) plus a cost per touched expert. Fitted on the ``balanced`` routing rows
without expert parallelism: the collector emulates EP on one GPU by running the fused kernel
over all T·k token-expert pairs with only ``E/ep`` experts' weights, so its EP rows carry the
routing work of the other GPUs' pairs, which a real EP deployment (and the simulator) does not
have. EP and power-law rows are predicted under their own labels (``…_ep``, ``…_power_law…``).
Held out: whole MoE geometries (hidden, inter, top-k, experts).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from calibration.families import FitResult, Settings, split, train_and_held_out
from calibration.fitting import TableBasis, TableSpec, fit_roofline_tables, knots, subsample
from sim.cost.operators import GemmEfficiency, expected_distinct_experts, moe_axes, moe_time

KEYS = ["hidden", "inter", "topk", "num_experts"]  # one MoE geometry (a model)
# table dtype → (Efficiency.moe key, weight bytes, peak: fp8 or bf16 tensor cores)
DTYPES = {"bfloat16": ("bfloat16", 2.0, "bf16"), "fp8": ("fp8", 1.0, "fp8"),
          "fp8_block": ("fp8_block", 1.0, "fp8"), "w4a16_mxfp4": ("mxfp4", 4.25 / 8, "bf16")}
KN = knots(0, 16)
SPECS = [TableSpec(("m", "n"), (knots(0, 14, 1.0), KN)),
         TableSpec(("m", "k"), (knots(0, 14, 1.0), KN)),
         TableSpec(("n", "k"), (KN, KN))]


def _peak(hw, kind: str) -> float | None:
    if kind == "fp8":
        return float(hw.fp8_flops) if hw.get("fp8_flops") else None
    return float(hw.bf16_flops)


def arguments(rows: pd.DataFrame) -> dict:
    """``moe_time``'s per-GPU arguments of every row (module doc)."""
    T, E, k = (rows[c].to_numpy(float) for c in ("num_tokens", "num_experts", "topk"))
    ep, tp = rows["ep"].to_numpy(float), rows["tp"].to_numpy(float)
    balanced = (rows["distribution"] == "balanced").to_numpy()
    distinct = np.where(balanced, np.minimum(E, T * k), expected_distinct_experts(T, E, k))
    return {"num_tokens": T / ep, "hidden": rows["hidden"].to_numpy(float),
            "inter": rows["inter"].to_numpy(float) / tp, "num_experts": E / ep, "topk": k,
            "distinct": distinct / ep}


def labels(rows: pd.DataFrame) -> np.ndarray:
    """``moe_<key>`` for balanced routing without EP; ``_ep`` and ``_<distribution>`` mark the
    rest."""
    key = rows["dtype"].map(lambda d: DTYPES.get(d, (d,))[0])
    lab = ("moe_" + key).to_numpy(dtype=object)
    ep = (rows["ep"] > 1).to_numpy()
    lab[ep] = lab[ep] + "_ep"
    other = (rows["distribution"] != "balanced").to_numpy()
    lab[other] = lab[other] + "_" + rows["distribution"].to_numpy(dtype=object)[other]
    return lab


def predict_dtype(e: GemmEfficiency, rows: pd.DataFrame, hw, dtype: str) -> np.ndarray:
    """Predicted seconds of each row through the simulator's ``moe_time``."""
    _, w_bytes, peak = DTYPES[dtype]
    a = arguments(rows)
    t, _ = moe_time(e, a["num_tokens"], a["hidden"], a["inter"], a["num_experts"], a["topk"],
                    a["distinct"], _peak(hw, peak), float(hw.hbm_bandwidth), w_bytes,
                    int(hw.num_sms))
    return np.asarray(t, dtype=np.float64)


def fit_dtype(rows: pd.DataFrame, hw, dtype: str, s: Settings):
    """``GemmEfficiency`` of one expert dtype's grouped GEMMs, and its errors."""
    _, w_bytes, peak = DTYPES[dtype]
    a = arguments(rows)
    pairs = a["num_tokens"] * a["topk"]
    flops = 2.0 * pairs * a["hidden"] * 3 * a["inter"]
    nbytes = (a["distinct"] * 3.0 * a["hidden"] * a["inter"] * w_bytes
              + pairs * (4 * a["hidden"] + 6 * a["inter"]))
    hold = split(rows, KEYS, s)
    idx = subsample(~hold, s.max_train_rows, s.seed)
    x = moe_axes(a["num_tokens"], a["inter"], a["hidden"], a["topk"], a["distinct"])
    basis = TableBasis(SPECS)
    X = basis.matrix({k: np.broadcast_to(v, (len(rows),))[idx] for k, v in x.items()})
    pen = basis.penalty()
    Z = np.stack([np.ones(len(rows)), a["distinct"]], axis=1)[idx]
    pc, pm, c = fit_roofline_tables(flops[idx] / _peak(hw, peak),
                                    nbytes[idx] / float(hw.hbm_bandwidth),
                                    rows["latency_s"].to_numpy(float)[idx], X, X, pen, pen,
                                    s.smoothing, Z=Z)
    e = GemmEfficiency(basis.eta(pc), basis.eta(pm), float(c[0]), per_expert_s=float(c[1]))
    e = GemmEfficiency.from_dict(e.to_dict())
    return e, train_and_held_out(predict_dtype(e, rows, hw, dtype), rows, hold)


def fit(rows: pd.DataFrame, hw, s: Settings) -> FitResult:
    """One expert efficiency per dtype with balanced-routing rows and a peak on this GPU."""
    out = FitResult()
    lab = labels(rows)
    for dtype, (key, _, peak) in DTYPES.items():
        part = rows[(rows["dtype"] == dtype) & (lab == f"moe_{key}")].reset_index(drop=True)
        if part.empty or _peak(hw, peak) is None:
            continue
        train_geoms = part[~split(part, KEYS, s)][KEYS].drop_duplicates()
        if len(train_geoms) < 2:
            out.notes.append(f"moe {key}: not fitted ({len(train_geoms)} MoE geometry outside "
                             "the held-out split)")
            continue
        e, err = fit_dtype(part, hw, dtype, s)
        out.params[key] = e
        out.errors[f"moe_{key}"] = err
    return out


def predict(eff, rows: pd.DataFrame, hw) -> tuple[np.ndarray, np.ndarray]:
    """(label, predicted seconds); dtypes without fitted parameters are NaN."""
    pred = np.full(len(rows), np.nan)
    for dtype, idx in rows.groupby("dtype").indices.items():
        if dtype in DTYPES and DTYPES[dtype][0] in eff.moe and _peak(hw, DTYPES[dtype][2]):
            pred[idx] = predict_dtype(eff.moe[DTYPES[dtype][0]], rows.iloc[idx], hw, dtype)
    return labels(rows), pred
