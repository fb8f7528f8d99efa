"""Time-binned, step-time-weighted means of timeline columns, per replica, for the plots.

The rows come from the run's in-memory timeline or from the ``timeline.parquet`` it streamed
(``sim.timeline_file``), read a row group at a time, so a plot of millions of steps holds only
its bins. A bin's value is ``Σ x·w / Σ w`` over the engine steps whose start falls in it, with
``w`` the step time (the KV-transfer rows of a disaggregated run are left out).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from analysis.metrics import step_rows

BASE = ("replica", "time_s", "step_time_s")


def _file(meta: dict) -> Path | None:
    path = meta.get("timeline_file")
    return Path(path) if path else None


def step_batches(timeline: pd.DataFrame, meta: dict, columns: list[str]
                 ) -> Iterator[dict[str, np.ndarray]]:
    """The run's engine-step rows as column arrays (``replica``, ``time_s``,
    ``step_time_s`` and ``columns``): the in-memory timeline at once, or its streamed file a
    row group at a time."""
    want = list(dict.fromkeys([*BASE, *columns]))
    path = _file(meta)
    if path is None:
        tl = step_rows(timeline)
        out = {c: tl[c].to_numpy() for c in want if c in tl}
        out.setdefault("replica", np.zeros(len(tl), np.int32))
        yield out
        return
    f = pq.ParquetFile(path)
    for i in range(f.num_row_groups):
        group = f.read_row_group(i, columns=[*want, "kind"])
        step = group.column("kind").combine_chunks().indices.to_numpy(zero_copy_only=False) == 0
        yield {c: group.column(c).to_numpy()[step] for c in want}


def time_span(timeline: pd.DataFrame, meta: dict) -> tuple[float, float]:
    """(first step start, last step end) of the run's engine steps."""
    lo, hi = np.inf, -np.inf
    for b in step_batches(timeline, meta, []):
        if len(b["time_s"]):
            lo = min(lo, float(b["time_s"].min()))
            hi = max(hi, float((b["time_s"] + b["step_time_s"]).max()))
    return (lo, hi) if lo <= hi else (0.0, 0.0)


def _add(total: np.ndarray, key: np.ndarray, x: np.ndarray, rows: int) -> np.ndarray:
    """``total`` (replica rows × bins, grown to ``rows``) plus ``x`` summed by ``key`` =
    replica × bins + bin."""
    points = total.shape[1]
    out = np.zeros((rows, points))
    out[:len(total)] = total
    return out + np.bincount(key, weights=x, minlength=rows * points).reshape(rows, points)


def binned(timeline: pd.DataFrame, meta: dict, values: dict, points: int,
           span: tuple[float, float], by_replica: bool = True) -> pd.DataFrame:
    """Per replica (``by_replica``; else every replica's steps together, as replica 0) and
    time bin (``points`` bins over ``span``, the run's ``time_span``), the step-time-weighted
    mean of each of ``values`` (name → (columns read, function of a batch giving the value
    per step)); one row per non-empty bin, with its mid ``time_s`` and ``replica``."""
    lo, hi = span
    edges = np.linspace(lo, max(hi, lo + 1e-12), points + 1)
    columns = sorted({c for cols, _ in values.values() for c in cols})
    # (replica, bin) sums, one row of ``points`` bins per replica id, grown as ids appear
    weight = np.zeros((0, points))
    sums = {name: np.zeros((0, points)) for name in values}
    for b in step_batches(timeline, meta, columns):
        bins = np.clip(np.searchsorted(edges, b["time_s"], side="right") - 1, 0, points - 1)
        w = b["step_time_s"]
        replica = (b["replica"].astype(np.int64) if by_replica
                   else np.zeros(len(w), np.int64))
        if not len(w):
            continue
        rows = max(int(replica.max()) + 1, len(weight))
        key = replica * points + bins  # one bincount per value, every replica at once
        weight = _add(weight, key, w, rows)
        for name, (_, fn) in values.items():
            sums[name] = _add(sums[name], key, np.asarray(fn(b), float) * w, rows)
    mid = (edges[:-1] + edges[1:]) / 2
    frames = []
    for r in np.flatnonzero(weight.sum(axis=1) > 0):
        keep = weight[r] > 0
        frame = {"time_s": mid[keep], "replica": np.full(int(keep.sum()), int(r))}
        for name in values:
            frame[name] = sums[name][r][keep] / weight[r][keep]
        frames.append(pd.DataFrame(frame))
    if not frames:
        return pd.DataFrame({"time_s": [], "replica": [], **{n: [] for n in values}})
    return pd.concat(frames, ignore_index=True)
