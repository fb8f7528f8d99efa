"""Attention families: prefill (``context_attention_perf``) and decode
(``generation_attention_perf``), both through ``attention_time``.

Rows become the simulator's arguments exactly as the cost model forms them: work from
``prefill_attention_work`` / ``decode_attention_work`` summed over the batch, ``q_per_seq``
the prompt length (prefill) or 1 (decode), ``num_seqs`` the batch, plus head dim and KV heads.

Fitted on full-attention rows with a bf16 KV cache and head dims up to 256 (vLLM's FA3
kernels; head dim 512 runs another kernel). An fp8 cache halves the bytes but not the time
(dequantization; decode is 5–15% slower than bytes predict, prefill differs by kernel), and
``attention_time`` does not see the cache dtype, so fp8-cache rows are not fitted. The other
rows (sliding windows, fp8 cache, head dim 512) are still predicted by ``check`` under their
own labels, so their error is visible. Held out: whole head layouts
(query heads, KV heads, head dim), i.e. whole models.

Decode tables also vary with g, the query heads per KV head: TensorRT-LLM's decode kernel
(XQA) takes groups of up to 32 query heads per KV head; larger groups (64/1, 96/1–2, 128/1–2)
run a generic kernel whose time grows with the query heads rather than the KV heads, up to 15×
slower. (g, u) says how the grouping and the parallel units (sequences × KV heads) interact,
(i, u) how the arithmetic intensity does. g has knots at every half power of 2 (g = 48 runs
another kernel than g = 32), c at every power of 2 (XQA switches its multi-block split at
given context lengths).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from calibration.families import FitResult, Settings, split, train_and_held_out
from calibration.fitting import TableBasis, TableSpec, fit_roofline_tables, knots, subsample
from calibration.rows import KV_BYTES
from sim.cost.operators import (
    AttentionEfficiency,
    attention_axes,
    attention_time,
    decode_attention_work,
    prefill_attention_work,
)

KEYS = ["num_heads", "num_kv_heads", "head_dim"]
AXES = {"q": knots(0, 14, 1.0), "s": knots(0, 11, 1.0), "u": knots(0, 16, 1.0),
        "d": knots(6, 9, 1.0), "kv": knots(8, 32), "c": knots(0, 18, 1.0),
        "i": knots(-2, 10, 1.0), "g": knots(0, 7, 0.5)}
TERMS = {"attention_prefill": [("q", "s"), ("q", "kv"), ("s", "kv"), ("q", "d")],
         "attention_decode": [("u", "c"), ("c", "d"), ("u", "d"), ("s", "kv"), ("i", "c"),
                              ("g", "u"), ("i", "u")]}
BLOCK_Q = 128


def _pairs_keys(q, ctx, window):
    """Query-key pairs and keys read per sequence, each query seeing ≤ ``window`` keys."""
    w = np.where(window > 0, window, np.inf)
    below = np.clip(w - ctx - 1, 0, q)  # queries that still see fewer than `window` keys
    pairs = below * (ctx + 1) + below * (below - 1) / 2 + (q - below) * np.minimum(w, 1e18)
    pairs = np.where(window > 0, pairs, q * (ctx + (q + 1) / 2.0))
    keys = np.where(window > 0, np.minimum(ctx + q, q + w - 1), ctx + q)
    return pairs, keys


def arguments(rows: pd.DataFrame, family: str) -> dict:
    """``attention_time``'s arguments for every row (work summed over the batch)."""
    b = rows["batch_size"].to_numpy(float)
    h, kvh, d = (rows[c].to_numpy(float) for c in KEYS)
    kvb = rows["kv_dtype"].map(KV_BYTES).to_numpy(float)
    ctx, window = rows["ctx"].to_numpy(float), rows["window"].to_numpy(float)
    q = rows["q"].to_numpy(float) if family == "attention_prefill" else np.ones(len(rows))
    if family == "attention_prefill":
        f1, b1 = prefill_attention_work(q, ctx, h, kvh, d, kvb)
        flops, nbytes = b * f1, b * b1
    else:
        flops, nbytes = decode_attention_work(b * ctx, b, h, kvh, d, kvb)
    windowed = window > 0
    if windowed.any():  # sliding-window rows: same formulas over the keys the window admits
        pairs, keys = _pairs_keys(q, ctx, window)
        f_w = b * 4.0 * h * d * pairs
        b_w = b * (keys * 2.0 * kvh * d * kvb + 2.0 * q * h * d * 2.0)
        flops, nbytes = np.where(windowed, f_w, flops), np.where(windowed, b_w, nbytes)
    return {"flops": flops, "nbytes": nbytes, "q_per_seq": q, "num_seqs": b, "head_dim": d,
            "kv_heads": kvh, "heads": h}


def labels(rows: pd.DataFrame, family: str) -> np.ndarray:
    """The fitted rows keep the family's name; the others say how they differ."""
    lab = np.full(len(rows), family, dtype=object)
    lab[(rows["kv_dtype"] != "bfloat16").to_numpy()] = f"{family}_fp8_kv"
    lab[(rows["head_dim"] > 256).to_numpy()] = f"{family}_head_dim_512"
    lab[(rows["window"] > 0).to_numpy()] = f"{family}_windowed"
    return lab


def predict_family(e: AttentionEfficiency, rows: pd.DataFrame, hw, family: str) -> np.ndarray:
    """Predicted seconds of each row through the simulator's ``attention_time``."""
    a = arguments(rows, family)
    t, _ = attention_time(e, a["flops"], a["nbytes"], a["q_per_seq"], a["num_seqs"],
                          float(hw.bf16_flops), float(hw.hbm_bandwidth), a["head_dim"],
                          a["kv_heads"], int(hw.num_sms), a["heads"])
    return np.asarray(t, dtype=np.float64)


def fit_family(rows: pd.DataFrame, hw, family: str, s: Settings):
    """``AttentionEfficiency`` of ``family`` from its fitted rows, and its errors."""
    rows = rows[labels(rows, family) == family].reset_index(drop=True)
    a = arguments(rows, family)
    hold = split(rows, KEYS, s)
    idx = subsample(~hold, s.max_train_rows, s.seed)
    basis = TableBasis([TableSpec(t, tuple(AXES[x] for x in t)) for t in TERMS[family]])
    x = attention_axes(a["flops"], a["nbytes"], a["q_per_seq"], a["num_seqs"], a["head_dim"],
                       a["kv_heads"], a["heads"])
    x = {k: np.broadcast_to(v, (len(rows),))[idx] for k, v in x.items()}
    X, pen = basis.matrix(x), basis.penalty()
    units = a["num_seqs"] * a["kv_heads"] * np.ceil(a["q_per_seq"] / BLOCK_Q) / int(hw.num_sms)
    Z = np.stack([np.ones(len(rows)), units], axis=1)[idx]
    pc, pm, c = fit_roofline_tables(a["flops"][idx] / float(hw.bf16_flops),
                                    a["nbytes"][idx] / float(hw.hbm_bandwidth),
                                    rows["latency_s"].to_numpy(float)[idx], X, X, pen, pen,
                                    s.smoothing, Z=Z)
    e = AttentionEfficiency(basis.eta(pc), basis.eta(pm), float(c[0]), float(c[1]), BLOCK_Q)
    e = AttentionEfficiency.from_dict(e.to_dict())
    return e, train_and_held_out(predict_family(e, rows, hw, family), rows, hold)


def fit(frames: dict, hw, s: Settings) -> FitResult:
    """Prefill and decode efficiencies from whichever of the two tables are present."""
    out = FitResult()
    for family in ("attention_prefill", "attention_decode"):
        rows = frames.get(family)
        if rows is None or rows.empty:
            continue
        e, err = fit_family(rows, hw, family, s)
        out.params[family] = e
        out.errors[family] = err
    return out


def predict(eff, family: str, rows: pd.DataFrame, hw) -> tuple[np.ndarray, np.ndarray]:
    """(label, predicted seconds) of every row of ``family``."""
    e = eff.attention_prefill if family == "attention_prefill" else eff.attention_decode
    return labels(rows, family), predict_family(e, rows, hw, family)
