"""Collectives: all-reduce from the framework's custom all-reduce table (CUDA-graph rows),
all-gather, all-to-all and reduce-scatter from the NCCL table, all through ``comm_time``.

Form (``CommEfficiency``): the faster of a one-shot algorithm (every GPU reads the whole
message from each peer: latency plus (p − 1)·bytes over the link) and a bandwidth-optimal one
(latency plus β(p)·bytes over the link, β = 2(p − 1)/p for all-reduce, (p − 1)/p for the
others), whose link efficiency is a smooth table over message bytes and GPU count (protocol
and channel changes with the message). Held out: whole message sizes (all GPU counts).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from calibration.families import FitResult, Settings, split, train_and_held_out
from calibration.fitting import LOSS_SCALE, TableBasis, TableSpec, knots
from sim.cost.operators import CommEfficiency, comm_time

KEYS = ["nbytes"]
SPEC = TableSpec(("nbytes", "gpus"), (knots(8, 30, 1.0), knots(1, 3, 1.0)))
KINDS = ("allreduce", "allgather", "alltoall", "reduce_scatter", "p2p")


def labels(rows: pd.DataFrame) -> np.ndarray:
    """The kind for the rows its efficiency is fitted on: the framework's graph-captured custom
    all-reduce when the table has it (else NCCL's), NCCL (or Vidur's) for the other kinds;
    other rows say what they are (``<kind>_<impl>_<variant>``)."""
    kind, impl, variant = (rows[c].astype(str).to_numpy(dtype=object)
                           for c in ("kind", "impl", "variant"))
    custom = (kind == "allreduce") & (impl == "custom") & (variant == "graph")
    primary = np.where(kind == "allreduce", custom if custom.any() else impl != "custom",
                       impl != "custom")
    return np.where(primary, kind, kind + "_" + impl + "_" + variant)


def predict_kind(e: CommEfficiency, kind: str, rows: pd.DataFrame, link_bw: float) -> np.ndarray:
    """Predicted seconds of each row through the simulator's ``comm_time``."""
    sim_kind = "allgather" if kind == "reduce_scatter" else kind  # same bytes per link
    if sim_kind == "p2p":
        return np.asarray(comm_time(e, "p2p", rows["nbytes"].to_numpy(float), 2, link_bw),
                          dtype=np.float64)
    t = comm_time(e, sim_kind, rows["nbytes"].to_numpy(float), rows["num_gpus"].to_numpy(float),
                  link_bw)
    return np.asarray(t, dtype=np.float64)


def fit_kind(rows: pd.DataFrame, kind: str, link_bw: float, s: Settings):
    """``CommEfficiency`` of one collective kind, and its errors (the fit evaluates the same
    formula as ``comm_time`` on the table basis; the errors go through ``comm_time``)."""
    hold = split(rows, KEYS, s)
    train = rows[~hold]
    basis = TableBasis([SPEC])
    nb, p = train["nbytes"].to_numpy(float), train["num_gpus"].to_numpy(float)
    X = basis.matrix({"nbytes": nb, "gpus": p}).toarray()
    pen = basis.penalty().toarray() * s.smoothing * np.sqrt(max(len(train), 1) / 100.0)
    beta = {"allreduce": 2.0 * (p - 1) / p, "p2p": np.ones_like(p)}.get(kind, (p - 1) / p)
    base = beta * nb / link_bw
    if kind == "p2p":
        p = np.full_like(p, 2.0)  # comm_time evaluates p2p's table at 2 GPUs
        X = basis.matrix({"nbytes": nb, "gpus": p}).toarray()
    wide = (p - 1) * nb / link_bw  # one-shot: the whole message from each peer
    y = np.log(train["latency_s"].to_numpy(float))
    one_shot = kind == "allreduce"
    k = basis.size

    def parts(q):
        t2 = q[k] * 1e-6 + base * np.exp(-(X @ q[:k]))
        t1 = q[k + 2] * 1e-6 + wide / max(q[k + 1], 1e-9) if one_shot else np.full_like(t2, np.inf)
        return t1, t2

    def res(q):
        t1, t2 = parts(q)
        return np.concatenate([np.log(np.minimum(t1, t2)) - y, pen @ q[:k]])

    def jac(q):
        t1, t2 = parts(q)
        t, use1 = np.minimum(t1, t2), t1 < t2
        J = np.zeros((len(y), k + 3))
        J[:, :k] = (~use1 * -(t2 - q[k] * 1e-6) / t)[:, None] * X
        J[:, k] = ~use1 * 1e-6 / t
        if one_shot:
            J[:, k + 1] = use1 * -(wide / max(q[k + 1], 1e-9) ** 2) / t
            J[:, k + 2] = use1 * 1e-6 / t
        return np.vstack([J, np.hstack([pen, np.zeros((len(pen), 3))])])

    x0 = np.concatenate([np.full(k, np.log(0.5)), [5.0, 0.5, 3.0]])
    lo = np.concatenate([np.full(k, -12.0), [0.0, 1e-3, 0.0]])
    hi = np.concatenate([np.full(k, 2.0), [1e3, 4.0, 1e3]])
    r = least_squares(res, x0, jac=jac, bounds=(lo, hi), loss="soft_l1", f_scale=LOSS_SCALE,
                      x_scale="jac", max_nfev=500)
    q = r.x
    e = CommEfficiency(basis.eta(q[:k]), q[k] * 1e-6, q[k + 1] if one_shot else 0.0,
                       q[k + 2] * 1e-6 if one_shot else 0.0)
    e = CommEfficiency.from_dict(e.to_dict())
    return e, train_and_held_out(predict_kind(e, kind, rows, link_bw), rows, hold)


def fit(rows: pd.DataFrame, hw, s: Settings) -> FitResult:
    """One ``CommEfficiency`` per kind with rows; NCCL's kinds from half and int8 rows alike
    (all-gather and all-to-all move bytes without arithmetic); reduce-scatter only in
    bf16/half (it reduces)."""
    out = FitResult()
    link = float(hw.nvlink_bandwidth)
    lab = labels(rows)
    for kind in KINDS:
        part = rows[lab == kind]
        if kind == "reduce_scatter":
            part = part[part["dtype"].isin(["half", "bfloat16"])]
        part = part.reset_index(drop=True)
        if len(part) < 8:
            continue
        e, err = fit_kind(part, kind, link, s)
        out.params[kind] = e
        out.errors[kind] = err
    return out


def predict(eff, rows: pd.DataFrame, hw) -> tuple[np.ndarray, np.ndarray]:
    """(label, predicted seconds); rows of kinds or variants without parameters are NaN."""
    lab = labels(rows)
    pred = np.full(len(rows), np.nan)
    for kind in KINDS:
        idx = np.flatnonzero(lab == kind)
        key = kind if kind in eff.comm else "allgather"  # reduce-scatter moves the same bytes
        if len(idx) and key in eff.comm:
            pred[idx] = predict_kind(eff.comm[key], kind, rows.iloc[idx],
                                     float(hw.nvlink_bandwidth))
    return lab, pred
