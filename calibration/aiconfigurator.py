"""Reader for aiconfigurator's measured per-operator tables.

Layout: ``<root>/<op_family>/<framework>/<version>/<table>.parquet``; a version folder with
only ``reuse.yaml`` holds no data of its own. Latencies are milliseconds per op call.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd


def _version_key(v: str) -> tuple:
    parts = []
    for p in v.replace("rc", ".").replace("post", ".").split("."):
        parts.append(int(p) if p.isdigit() else 0)
    return tuple(parts)


def find_table(root: Path, op_family: str, framework: str, table: str,
               version: str | None = None) -> Path:
    """Path of a measured table: the given version, or the newest one that has the file."""
    base = Path(root) / op_family / framework
    if not base.is_dir():
        raise FileNotFoundError(f"no {op_family}/{framework} tables under {root}")
    versions = [version] if version else sorted(
        (p.name for p in base.iterdir() if p.is_dir()), key=_version_key, reverse=True)
    for v in versions:
        path = base / v / f"{table}.parquet"
        if path.is_file():
            return path
    raise FileNotFoundError(f"no {table}.parquet under {base} (versions {versions})")


def load_table(root: Path, op_family: str, framework: str, table: str,
               version: str | None = None) -> tuple[pd.DataFrame, Path]:
    """The table as a DataFrame with ``latency_s`` added, and the file it came from."""
    path = find_table(root, op_family, framework, table, version)
    df = pd.read_parquet(path)
    df["latency_s"] = df["latency"].astype(float) * 1e-3
    return df, path
