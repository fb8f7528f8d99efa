"""The Hydra callback that writes a multirun's ``sweep_summary.parquet`` and ``.csv``.

Registered under ``hydra.callbacks`` in ``conf/config.yaml``. Hydra calls
``on_multirun_end`` in the launching process once every job has returned, whichever
launcher ran them (basic, joblib, Ray, submitit), so the table sees every job's folder; it
holds this sweep's jobs only, never the folders an earlier sweep left in the same directory
(``analysis.sweep_jobs``). It then prints the table's headline columns, one row per job.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import pandas as pd
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from analysis.collect import failure_lines, override_text, swept_columns, write_sweep_summary
from analysis.metrics import percentile_of, reported_labels
from sim.errors import ConfigError

MAX_ROWS = 50  # jobs printed; the files hold every one
# the headline metrics of a job, those the table has (an LLM run's, a diffusion run's)
HEADLINE = ("request_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms",
            "jobs_per_hour", "median_job_latency_s", "p99_job_latency_s")


def _tail_column(table: pd.DataFrame, name: str) -> str | None:
    """``p99_<name>``, or the highest percentile of ``name`` the table has when a sweep chose
    other ``metrics.percentiles``."""
    if f"p99_{name}" in table:
        return f"p99_{name}"
    tails = [lb for lb in reported_labels(table.columns, name) if lb != "median"]
    return f"{max(tails, key=percentile_of)}_{name}" if tails else None


def headline_columns(table: pd.DataFrame) -> list[str]:
    """The ``HEADLINE`` metrics of a ``collect_sweep`` table that some job reports (the p99
    ones, when a sweep left them out, replaced by its highest percentile)."""
    cols = []
    for c in HEADLINE:
        if c.startswith("p99_"):
            c = _tail_column(table, c[len("p99_"):])
        if c is not None and c in table and table[c].notna().any() and c not in cols:
            cols.append(c)
    return cols


def _missing(v: Any) -> bool:
    return v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))


def _verdict(row: pd.Series) -> str:
    """A job's result: ``failed`` or ``partial`` (its status), else its load verdict
    (``steady``, ``OVERLOADED``, ``burst`` or ``not steady``; ``ok`` when its summary has
    none)."""
    if row["status"] != "ok":
        return str(row["status"])
    overloaded, steady = row.get("overloaded"), row.get("steady")
    if not _missing(overloaded) and bool(overloaded):
        return "OVERLOADED"
    if not _missing(row.get("burst")) and bool(row.get("burst")):
        return "burst"
    if _missing(steady):
        return "ok"
    return "steady" if bool(steady) else "not steady"


def _given(v: Any) -> str:
    """A job number or override value as typed (``4``, not ``4.0``), ``-`` when missing."""
    return "-" if _missing(v) else override_text(v)


def _number(v: Any) -> str:
    """A metric as printed: two decimals for a float, ``-`` when missing."""
    if _missing(v):
        return "-"
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def sweep_table(table: pd.DataFrame, max_rows: int = MAX_ROWS) -> str:
    """A ``collect_sweep`` table as text: one row per job (the first ``max_rows``), with its
    number, the swept overrides, the headline metrics and its result (``failed``,
    ``partial``, or the load verdict), and a last line saying how many jobs were left out."""
    over = swept_columns(table)
    metrics = headline_columns(table)
    shown = table.head(max_rows)
    out = pd.DataFrame({c: shown[c].map(_given) for c in ("job", *over)})
    for c in metrics:
        out[c] = shown[c].map(_number)
    out["result"] = [_verdict(r) for _, r in shown.iterrows()]
    text = out.to_string(index=False)
    left = len(table) - len(shown)
    if left > 0:
        text += f"\n... {left} more jobs not shown (every job is in sweep_summary.csv)"
    return text


class SweepSummary(Callback):
    """At the end of a multirun, aggregate its job folders into one table in the sweep dir."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Write the table and print where it is, how many jobs failed, one line per failed
        (or interrupted) job with its overrides and error, then the table's headline
        columns (``sweep_table``)."""
        sweep_dir = str(config.hydra.sweep.dir)
        try:
            out = write_sweep_summary(sweep_dir)
        except ConfigError as e:  # no job folder here, e.g. the nodes share no file system
            print(f"sweep summary not written: {e}", file=sys.stderr)
            return
        table = pd.read_parquet(out)
        lines = failure_lines(table)
        print(f"sweep: {len(table)} jobs, {len(lines)} failed → {out} (and .csv)")
        for line in lines:
            print(line)
        print(sweep_table(table))
