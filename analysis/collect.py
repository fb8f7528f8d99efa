"""One table of a Hydra sweep: a row per job with its overrides and its summary metrics.

``collect_sweep(DIR)`` reads every job folder under a sweep directory (any folder holding
``.hydra/overrides.yaml``): the overrides become typed columns (``scheduler``,
``workload.rate``, ``seed``, ...), ``summary.json`` gives the metrics (nested dicts flattened
with dots), and ``failed.json`` (written by ``python -m sim`` when a job fails) gives the
error; a job stopped by Ctrl-C (``"partial": true``) has status ``partial``.
``write_sweep_summary(DIR)`` writes the table as ``sweep_summary.parquet`` and
``sweep_summary.csv`` in DIR; the multirun callback calls it at the end of every sweep, and
``python -m analysis.collect DIR`` rebuilds it afterwards.
"""

from __future__ import annotations

import argparse
import json
import numbers
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from analysis.files import atomic_write
from analysis.inputs import output_dir, read_json, read_yaml
from analysis.report import FAILED_JSON, SUMMARY_JSON
from analysis.sweep_jobs import last_sweep_dirs
from sim.errors import ConfigError, OutputError, report_error

SUMMARY_STEM = "sweep_summary"
BASE_COLUMNS = ("job", "dir", "status", "error")
NOT_FINISHED = "no summary.json or failed.json: the job did not finish"
BOOKKEEPING = ("outputs", "config_sha256", "pending_outputs")  # summary.json keys, not metrics


def _job_dirs(root: Path) -> list[Path]:
    """The job folders of the last sweep run into ``root`` (never an earlier sweep's)."""
    dirs = sorted({p.parent.parent for p in root.rglob(".hydra/overrides.yaml")})
    return last_sweep_dirs(root, dirs, _job_number)


def _job_number(job_dir: Path) -> int | None:
    """Hydra's ``hydra.job.num`` of the job (its folder name when that is not recorded)."""
    try:
        doc = read_yaml(job_dir / ".hydra" / "hydra.yaml", "hydra.yaml", "Hydra's job record")
        return int(doc["hydra"]["job"]["num"])
    except (ConfigError, KeyError, TypeError, ValueError):
        return int(job_dir.name) if job_dir.name.isdigit() else None


def _scalar(v: Any) -> Any:
    """A value a parquet column can hold: lists and dicts become their JSON text."""
    if isinstance(v, (list, tuple, dict)):
        return json.dumps(v, default=str)
    return v


def parse_overrides(lines: list[str]) -> dict[str, Any]:
    """Hydra override strings → {key: typed value} (``rate=2`` → 2, ``~key`` → None)."""
    parser = OverridesParser.create()
    out: dict[str, Any] = {}
    for line in lines:
        try:
            (o,) = parser.parse_overrides([line])
        except HydraException:
            key, _, value = line.partition("=")
            out[key.lstrip("+~")] = value
            continue
        key = o.key_or_group + (f"@{o.package}" if o.package else "")
        out[key] = None if o.is_delete() else _scalar(o.value())
    return out


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = _scalar(v)
    return out


def read_job(job_dir: Path, root: Path) -> tuple[dict, dict, dict]:
    """One job's (base columns, overrides, flattened metrics); a file of the job that is
    there but unreadable or of the wrong shape is a ``ConfigError`` naming it."""
    overrides = read_yaml(job_dir / ".hydra" / "overrides.yaml", "overrides.yaml",
                          "a Hydra job's overrides (a YAML list)", list)
    summary_path, failed_path = job_dir / SUMMARY_JSON, job_dir / FAILED_JSON
    summary = (read_json(summary_path, SUMMARY_JSON, "a run's summary (a JSON object)")
               if summary_path.exists() else None)
    failed = (read_json(failed_path, FAILED_JSON, "a failed job's error (a JSON object)")
              if failed_path.exists() else None)
    # a rerun into the same folder may leave both: the newer file tells how the job ended
    if summary is not None and failed is not None:
        if failed_path.stat().st_mtime >= summary_path.stat().st_mtime:
            summary = None
        else:
            failed = None
    if failed is not None:
        status = "failed"
        error = f"{failed.get('error_type', 'Error')}: {failed.get('message', '')}"
    elif summary is not None and summary.get("partial"):
        status = "partial"
        error = (f"interrupted at {summary.get('interrupted_at_sim_s')} simulated s with "
                 f"{summary.get('unfinished')} requests unfinished")
    elif summary is not None:
        status, error = "ok", None
    else:
        status, error = "failed", NOT_FINISHED
    base = {"job": _job_number(job_dir), "dir": job_dir.relative_to(root).as_posix() or ".",
            "status": status, "error": error}
    metrics = {k: v for k, v in (summary or {}).items() if k not in BOOKKEEPING}
    return base, parse_overrides([str(x) for x in overrides]), _flatten(metrics)


def _missing(v: Any) -> bool:
    return v is None or v is pd.NA or (isinstance(v, float) and v != v)


def _uniform_column(values: pd.Series) -> pd.Series:
    """Mixed strings and numbers (e.g. ``null`` and ``auto``) as strings, so parquet can hold
    the column; numbers and booleans stay typed (booleans as pandas' nullable ``boolean``, so
    a job without the value reads back the same from parquet)."""
    kinds = {"str" if isinstance(v, str) else "bool" if isinstance(v, (bool, np.bool_))
             else "num" if isinstance(v, numbers.Number) else "other"
             for v in values if not _missing(v)}
    if kinds == {"bool"}:
        return values.astype("boolean")
    if len(kinds) <= 1 and kinds != {"other"}:
        return values
    return values.map(lambda v: v if v is None else str(v))


def collect_sweep(path: str | Path) -> pd.DataFrame:
    """The table of a sweep directory: a row per job, sorted by job number.

    Columns: ``job`` (Hydra's job number), ``dir`` (the job folder, relative to ``path``),
    ``status`` (``ok``, ``failed``, or ``partial`` for a job stopped by Ctrl-C), ``error``
    (``Type: message`` of a failed job, what was left of a partial one), one
    column per override key as given on the command line (values typed: numbers as
    numbers), then every ``summary.json`` metric, nested keys joined with dots. A metric
    that repeats an override column (``scheduler``, ``seed``) is kept only where it
    differs from it, as ``summary.<name>``. Raises ``ConfigError`` when ``path`` holds no job.
    """
    root = Path(path)
    if not root.is_dir():
        raise ConfigError("DIR", str(path), "an existing sweep directory")
    jobs = [read_job(d, root) for d in _job_dirs(root)]
    if not jobs:
        raise ConfigError("DIR", str(path), "a Hydra sweep directory: no job folder with "
                          ".hydra/overrides.yaml under it")
    jobs.sort(key=lambda j: (j[0]["job"] is None, j[0]["job"] or 0, j[0]["dir"]))
    override_cols = list(dict.fromkeys(k for _, o, _ in jobs for k in o))
    metric_cols = list(dict.fromkeys(k for _, _, m in jobs for k in m))
    table = pd.DataFrame([b for b, _, _ in jobs], columns=list(BASE_COLUMNS))
    for col in override_cols:
        table[col] = _uniform_column(pd.Series([o.get(col) for _, o, _ in jobs], dtype=object))
        table[col] = table[col].infer_objects()
    metrics = pd.DataFrame([m for _, _, m in jobs], columns=metric_cols)
    for col in metric_cols:
        values = _uniform_column(metrics[col].astype(object)).infer_objects()
        if col in table.columns:
            ok = table["status"] == "ok"
            same = (values[ok].astype(str) == table.loc[ok, col].astype(str)).all()
            if same:
                continue
            col = f"summary.{col}"
        table[col] = values
    return table


def override_columns(table: pd.DataFrame) -> list[str]:
    """The override columns of a ``collect_sweep`` table: those after ``error`` up to the
    first ``summary.json`` metric (``completed``)."""
    cols = list(table.columns)
    end = cols.index("completed") if "completed" in cols else len(cols)
    return cols[cols.index("error") + 1:end]


def swept_columns(table: pd.DataFrame) -> list[str]:
    """The override columns whose values differ between jobs (all of them when none does):
    the swept keys tell the jobs apart; the others are the same for every job."""
    columns = override_columns(table)
    return [c for c in columns if table[c].astype(str).nunique() > 1] or columns


def failure_lines(table: pd.DataFrame) -> list[str]:
    """One line per job of a ``collect_sweep`` table that did not end ``ok``: its number,
    the overrides that differ between jobs (all of them when none does) and its error."""
    swept = swept_columns(table)
    lines = []
    for _, row in table[table["status"] != "ok"].iterrows():
        given = " ".join(f"{c}={override_text(row[c])}" for c in swept if not _missing(row[c]))
        lines.append(f"  job {row['job']} ({given or row['dir']}) {row['status']}: "
                     f"{row['error']}")
    return lines


def override_text(v: Any) -> str:
    """An override value as typed: ``4`` and ``true``, not ``4.0`` and ``True``."""
    if isinstance(v, (bool, np.bool_)):
        return str(bool(v)).lower()
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


def write_sweep_summary(path: str | Path) -> Path:
    """Write ``sweep_summary.parquet`` and ``sweep_summary.csv`` into the sweep directory
    ``path`` (atomically); returns the parquet file's path."""
    root = Path(path)
    table = collect_sweep(root)
    output_dir(root, "DIR")
    parquet, csv = root / f"{SUMMARY_STEM}.parquet", root / f"{SUMMARY_STEM}.csv"
    atomic_write(parquet, lambda p: table.to_parquet(p, index=False))
    atomic_write(csv, lambda p: table.to_csv(p, index=False))
    return parquet


def main(argv: list[str] | None = None) -> int:
    """``python -m analysis.collect DIR``: rebuild a sweep's summary table; exit 2 on bad input."""
    parser = argparse.ArgumentParser(prog="python -m analysis.collect",
                                     description="Rebuild sweep_summary.parquet/.csv of a sweep.")
    parser.add_argument("dir", metavar="DIR", help="a Hydra sweep directory (multirun/...)")
    args = parser.parse_args(argv)
    try:
        out = write_sweep_summary(args.dir)
    except (ConfigError, OutputError) as e:
        return report_error(e)
    table = pd.read_parquet(out)
    lines = failure_lines(table)
    print(f"{len(table)} jobs, {len(lines)} failed → {out} (and .csv)")
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
