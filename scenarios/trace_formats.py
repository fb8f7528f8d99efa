"""The trace layouts ``read_trace`` accepts as published, besides its own CSV.

Each layout is recognised from its columns (a JSON-lines file from its first character; the
file as ``scenarios.input_file`` reads it: decompressed, byte-order mark dropped) and mapped
onto the common columns ``arrival_time_s``, ``input_tokens``, ``output_tokens`` (and
``hash_ids``); ``read_trace`` reads the layout's columns under the file's own names, so an error
about a value names the column a user sees in the file:

- ours (``shared/traces/README.md``): ``arrival_time_s, input_tokens, output_tokens
  [, hash_ids]`` (space-separated ints);
- Azure LLM inference traces 2023/2024 (``AzurePublicDataset``): ``TIMESTAMP`` (date-time),
  ``ContextTokens``, ``GeneratedTokens``; arrivals are seconds after the first timestamp;
- BurstGPT: ``Timestamp`` (seconds), ``Request tokens``, ``Response tokens`` (other columns
  such as ``Model`` and ``Log Type`` are ignored);
- Vidur's processed traces (``data/processed_traces/*.csv``): ``arrived_at`` (seconds),
  ``num_prefill_tokens``, ``num_decode_tokens``;
- Mooncake's JSON lines (``FAST25-release/traces/*.jsonl``): ``timestamp`` (milliseconds),
  ``input_length``, ``output_length``, ``hash_ids`` (a list of ints).

Diffusion job traces (``read_job_trace``) have layouts of their own (``JOB_LAYOUTS``):

- Alibaba GenTD26 (``shared/traces/alibaba_t2i_diffusion.csv``): ``arrival_time_s``,
  ``num_inference_steps``, ``num_images`` (per prompt), and ``type``/``status`` to choose rows.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass

import numpy as np
import pandas as pd

from scenarios.errors import WorkloadError
from scenarios.input_file import InputFile

COMMON = ("arrival_time_s", "input_tokens", "output_tokens")


@dataclass(frozen=True)
class Layout:
    """A CSV layout: its name and its columns for arrival, input and output lengths."""

    name: str
    arrival: str
    input: str
    output: str
    hash_ids: str | None = None


CSV_LAYOUTS = (
    Layout("simulator CSV", *COMMON, hash_ids="hash_ids"),
    Layout("Azure LLM inference trace", "TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    Layout("BurstGPT", "Timestamp", "Request tokens", "Response tokens"),
    Layout("Vidur processed trace", "arrived_at", "num_prefill_tokens", "num_decode_tokens"),
)
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length")
MOONCAKE = Layout("Mooncake JSON lines", *MOONCAKE_KEYS, hash_ids="hash_ids")


@dataclass(frozen=True)
class JobLayout:
    """A diffusion job trace's CSV layout: arrival, steps and images per prompt, and the
    columns of the request type and final status that choose which rows to replay."""

    name: str
    arrival: str
    steps: str
    images: str
    type: str
    status: str

    @property
    def required(self) -> tuple[str, str, str]:
        """The columns every row needs."""
        return (self.arrival, self.steps, self.images)


ALIBABA = JobLayout("Alibaba GenTD26 text-to-image trace", "arrival_time_s",
                    "num_inference_steps", "num_images", "type", "status")
JOB_LAYOUTS = (ALIBABA,)


def job_csv_layout(header: list[str], path: str, field: str) -> JobLayout:
    """The diffusion job layout whose required columns ``header`` has (the first that fits)."""
    for layout in JOB_LAYOUTS:
        if all(c in header for c in layout.required):
            return layout
    near = [lay for lay in JOB_LAYOUTS if any(c in header for c in lay.required[1:])]
    if near:  # meant as this layout: say which column is missing
        missing = next(c for c in near[0].required if c not in header)
        raise WorkloadError(field, path, f"missing column {missing!r} (a {near[0].name} needs "
                            f"{list(near[0].required)}, has {header})")
    known = "; ".join(f"{lay.name}: {list(lay.required)}" for lay in JOB_LAYOUTS)
    raise WorkloadError(field, path, f"not a diffusion job trace: columns {header[:8]}; "
                        f"expected the columns of one of: {known}")


def csv_layout(header: list[str], path: str, field: str) -> Layout:
    """The layout whose three columns ``header`` has (the first that fits)."""
    for layout in CSV_LAYOUTS:
        if all(c in header for c in (layout.arrival, layout.input, layout.output)):
            return layout
    if any(c in header for c in COMMON):  # meant as ours: say which column is missing
        missing = next(c for c in COMMON if c not in header)
        raise WorkloadError(field, path, f"missing column {missing!r} (needs {list(COMMON)}, "
                            f"has {header})")
    known = "; ".join(f"{lay.name}: {[lay.arrival, lay.input, lay.output]}"
                      for lay in CSV_LAYOUTS)
    raise WorkloadError(field, path, f"unknown trace columns {header[:8]}; expected the "
                        f"columns of one of: {known}; or Mooncake JSON lines "
                        f"{list(MOONCAKE_KEYS)}")


def csv_header(src: InputFile) -> list[str]:
    """The column names of a CSV file."""
    return list(pd.read_csv(src.buffer(), nrows=0, encoding="utf-8-sig").columns)


def read_csv_columns(src: InputFile, columns: list[str]) -> pd.DataFrame:
    """``columns`` of a CSV file as strings (an empty cell: NaN), indexed by data row; the
    caller converts and validates them, so a message can quote the cell as written."""
    return pd.read_csv(src.buffer(), usecols=columns, dtype=str, keep_default_na=False,
                       na_values=[""], encoding="utf-8-sig")


def layout_columns(layout: Layout, header: list[str]) -> list[str]:
    """The columns of ``layout`` to read (``hash_ids`` too when the file has it)."""
    cols = [layout.arrival, layout.input, layout.output]
    if layout.hash_ids and layout.hash_ids in header:
        cols.append(layout.hash_ids)
    return cols


def arrival_seconds(raw: pd.Series, layout: Layout, src: InputFile, field: str) -> pd.Series:
    """Arrival times in seconds (a date-time column becomes seconds after its first row);
    named like the file's column."""
    if layout.arrival != "TIMESTAMP":
        return raw
    stamps = pd.to_datetime(raw, errors="coerce", format="ISO8601")
    bad = stamps.isna().to_numpy()
    if bad.any():
        i = int(np.argmax(bad))
        raise WorkloadError(field, src.path, f"column 'TIMESTAMP' {src.row(raw.index[i])} is "
                            f"{raw.iloc[i]!r}; expected a date-time")
    return ((stamps - stamps.iloc[0]).dt.total_seconds()).rename(raw.name)


def _json_record(line: str, n: int, path: str, field: str) -> object:
    """Line ``n`` of a JSON-lines file, parsed; what Python's parser cannot read is one
    ``WorkloadError`` naming the line."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise WorkloadError(field, path, f"line {n} is not JSON ({e.msg})") from None
    except RecursionError:
        raise WorkloadError(field, path, f"line {n} is nested too deeply for Python's JSON "
                            "parser") from None
    except ValueError:  # the only other error of json.loads: Python's cap on integer digits
        raise WorkloadError(field, path, f"line {n} holds an integer of more than "
                            f"{sys.get_int_max_str_digits()} digits (Python's parser "
                            "limit)") from None


def _json_number(rec: dict, key: str, n: int, path: str, field: str) -> float | int:
    """``rec[key]``, a JSON number (text, true/false or null is refused, naming line ``n``);
    an integer beyond the float range (JSON sets none) becomes infinite, which the range
    checks then refuse as not finite."""
    v = rec[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise WorkloadError(field, path, f"line {n}: {key!r} is {json.dumps(v)[:40]}; "
                            "expected a JSON number")
    try:
        float(v)
    except OverflowError:
        return math.inf if v > 0 else -math.inf
    return v


def read_mooncake_jsonl(src: InputFile, field: str) -> tuple[pd.DataFrame, Layout]:
    """Mooncake's JSON lines as a frame of its keys, one row per line that is not blank
    (``timestamp`` already in seconds, ``hash_ids`` space-separated, as in a CSV), and its
    layout."""
    rows = []
    for n, line in enumerate(src.text(), start=1):
        if not line.strip():
            continue
        rec = _json_record(line, n, src.path, field)
        if not isinstance(rec, dict) or any(k not in rec for k in MOONCAKE_KEYS):
            raise WorkloadError(field, src.path, f"line {n} lacks one of the Mooncake keys "
                                f"{list(MOONCAKE_KEYS)}: {line.strip()[:80]!r}")
        ids = rec.get("hash_ids") or []
        if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
            raise WorkloadError(field, src.path, f"line {n}: 'hash_ids' is {ids!r}; expected "
                                "a list of integers")
        rows.append((*(_json_number(rec, k, n, src.path, field) for k in MOONCAKE_KEYS),
                     tuple(ids)))
    if not rows:
        raise WorkloadError(field, src.path, "the trace has no rows")
    t, i, o, h = zip(*rows, strict=True)
    frame = pd.DataFrame({"timestamp": np.asarray(t, dtype=float) / 1e3,  # ms to seconds
                          "input_length": pd.Series(i, dtype=object),
                          "output_length": pd.Series(o, dtype=object),
                          "hash_ids": [" ".join(map(str, ids)) for ids in h]})
    return frame, MOONCAKE
