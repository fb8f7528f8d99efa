"""A one-screen summary of a profiler output folder: rows per table and the best achieved
compute and memory rates (a sanity check against the GPU's peaks).

    python -m calibration.profile.summary DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from calibration.profile.shapes import AttentionShape, GemmShape, MoeShape


def _work(table: str, df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray] | None:
    """(FLOPs, bytes) per row through the plan's own work formulas, or None for collectives."""
    make = {
        "gemm_perf": lambda r: GemmShape(r.m, r.n, r.k, r.gemm_dtype),
        "context_attention_perf": lambda r: AttentionShape(
            r.batch_size, r.isl, 0, r.num_heads, r.num_key_value_heads, r.head_dim),
        "generation_attention_perf": lambda r: AttentionShape(
            r.batch_size, 1, r.step, r.num_heads, r.num_key_value_heads, r.head_dim),
        "moe_perf": lambda r: MoeShape(r.num_tokens, r.hidden_size, r.inter_size, r.topk,
                                       r.num_experts),
    }.get(table)
    if make is None:
        return None
    work = np.array([make(r).work() for r in df.itertuples()], dtype=np.float64)
    return work[:, 0], work[:, 1]


def summarize(out_dir: Path) -> pd.DataFrame:
    """One row per table under ``out_dir``: where, how many rows, latency range (ms), and the
    highest TFLOP/s and TB/s any row reached (collectives: algorithm bandwidth)."""
    rows = []
    for path in sorted(Path(out_dir).rglob("*.parquet")):
        df = pd.read_parquet(path)
        t = df["latency"].to_numpy(np.float64) * 1e-3
        work = _work(path.stem, df)
        if work is None:
            flops, nbytes = np.zeros_like(t), df["message_size"].to_numpy(np.float64) * 2.0
        else:
            flops, nbytes = work
        rows.append({
            "table": str(path.relative_to(out_dir).parent / path.stem),
            "rows": len(df),
            "min_ms": t.min() * 1e3,
            "median_ms": float(np.median(t)) * 1e3,
            "max_ms": t.max() * 1e3,
            "best_TFLOP/s": (flops / t).max() / 1e12,
            "best_TB/s": (nbytes / t).max() / 1e12,
        })
    return pd.DataFrame(rows)


if __name__ == "__main__":
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_dir():
        print("usage: python -m calibration.profile.summary DIR", file=sys.stderr)
        raise SystemExit(2)
    print(summarize(Path(sys.argv[1])).to_string(index=False, float_format="%.4g"))
