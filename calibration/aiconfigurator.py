"""One aiconfigurator table by name, as a DataFrame with ``latency_s`` (kept for callers that
want a raw table; the fit reads whole families through ``calibration.readers``)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from calibration.readers.aiconfigurator import find_table as _find


def find_table(root: Path, op_family: str, framework: str, table: str,
               version: str | None = None) -> Path:
    """Path of a measured table: the given version (following ``reuse.yaml``), or the newest
    version that has the file."""
    choice = _find(Path(root), op_family, framework, table, version)
    if choice is None:
        raise FileNotFoundError(f"no {table}.parquet under {Path(root) / op_family / framework}"
                                + (f" for version {version}" if version else ""))
    return choice.path


def load_table(root: Path, op_family: str, framework: str, table: str,
               version: str | None = None) -> tuple[pd.DataFrame, Path]:
    """The table as a DataFrame with ``latency_s`` added, and the file it came from."""
    path = find_table(root, op_family, framework, table, version)
    df = pd.read_parquet(path)
    df["latency_s"] = df["latency"].astype(float) * 1e-3
    return df, path
