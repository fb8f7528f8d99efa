"""Trace replay: read, validate and window a request trace.

Format (see ``shared/traces/README.md``): columns ``arrival_time_s`` (float seconds, rows sorted),
``input_tokens`` and ``output_tokens`` (non-negative ints), optional ``hash_ids`` (space-separated
ints: prefix-block hashes, Mooncake style); other columns are ignored. The published layouts of
the Azure, BurstGPT, Vidur and Mooncake traces are read as they are
(``scenarios.trace_formats``). The file is read once, by content (``scenarios.input_file``:
compressed or not, from a pipe too). Every problem raises one ``WorkloadError`` naming the
config field of the path and what is wrong, with the first bad row and its line in the file.

Diffusion job traces (``read_job_trace``: the Alibaba GenTD26 layout) are read the same way
into ``arrival_time_s``, ``steps`` and ``images``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pandas as pd

from scenarios.errors import WorkloadError
from scenarios.input_file import InputFile, read_input_file
from scenarios.trace_formats import (
    arrival_seconds,
    csv_header,
    csv_layout,
    job_csv_layout,
    layout_columns,
    read_csv_columns,
    read_mooncake_jsonl,
)

REQUIRED = ("arrival_time_s", "input_tokens", "output_tokens")
FIELD = "workload.trace_path"
# Beyond these a value is no longer what it says: a longer "length" overflows int32 token
# counters in real engines (and int64 here, from 9.2e18), and past 1e9 s (32 years) float
# seconds lose the microsecond resolution the simulator's step times need.
MAX_TOKENS = 2**31 - 1
MAX_TIME_S = 1e9



@contextmanager
def _parsing(src: InputFile, field: str) -> Iterator[None]:
    """Parse a trace file: what pandas or the text decoder cannot read becomes one
    ``WorkloadError`` naming the workload field (a ``WorkloadError`` of a layout reader
    passes as it is)."""
    try:
        yield
    except WorkloadError:
        raise
    except (ValueError, pd.errors.ParserError) as e:  # UnicodeDecodeError included
        kind = "JSON lines" if src.is_json_lines else "CSV"
        raise WorkloadError(field, src.path, f"cannot read as {kind} ({e})") from None


def _numeric(raw: pd.Series, src: InputFile, field: str) -> np.ndarray:
    values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=float)
    bad = ~np.isfinite(values)
    if bad.any():
        i = int(np.argmax(bad))
        raise WorkloadError(
            field,
            src.path,
            f"column {raw.name!r} {src.row(raw.index[i])} is {raw.iloc[i]!r}; expected a "
            "finite number",
        )
    return values


def _in_range(values: np.ndarray, raw: pd.Series, src: InputFile, field: str, bad: np.ndarray,
              expected: str) -> None:
    if bad.any():
        i = int(np.argmax(bad))
        raise WorkloadError(field, src.path, f"column {raw.name!r} {src.row(raw.index[i])} is "
                            f"{raw.iloc[i]!r}; {expected}")


def _lengths(raw: pd.Series, src: InputFile, field: str) -> np.ndarray:
    values = _numeric(raw, src, field)
    _in_range(values, raw, src, field, (values < 0) | (values != np.floor(values)),
              "token lengths must be non-negative integers")
    _in_range(values, raw, src, field, values > MAX_TOKENS,
              f"token lengths must be at most {MAX_TOKENS}")
    return values.astype(np.int64)


def _counts(raw: pd.Series, src: InputFile, field: str) -> np.ndarray:
    """Steps or images per job: integers >= 1."""
    values = _numeric(raw, src, field)
    _in_range(values, raw, src, field, (values < 1) | (values != np.floor(values)),
              "must be an integer >= 1")
    _in_range(values, raw, src, field, values > MAX_TOKENS, f"must be at most {MAX_TOKENS}")
    return values.astype(np.int64)


def _arrivals(raw: pd.Series, src: InputFile, field: str) -> np.ndarray:
    values = _numeric(raw, src, field)
    _in_range(values, raw, src, field, values < 0,
              "arrival times must be >= 0 (seconds from the trace's start)")
    _in_range(values, raw, src, field, values > MAX_TIME_S,
              f"arrival times must be at most {MAX_TIME_S:g} s")
    return values


def parse_hash_ids(raw: pd.Series, src: InputFile, field: str = FIELD) -> np.ndarray:
    """Parse a column of space-separated ints into an object array of int tuples (empty: ())."""
    out = np.empty(len(raw), dtype=object)
    for i, text in enumerate(raw.tolist()):
        if not isinstance(text, str):  # missing cell
            out[i] = ()
            continue
        try:
            out[i] = tuple(int(t) for t in text.split())
        except ValueError:
            raise WorkloadError(
                field,
                src.path,
                f"column 'hash_ids' {src.row(raw.index[i])} is {text!r}; expected "
                "space-separated integers",
            ) from None
    return out


def read_trace(path: str, field: str = FIELD) -> pd.DataFrame:
    """Read and validate a trace CSV into ``arrival_time_s``, ``input_tokens``, ``output_tokens``
    (and ``hash_ids`` as tuples of ints when present), in file order and raw trace time.

    Lengths may be 0 here (some traces have them); ``build_requests`` rejects lengths < 1 that
    no fixed override replaces.
    """
    src = read_input_file(path, field)
    with _parsing(src, field):
        if src.is_json_lines:
            raw, layout = read_mooncake_jsonl(src, field)
        else:
            header = csv_header(src)
            layout = csv_layout(header, path, field)
            raw = read_csv_columns(src, layout_columns(layout, header))
    if raw.empty:
        raise WorkloadError(field, path, "the trace has no rows")
    arrival = _arrivals(arrival_seconds(raw[layout.arrival], layout, src, field), src, field)
    _check_sorted(arrival, raw.index, layout.arrival, src, field)
    out = pd.DataFrame(
        {
            "arrival_time_s": arrival,
            "input_tokens": _lengths(raw[layout.input], src, field),
            "output_tokens": _lengths(raw[layout.output], src, field),
        }
    )
    if layout.hash_ids in raw:
        out["hash_ids"] = pd.Series(parse_hash_ids(raw[layout.hash_ids], src, field),
                                    dtype=object)
    return out


def window_trace(
    trace: pd.DataFrame,
    start_s: float = 0.0,
    end_s: float | None = None,
    time_scale: float = 1.0,
    max_requests: int | None = None,
    path: str = "",
    field: str = FIELD,
) -> pd.DataFrame:
    """Keep rows with raw arrival in ``[start_s, end_s)``, shift so the first kept row is at 0,
    multiply times by ``time_scale``, then keep at most ``max_requests`` rows (None: all).

    Raises ``WorkloadError`` if no row is left.
    """
    t = trace["arrival_time_s"].to_numpy()
    keep = t >= start_s
    if end_s is not None:
        keep &= t < end_s
    out = trace.loc[keep]
    if max_requests is not None:
        out = out.iloc[:max_requests]
    if out.empty:
        raise WorkloadError(
            field,
            path,
            f"no rows in the window [{start_s}, {end_s}) s (trace spans {t[0]}..{t[-1]} s)",
        )
    out = out.reset_index(drop=True)
    out["arrival_time_s"] = (out["arrival_time_s"] - out["arrival_time_s"].iloc[0]) * time_scale
    return out


def busiest_rate(arrivals: np.ndarray, window_s: float) -> float:
    """The rate (req/s) of the busiest ``window_s`` of sorted ``arrivals``: the most
    arrivals in ``[t, t + window_s)`` over every arrival ``t`` (a sliding window, so no bin
    edge splits a burst), over ``window_s``; a trace shorter than the window counts the
    arrivals before its last over its span. 0 when every arrival is at one instant (it has
    no rate)."""
    window = min(float(window_s), float(arrivals[-1] - arrivals[0]))
    if window <= 0:
        return 0.0
    counts = np.searchsorted(arrivals, arrivals + window, side="left") - np.arange(len(arrivals))
    return float(counts.max()) / window


def retime_factor(arrivals: np.ndarray, window_s: float, peak: float) -> float | None:
    """The factor ``f`` for which ``f × arrivals`` has its busiest ``window_s`` (of the new
    clock) at ``peak`` req/s, or just below where its arrivals do not allow ``peak``
    exactly: that rate does not grow with ``f``, so bisection (on ``log f``) finds the
    least such ``f``. None when no ``f`` gets there: arrivals at one instant keep their
    count in any window (``busiest`` ≥ that count / ``window_s``), and a trace whose every
    row arrives at one instant has no rate to re-time."""
    _, at_once = np.unique(arrivals, return_counts=True)
    if len(at_once) == 1 or at_once.max() / window_s > peak:
        return None

    def rate(f: float) -> float:
        return busiest_rate(arrivals * f, window_s)

    lo = hi = busiest_rate(arrivals, window_s) / peak  # exact for a flat trace
    while rate(lo) <= peak:
        lo /= 2
    while rate(hi) > peak:
        hi *= 2
    while hi > lo * (1 + 1e-9):
        mid = float(np.sqrt(lo * hi))
        lo, hi = (mid, hi) if rate(mid) > peak else (lo, mid)
    return hi


def _check_sorted(arrival: np.ndarray, labels: pd.Index, column: str, src: InputFile,
                  field: str) -> None:
    down = np.diff(arrival) < 0
    if down.any():
        i = int(np.argmax(down)) + 1
        raise WorkloadError(field, src.path, f"{column} is not sorted: {src.row(labels[i])} "
                            f"is {float(arrival[i])!r}, before the previous row's "
                            f"{float(arrival[i - 1])!r}")


def read_job_trace(path: str, types: list[str] | tuple[str, ...] = (),
                   statuses: list[str] | tuple[str, ...] = (), field: str = FIELD) -> pd.DataFrame:
    """Read a diffusion job trace into ``arrival_time_s`` (raw trace time), ``steps`` and
    ``images`` (int64), keeping only rows whose type is in ``types`` and status in
    ``statuses`` (empty: every row). Only kept rows are validated, so rows that never ran (no
    steps) do not stop a replay that leaves them out; errors name the file's line."""
    src = read_input_file(path, field)
    with _parsing(src, field):
        header = csv_header(src)
        layout = job_csv_layout(header, path, field)
        cols = list(layout.required)
        for name, column, values in (("trace_types", layout.type, types),
                                     ("trace_statuses", layout.status, statuses)):
            if len(values) and column not in header:
                raise WorkloadError(field, path, f"missing column {column!r}, which "
                                    f"workload.{name}={list(values)} filters on (set it to [] "
                                    "to keep every row)")
            if len(values):
                cols.append(column)
        raw = read_csv_columns(src, cols)
    if raw.empty:
        raise WorkloadError(field, path, "the trace has no rows")
    keep = np.ones(len(raw), dtype=bool)
    if len(types):
        keep &= raw[layout.type].isin(list(types)).to_numpy()
    if len(statuses):
        keep &= raw[layout.status].isin(list(statuses)).to_numpy()
    raw = raw.loc[keep]
    if raw.empty:
        raise WorkloadError(field, path, f"no rows of type {list(types)} with status "
                            f"{list(statuses)} (workload.trace_types, workload.trace_statuses)")
    arrival = _arrivals(raw[layout.arrival], src, field)
    _check_sorted(arrival, raw.index, layout.arrival, src, field)
    return pd.DataFrame({"arrival_time_s": arrival,
                         "steps": _counts(raw[layout.steps], src, field),
                         "images": _counts(raw[layout.images], src, field)})
