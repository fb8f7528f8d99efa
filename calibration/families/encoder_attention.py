"""Non-causal (encoder, DiT) attention: ``encoder_attention_perf``, through ``attention_time``.

Rows become the simulator's arguments as ``Pricer.encoder_attention`` forms them: work from
``encoder_attention_work`` (every one of ``seq`` queries over all ``seq`` keys), ``q_per_seq``
the sequence, ``num_seqs`` the batch, and every head its own K/V (``kv_heads`` = heads), so the
parallel work units ``u`` are batch × heads. The compute η varies with the sequence and the
work units together (``q``, ``u``: short sequences and few units leave SMs idle) and with the
head dim ``d`` (FlashAttention pads 72 and 80 to 96, so measured η dips there); the memory η
(short sequences only) with (``q``, ``u``) and (``q``, ``d``): at one token, head dims 72 and
80 run a path twice as slow as 64's.

Extrapolation, both checked by ``tests/calibration/test_encoder_attention.py``:

- sequences beyond the tables' 65,536 tokens keep the η at 65,536 (tables are constant beyond
  their knots); η has saturated by 16k tokens (within a few % up to 64k);
- the tables have head dims 64, 72 and 80 only. At head dim 64 and long sequences the
  non-causal η equals the causal prefill kernel's (H100: 0.52 vs 0.53 vLLM, 0.52 vs 0.52
  SGLang, 0.46 vs 0.46 TensorRT-LLM), so the head-dim factor at 128 is the one at 64 times the
  ratio η(128)/η(64) of the same backend's calibrated *prefill* efficiency at a long
  sequence (``anchor_head_dim``), between 80 and 128 interpolated, constant beyond 128.

Held out: whole head layouts (query heads, head dim).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from calibration.families import FitResult, Settings, split, train_and_held_out
from calibration.fitting import TableBasis, TableSpec, fit_roofline_tables, knots, subsample
from sim.cost.operators import (
    AttentionEfficiency,
    Eta,
    Term,
    attention_axes,
    attention_time,
    encoder_attention_work,
    prefill_attention_work,
)

FAMILY = "encoder_attention"
KEYS = ["num_heads", "head_dim"]
D_KNOTS = (6.0, float(np.log2(72)), float(np.log2(80)), 7.0)  # measured 64, 72, 80; anchor 128
AXES = {"q": knots(0, 16, 1.0), "u": knots(0, 11, 1.0), "d": D_KNOTS}
# memory-bound rows are short sequences, never a DiT's: their head-dim factor stays at 80's
# beyond the tables rather than borrowing the compute anchor
MEMORY_AXES = {**AXES, "d": D_KNOTS[:3]}
COMPUTE_TERMS = [("q", "u"), ("d",)]
MEMORY_TERMS = [("q", "u"), ("q", "d")]
BLOCK_Q = 128
ANCHOR_SEQ = 16384.0  # the prefill tables' longest prompt: η has saturated there
ANCHOR_HEADS = 16.0


def arguments(rows: pd.DataFrame) -> dict:
    """``attention_time``'s arguments for every row."""
    b, seq, h, d = (rows[c].to_numpy(float) for c in ("batch_size", "seq", "num_heads",
                                                        "head_dim"))
    flops, nbytes = encoder_attention_work(b, seq, seq, h, d)
    return {"flops": flops, "nbytes": nbytes, "q_per_seq": seq, "num_seqs": b, "head_dim": d,
            "kv_heads": h}


def labels(rows: pd.DataFrame, eff=None) -> np.ndarray:
    """Every row is the family's; predicted by the prefill efficiency (a calibration without
    an encoder block) they say so."""
    name = FAMILY if eff is None or eff.attention_encoder is not None else f"{FAMILY}_fallback"
    return np.full(len(rows), name, dtype=object)


def predict_family(e: AttentionEfficiency, rows: pd.DataFrame, hw) -> np.ndarray:
    """Predicted seconds of each row through the simulator's ``attention_time``."""
    a = arguments(rows)
    t, _ = attention_time(e, a["flops"], a["nbytes"], a["q_per_seq"], a["num_seqs"],
                          float(hw.bf16_flops), float(hw.hbm_bandwidth), a["head_dim"],
                          a["kv_heads"], int(hw.num_sms))
    return np.asarray(t, dtype=np.float64)


def prefill_head_dim_ratio(prefill: AttentionEfficiency, d: float, d0: float = 64.0) -> float:
    """η_compute of the causal prefill kernel at head dim ``d`` over that at ``d0``, for one
    long prompt (``ANCHOR_SEQ`` tokens, ``ANCHOR_HEADS`` heads) where both are compute-bound."""
    etas = []
    for dd in (d, d0):
        f, b = prefill_attention_work(ANCHOR_SEQ, 0.0, ANCHOR_HEADS, ANCHOR_HEADS, dd, 2.0)
        x = attention_axes(f, b, ANCHOR_SEQ, 1.0, dd, ANCHOR_HEADS, ANCHOR_HEADS)
        etas.append(float(prefill.compute(**x)))
    return etas[0] / etas[1]


def anchor_head_dim(compute: Eta, prefill: AttentionEfficiency) -> Eta:
    """``compute`` with its head-dim factor at 128 set to the one at 64 times the prefill
    kernel's ratio η(128)/η(64) (no encoder table reaches 128; see the module docstring)."""
    terms = []
    for t in compute.terms:
        if t.axes == ("d",):
            f = np.array(t.log_factor, dtype=np.float64)
            f[-1] = f[0] + np.log(prefill_head_dim_ratio(prefill, 2.0 ** t.log2_knots[0][-1],
                                                         2.0 ** t.log2_knots[0][0]))
            t = Term(t.axes, t.log2_knots, f)
        terms.append(t)
    return Eta(compute.scale, tuple(terms))


def fit_rows(rows: pd.DataFrame, hw, s: Settings,
             prefill: AttentionEfficiency | None) -> tuple[AttentionEfficiency, dict]:
    """``AttentionEfficiency`` of the rows (head dim 128 anchored on ``prefill`` when given,
    else left where the smoothing puts it), and its train and held-out errors."""
    rows = rows.reset_index(drop=True)
    a = arguments(rows)
    hold = split(rows, KEYS, s)
    idx = subsample(~hold, s.max_train_rows, s.seed)
    x = attention_axes(a["flops"], a["nbytes"], a["q_per_seq"], a["num_seqs"], a["head_dim"],
                       a["kv_heads"])
    x = {k: np.broadcast_to(v, (len(rows),))[idx] for k, v in x.items()}
    bc = TableBasis([TableSpec(t, tuple(AXES[v] for v in t)) for t in COMPUTE_TERMS])
    bm = TableBasis([TableSpec(t, tuple(MEMORY_AXES[v] for v in t)) for t in MEMORY_TERMS])
    units = a["num_seqs"] * a["kv_heads"] * np.ceil(a["q_per_seq"] / BLOCK_Q) / int(hw.num_sms)
    Z = np.stack([np.ones(len(rows)), units], axis=1)[idx]
    pc, pm, c = fit_roofline_tables(a["flops"][idx] / float(hw.bf16_flops),
                                    a["nbytes"][idx] / float(hw.hbm_bandwidth),
                                    rows["latency_s"].to_numpy(float)[idx], bc.matrix(x),
                                    bm.matrix(x), bc.penalty(), bm.penalty(), s.smoothing, Z=Z)
    compute = bc.eta(pc)
    if prefill is not None:
        compute = anchor_head_dim(compute, prefill)
    e = AttentionEfficiency(compute, bm.eta(pm), float(c[0]), float(c[1]), BLOCK_Q)
    e = AttentionEfficiency.from_dict(e.to_dict())
    return e, train_and_held_out(predict_family(e, rows, hw), rows, hold)


def fit(rows: pd.DataFrame | None, hw, s: Settings,
        prefill: AttentionEfficiency | None = None) -> FitResult:
    """The ``attention_encoder`` efficiency (bf16 rows), when there are rows."""
    out = FitResult()
    if rows is None or rows.empty:
        return out
    rows = rows[rows["dtype"].isin(["bfloat16", "float16"])]
    e, err = fit_rows(rows, hw, s, prefill)
    out.params["attention_encoder"], out.errors[FAMILY] = e, err
    if prefill is None:
        out.notes.append("attention_encoder: no prefill efficiency to anchor head dim 128 on; "
                         "its factor there is the smoothing's extrapolation of 64-80")
    else:
        out.notes.append(
            "attention_encoder: head dims 64/72/80 and sequences up to 65,536 measured; η is "
            "constant beyond 65,536 tokens, and at head dim 128 it is the head-dim-64 η times "
            "the prefill kernel's η(128)/η(64) = "
            f"{prefill_head_dim_ratio(prefill, 128.0):.3f} at {int(ANCHOR_SEQ)} tokens (at "
            "head dim 64 the measured non-causal and causal η agree at long sequences)")
    return out


def predict(eff, rows: pd.DataFrame, hw) -> tuple[np.ndarray, np.ndarray]:
    """(label, predicted seconds) of every row; a calibration without the encoder block
    predicts with ``attention_prefill``, as ``Pricer.encoder_attention`` does."""
    e = eff.attention_encoder or eff.attention_prefill
    return labels(rows, eff), predict_family(e, rows, hw)
