"""Writes measured rows as aiconfigurator-layout tables with their provenance.

Each table goes to ``<out>/<op_family>/<framework>/<version>/<table>.parquet`` (framework
``torch`` and the torch version for kernels; the collective library and its version for
``nccl_perf``), with the columns ``calibration.aiconfigurator.load_table`` and the fit read,
and a ``collection_meta.yaml`` per folder in aiconfigurator's schema plus the GPU, driver,
torch and CUDA versions, the exact command and the date.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml

from analysis.files import atomic_write, write_text

COMMON_COLUMNS = ("framework", "version", "device", "op_name", "kernel_source")


@dataclass
class TableResult:
    """The rows measured for one table and what happened to the rest of its plan."""

    rows: list[dict] = field(default_factory=list)
    planned: int = 0
    failures: dict[str, list[dict]] = field(default_factory=dict)  # reason -> shape columns
    not_measured: int = 0  # left when the time budget ran out

    def fail(self, columns: dict, error: BaseException) -> None:
        """Record a shape that could not be measured, grouped by a one-line reason."""
        text = str(error).strip().splitlines()
        reason = f"{type(error).__name__}: {text[0][:200] if text else ''}".rstrip(": ")
        self.failures.setdefault(reason, []).append(columns)

    def status(self) -> dict:
        """The table's entry in collection_meta.yaml."""
        failed = sum(len(v) for v in self.failures.values())
        entry = {
            "status": "complete" if failed == 0 and self.not_measured == 0 else "partial",
            "rows": len(self.rows),
            "planned_shapes": self.planned,
            "failed_shapes": failed,
            "not_measured_budget": self.not_measured,
        }
        if self.failures:
            entry["failures"] = {r: {"count": len(v), "first": v[0]}
                                 for r, v in self.failures.items()}
        return entry


def table_frame(rows: list[dict], framework: str, version: str, device: str,
                op_name: str) -> pd.DataFrame:
    """Rows (shape columns, kernel_source, timing stats) as a table with aiconfigurator's
    common columns first: framework, version, device, op_name, kernel_source."""
    df = pd.DataFrame(rows)
    df.insert(0, "op_name", df.pop("op_name") if "op_name" in df else op_name)
    df.insert(0, "device", device)
    df.insert(0, "version", version)
    df.insert(0, "framework", framework)
    if "kernel_source" in df:
        df.insert(4, "kernel_source", df.pop("kernel_source"))
    return df


def write_table(out_dir: Path, family: str, framework: str, version: str, table: str,
                df: pd.DataFrame | None, result: TableResult, meta: dict) -> Path:
    """Write ``df`` (none when no shape could be measured) and merge the table's status into
    the folder's collection_meta.yaml; the table's path."""
    folder = Path(out_dir) / family / framework / version
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{table}.parquet"
    if df is not None and len(df):
        atomic_write(path, lambda p: df.to_parquet(p, index=False))
    meta_path = folder / "collection_meta.yaml"
    doc = yaml.safe_load(meta_path.read_text()) if meta_path.is_file() else None
    if not doc:
        doc = {"schema_version": 1, "provenance": "collected",
               "runtime": {"framework": framework, "version": version}, "tables": {}}
    doc["tables"][table] = result.status()
    doc.update(meta)
    write_text(meta_path, yaml.safe_dump(doc, sort_keys=False))
    return path


def save_table(out_dir: Path, key: tuple[str, str, str, str], op_name: str,
               result: TableResult, device_name: str, meta: dict) -> Path:
    """Write one table, ``key`` = (op_family, framework folder, version, table name); the
    rows' ``framework`` column is always ``torch``, ``version`` the folder's version."""
    family, framework, version, table = key
    df = table_frame(result.rows, "torch", version, device_name, op_name) if result.rows else None
    return write_table(out_dir, family, framework, version, table, df, result, meta)


def collection_meta(env: dict, command: str, overrides: list[str], plan: dict, date: str,
                    timing: str) -> dict:
    """The provenance block of every collection_meta.yaml this run writes."""
    return {
        "collected_by": "calibration.profile",
        "command": command,
        "overrides": list(overrides),
        "date": date,
        "environment": env,
        "plan": plan,
        "timing": timing,
        "units": {"latency": "milliseconds per call (mean over samples); latency_median, "
                             "latency_min, latency_std likewise",
                  "message_size": "elements (bfloat16) of the full buffer, as nccl-tests"},
    }
