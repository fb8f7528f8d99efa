"""Reader of aiconfigurator's measured per-operator tables.

Layout: ``<data_dir>/<op>/<framework>/<version>/<table>.parquet``; a version folder may hold
``reuse.yaml`` instead of a table (that version reuses another version's measurement).
Latencies are milliseconds per op call. The version is chosen per framework: the newest that
has the table, or the one asked for (following ``reuse.yaml``). Framework-independent NCCL
tables live under ``comm/nccl/<nccl_version>/``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.inputs import fields_of, read_parquet, read_yaml
from calibration.rows import conform, empty
from sim.errors import ConfigError

FRAMEWORKS = ("vllm", "sglang", "trtllm")
# (op folder, table) per family
TABLES = {
    "gemm": ("gemm", "gemm_perf"),
    "attention_prefill": ("attention", "context_attention_perf"),
    "attention_decode": ("attention", "generation_attention_perf"),
    "allreduce": ("comm", "custom_allreduce_perf"),
    "moe": ("moe", "moe_perf"),
    "encoder_attention": ("encoder_attention", "encoder_attention_perf"),
}
NCCL_KINDS = {"all_gather": "allgather", "alltoall": "alltoall",
              "reduce_scatter": "reduce_scatter", "all_reduce": "allreduce"}
NCCL_BYTES = {"half": 2.0, "int8": 1.0, "float": 4.0, "bfloat16": 2.0}
TABLE = "an aiconfigurator table (parquet with a latency column, ms per call)"


def version_key(v: str) -> tuple:
    """Sort key of a version string: 1.3.0rc20 < 1.3.0 < 1.3.0.post1; dev below rc."""
    m = re.match(r"^(\d+(?:\.\d+)*)\.?(?:(dev|rc|post)(\d+))?", v)
    if not m:
        return ((-1,), 0, 0)
    nums = tuple(int(x) for x in m.group(1).split("."))
    nums = nums + (0,) * (4 - len(nums))
    tag = {"dev": -2, "rc": -1, None: 0, "post": 1}[m.group(2)]
    return (nums, tag, int(m.group(3) or 0))


@dataclass
class TableChoice:
    """Which file a family was read from, and the version folders that were considered."""

    path: Path
    version: str
    reused_from: str | None = None
    candidates: list[str] = field(default_factory=list)


def _reuse_source(folder: Path, table: str) -> str | None:
    reuse = folder / "reuse.yaml"
    if not reuse.is_file():
        return None
    what = "an aiconfigurator reuse.yaml (a mapping with a reuse: list)"
    doc = read_yaml(reuse, "data_dir", what)
    with fields_of(reuse, "data_dir", what):
        for entry in doc.get("reuse") or []:
            if entry.get("table") == table:
                return str(entry.get("from_version"))
    return None


def find_table(root: Path, op: str, framework: str, table: str,
               version: str | None = None) -> TableChoice | None:
    """The table of ``framework``: at ``version`` (following ``reuse.yaml``), or the newest
    version that has it; None when the framework has no such table at all."""
    base = Path(root) / op / framework
    if not base.is_dir():
        return None
    versions = sorted((p.name for p in base.iterdir() if p.is_dir()), key=version_key,
                      reverse=True)
    if version is not None:
        if version not in versions:
            return None
        path = base / version / f"{table}.parquet"
        if path.is_file():
            return TableChoice(path, version, None, versions)
        src = _reuse_source(base / version, table)
        if src and (base / src / f"{table}.parquet").is_file():
            return TableChoice(base / src / f"{table}.parquet", version, src, versions)
        return None
    for v in versions:
        path = base / v / f"{table}.parquet"
        if path.is_file():
            return TableChoice(path, v, None, versions)
    return None


def _rows(choice: TableChoice, root: Path, family: str, shape) -> pd.DataFrame:
    """The ``family`` rows of one table: read, given the family's columns by ``shape`` and
    conformed; a column the table lacks or that does not convert names the file."""
    df = read_parquet(choice.path, "data_dir", TABLE, ("latency",))
    with fields_of(choice.path, "data_dir", TABLE):
        df["latency_s"] = df["latency"].astype(float) * 1e-3
        df["source"] = str(choice.path.relative_to(root))
        return conform(family, shape(df), str(choice.path))


def _gemm(df: pd.DataFrame) -> pd.DataFrame:
    return df.rename(columns={"gemm_dtype": "dtype"})


def _attention(df: pd.DataFrame, prefill: bool) -> pd.DataFrame:
    df = df.rename(columns={"num_key_value_heads": "num_kv_heads", "kv_cache_dtype": "kv_dtype",
                            "window_size": "window"})
    if prefill:
        return df.assign(q=df["isl"], ctx=0)
    return df.assign(ctx=df["step"])


def _encoder(df: pd.DataFrame) -> pd.DataFrame:
    return df.rename(columns={"isl": "seq", "attn_dtype": "dtype"})


def _allreduce(df: pd.DataFrame) -> pd.DataFrame:
    src = df["kernel_source"].astype(str).str.lower()
    variant = np.where(src.str.contains("eager"), "eager", "graph")
    return df.assign(kind="allreduce", impl="custom", variant=variant,
                     dtype=df["allreduce_dtype"],
                     nbytes=df["message_size"].astype(float) * 2.0)


def _nccl(df: pd.DataFrame) -> pd.DataFrame:
    df = df[df["op_name"].isin(NCCL_KINDS)]
    per_elem = df["nccl_dtype"].map(NCCL_BYTES).astype(float)
    return df.assign(kind=df["op_name"].map(NCCL_KINDS), impl="nccl", variant="nccl",
                     dtype=df["nccl_dtype"], nbytes=df["message_size"].astype(float) * per_elem)


def _moe(df: pd.DataFrame) -> pd.DataFrame:
    return df.rename(columns={"moe_dtype": "dtype", "hidden_size": "hidden",
                              "inter_size": "inter", "moe_tp_size": "tp", "moe_ep_size": "ep"})


def _gemm_rows_from(root: Path, framework: str, dtype: str, version: str,
                    gemm: pd.DataFrame | None) -> tuple[pd.DataFrame, TableChoice]:
    """``gemm`` with its ``dtype`` rows replaced by those of ``version``'s GEMM table."""
    field = f"gemm_dtype_versions.{dtype}"
    choice = find_table(root, "gemm", framework, "gemm_perf", version)
    if choice is None:
        raise ConfigError(field, version, f"a version folder with gemm/{framework}/<version>/"
                          "gemm_perf.parquet")
    rows = _rows(choice, root, "gemm", _gemm)
    rows = rows[rows["dtype"] == dtype]
    if rows.empty:
        raise ConfigError(field, version, f"a GEMM table with {dtype} rows")
    if gemm is None:
        return rows.reset_index(drop=True), choice
    return pd.concat([gemm[gemm["dtype"] != dtype], rows], ignore_index=True), choice


def read(root: Path, framework: str, version: str | None = None,
         nccl_version: str | None = None, gemm_dtype_versions: dict | None = None,
         ) -> tuple[dict[str, pd.DataFrame], dict[str, TableChoice]]:
    """Every family's rows of ``framework`` (``rows.COLUMNS``), and the tables they came from.

    A family the framework has no table for is an empty frame (the fit carries another
    family's parameters over and says so). ``gemm_dtype_versions`` (dtype → version) takes
    that dtype's GEMM rows from that version's table instead (recorded as ``gemm_<dtype>``).
    """
    root = Path(root)
    if framework not in FRAMEWORKS:
        raise ConfigError("backend", framework, f"one of {list(FRAMEWORKS)}")
    frames: dict[str, pd.DataFrame] = {}
    used: dict[str, TableChoice] = {}
    for family, (op, table) in TABLES.items():
        choice = find_table(root, op, framework, table, version)
        if choice is None:
            continue
        used[family] = choice
        if family == "gemm":
            frames["gemm"] = _rows(choice, root, "gemm", _gemm)
        elif family.startswith("attention"):
            shape = partial(_attention, prefill=family.endswith("prefill"))
            frames[family] = _rows(choice, root, family, shape)
        elif family == "allreduce":
            frames["comm"] = _rows(choice, root, "comm", _allreduce)
        elif family == "moe":
            frames["moe"] = _rows(choice, root, "moe", _moe)
        elif family == "encoder_attention":
            frames[family] = _rows(choice, root, family, _encoder)
    for dtype, v in (gemm_dtype_versions or {}).items():
        frames["gemm"], used[f"gemm_{dtype}"] = _gemm_rows_from(root, framework, dtype, str(v),
                                                                 frames.get("gemm"))
    if version is not None and not used:
        raise ConfigError("version", version, f"no {framework} table of that version under "
                          f"{root}")
    nccl = find_table(root, "comm", "nccl", "nccl_perf", nccl_version)
    if nccl_version is not None and nccl is None:
        raise ConfigError("nccl_version", nccl_version, f"no comm/nccl/{nccl_version} table "
                          f"under {root}")
    if nccl is not None:
        used["nccl"] = nccl
        rows = _rows(nccl, root, "comm", _nccl)
        frames["comm"] = pd.concat([frames.get("comm", empty("comm")), rows], ignore_index=True)
    return frames, used
