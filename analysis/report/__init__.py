"""Write a run's files (parquet, plots, summary.json) atomically and print its summary table.

Every file is written to a temp name in its folder and renamed over the target, so an
interrupted run never leaves a truncated file under a real name; a file that cannot be
written (a full disk, a read-only folder) raises ``sim.errors.OutputError`` naming it.
``summary.json`` is written after the tables and lists the files it completes, again after
the plots: a run folder is complete (``run_is_complete``) when it says ``"partial": false``,
has no ``pending_outputs`` and each file it lists exists.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pandas as pd

from analysis.autoscaling import replica_states
from analysis.files import atomic_write, make_folder, write_json
from analysis.metrics import percentile_of, reported_labels
from sim.cost.base import BOUNDS
from sim.errors import OutputError
from sim.records import Records
from sim.timeline_file import KINDS

SUMMARY_JSON = "summary.json"
FAILED_JSON = "failed.json"  # a failed sweep job's error (cli.app.write_failure)


def write_tables(records: Records, outdir: Path) -> list[Path]:
    """``requests.parquet`` and ``timeline.parquet`` into ``outdir``; returns their paths.
    A run that kept step totals only (``timeline: false``) has no ``timeline.parquet``: one
    left in ``outdir`` by an earlier run is removed."""
    outdir = make_folder(outdir)
    paths = [outdir / "requests.parquet", outdir / "timeline.parquet"]
    atomic_write(paths[0], lambda p: records.requests.to_parquet(p, index=False))
    if "autoscaler" in records.meta:  # every replica's state changes
        paths.append(outdir / "replicas.parquet")
        atomic_write(paths[-1], lambda p: replica_states(records.meta).to_parquet(p, index=False))
    else:
        (outdir / "replicas.parquet").unlink(missing_ok=True)
    if "timeline_file" in records.meta:  # streamed there by the run (sim.timeline_file)
        return [paths[0], Path(records.meta["timeline_file"]), *paths[2:]]
    if "step_totals" in records.meta:
        paths[1].unlink(missing_ok=True)
        return [paths[0], *paths[2:]]
    tl = records.timeline.copy(deep=False)  # only the two coded columns are replaced
    tl["bound"] = pd.Categorical.from_codes(tl["bound"].astype(int), categories=list(BOUNDS))
    if "kind" in tl:
        tl["kind"] = pd.Categorical.from_codes(tl["kind"].astype(int), categories=list(KINDS))
    atomic_write(paths[1], lambda p: tl.to_parquet(p, index=False))
    return paths


def write_job_tables(records, outdir: Path) -> list[Path]:
    """``jobs.parquet`` and ``nodes.parquet`` of a diffusion run (``DiffusionRecords``) into
    ``outdir``; returns their paths."""
    outdir = make_folder(outdir)
    paths = [outdir / "jobs.parquet", outdir / "nodes.parquet"]
    atomic_write(paths[0], lambda p: records.jobs.to_parquet(p, index=False))
    atomic_write(paths[1], lambda p: records.nodes.to_parquet(p, index=False))
    if "autoscaler" in records.meta:  # every node's state changes
        paths.append(outdir / "replicas.parquet")
        atomic_write(paths[-1], lambda p: replica_states(records.meta).to_parquet(p, index=False))
    return paths


def write_summary(summary: dict, outdir: Path, outputs: list[Path],
                  pending: list[str] | tuple = ()) -> Path:
    """``summary.json`` into ``outdir``, with ``outputs`` (the run's other files, written
    before it) listed by name relative to ``outdir`` and ``pending`` the outputs still to
    come (``["plots"]``: the metrics are final, the plots not yet drawn); ``partial`` is
    false unless the summary says otherwise. Write it after the files it lists: it is the
    run's completion marker once nothing is pending."""
    outdir = Path(outdir)
    doc = {**summary, "partial": bool(summary.get("partial", False)),
           "pending_outputs": list(pending),
           "outputs": [Path(os.path.relpath(p, outdir)).as_posix() for p in outputs]}
    path = outdir / SUMMARY_JSON
    write_json(path, doc)
    return path


RUN_FILES = ("requests.parquet", "timeline.parquet", "replicas.parquet", "jobs.parquet",
             "nodes.parquet",
             FAILED_JSON, "report.md")  # what a run may leave besides the files it lists


def clear_run(outdir: Path) -> None:
    """Remove an earlier run's outputs from ``outdir`` before a new run writes there (a
    ``resume=true`` rerun, a sweep job run again): ``summary.json`` first, so the folder is
    never taken for complete meanwhile, then every file it listed and ``RUN_FILES``; the
    new run's files are never left beside the old one's."""
    outdir = Path(outdir)
    try:
        listed = json.loads((outdir / SUMMARY_JSON).read_text()).get("outputs", [])
    except (OSError, ValueError, AttributeError):
        listed = []
    names = [n for n in listed if isinstance(n, str) and n == Path(n).name]  # its own files
    for name in dict.fromkeys([SUMMARY_JSON, *names, *RUN_FILES]):
        try:
            (outdir / name).unlink(missing_ok=True)
        except OSError as e:
            raise OutputError(outdir / name, e) from e


def write_run(records: Records, summary: dict, outdir: Path) -> list[Path]:
    """``requests.parquet``, ``timeline.parquet`` and, last, ``summary.json`` into
    ``outdir``; returns the paths written."""
    tables = write_tables(records, outdir)
    return [*tables, write_summary(summary, outdir, tables)]


def run_is_complete(outdir: Path) -> bool:
    """Whether ``outdir`` holds a complete run: a readable ``summary.json`` with
    ``"partial": false``, no ``pending_outputs``, whose every listed output exists
    (``failed.json`` absent)."""
    outdir = Path(outdir)
    try:
        doc = json.loads((outdir / SUMMARY_JSON).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(doc, dict) or doc.get("partial") is not False:
        return False
    if doc.get("pending_outputs"):  # e.g. Ctrl-C while drawing the plots
        return False
    outputs = doc.get("outputs")
    if not isinstance(outputs, list):
        return False
    return (not (outdir / FAILED_JSON).exists()
            and all((outdir / str(name)).is_file() for name in outputs))


def _load_rows(s: dict, unit: str, prefix: str = "") -> list[tuple[str, object]]:
    """The offered rate and the steady-state verdict (``analysis.steady.Load``) as rows."""
    closed = ", closed loop" if s.get(f"{prefix}closed_loop") else ""
    steady = ("yes" if s.get(f"{prefix}steady") else
              "no: OVERLOADED" if s.get(f"{prefix}overloaded") else
              "no: BURST" if s.get(f"{prefix}burst") else "no")
    return [(f"Offered rate ({unit}/s{closed})", s.get(f"{prefix}offered_rate", math.nan)),
            ("Steady state", steady)]


def _reason_rows(label: str, reasons: dict | None) -> list[tuple[str, object]]:
    """One indented row per reason, e.g. ``  rejected: exceeds_max_model_len``."""
    return [(f"  {label}: {r}", n) for r, n in sorted((reasons or {}).items())]


def reasons_text(count: int, what: str, reasons: dict | None) -> str:
    """``20 rejected (exceeds_max_model_len: 20)``: a count with its reasons."""
    by = ", ".join(f"{r}: {n}" for r, n in sorted((reasons or {}).items()))
    return f"{count} {what}" + (f" ({by})" if by else "")


def _stat_rows(s: dict, name: str, title: str) -> list[tuple[str, object]]:
    """``Mean``, ``Median`` and each reported percentile (``P99.9 TTFT (ms)``) of ``name``."""
    return [(f"{p.capitalize()} {title}", s[f"{p}_{name}"])
            for p in ("mean", *reported_labels(s, name))]


def format_summary(s: dict) -> str:
    """A vLLM-benchmark-style table of the main metrics, after the run's load verdict (its
    first line: steady, not steady or OVERLOADED)."""
    rows = [
        *_load_rows(s, "req"),
        ("Completed requests", s["completed"]),
        ("Rejected requests", s["rejected"]),
        *_reason_rows("rejected", s.get("rejected_reasons")),
        ("Failed requests", s.get("failed", 0)),
        *_reason_rows("failed", s.get("failed_reasons")),
    ]
    if s.get("partial"):
        rows += [("Unfinished requests (interrupted)", s.get("unfinished", 0)),
                 ("Interrupted at (simulated s)", s.get("interrupted_at_sim_s", float("nan")))]
    rows += [
        ("Duration (s)", s["duration_s"]),
        ("Request throughput (req/s)", s["request_throughput"]),
        ("Output token throughput (tok/s)", s["output_throughput"]),
        ("Total token throughput (tok/s)", s["total_token_throughput"]),
    ]
    if "request_goodput" in s:
        rows += [
            ("Request goodput (req/s)", s["request_goodput"]),
            ("SLO attainment", s["slo_attainment"]),
        ]
    for name, title in (
        ("ttft_ms", "TTFT (ms)"),
        ("tpot_ms", "TPOT (ms)"),
        ("itl_ms", "ITL (ms)"),
        ("e2el_ms", "E2E latency (ms)"),
    ):
        rows += _stat_rows(s, name, title)
    rows += [
        ("Mean batch size (seqs)", s.get("mean_batch_size", float("nan"))),
        ("Mean KV-cache usage", s.get("mean_kv_usage", float("nan"))),
        ("Preemptions", s["num_preemptions"]),
    ]
    if s.get("num_swaps"):
        rows.append(("Swaps", s["num_swaps"]))
    hit = s.get("prefix_cache_hit_rate")
    if hit is not None and not math.isnan(hit):
        rows.append(("Prefix-cache hit rate", hit))
    if s.get("num_replicas", 1) > 1 and "gpu_hours" not in s:  # autoscaled: rows below
        rows.append(("Replicas", s["num_replicas"]))
    if "gpu_hours" in s:  # autoscaled
        rows += _autoscaler_rows(s, "replicas", "requests")
    if "mean_kv_transfer_ms" in s:
        rows.append(("Mean KV transfer (ms)", s["mean_kv_transfer_ms"]))
    if s.get("num_failures"):
        rows += [("Replica failures", s["num_failures"]),
                 ("Retried requests", s["retried_requests"]),
                 ("Availability", s["availability"])]
    rows += [(f"Step time bound by {b}", s.get(f"{b}_bound_share", 0.0)) for b in BOUNDS]
    for name, c in s.get("classes", {}).items():
        top = max(reported_labels(c, "ttft_ms"), key=percentile_of)  # p99 by default
        rows += [(f"[{name}] completed / rejected", f"{c['completed']} / {c['rejected']}"),
                 (f"[{name}] Mean TTFT (ms)", c["mean_ttft_ms"]),
                 (f"[{name}] {top.capitalize()} TTFT (ms)", c[f"{top}_ttft_ms"]),
                 (f"[{name}] Mean TPOT (ms)", c["mean_tpot_ms"])]
        if "ttft_slo_attainment" in c:
            rows.append((f"[{name}] TTFT SLO attainment", c["ttft_slo_attainment"]))
    return _table(" Serving Benchmark Result (simulated) ", rows, s.get("load_verdict"))


def _autoscaler_rows(s: dict, units: str, work: str) -> list[tuple[str, object]]:
    """An autoscaled run's rows (``analysis.autoscaling.autoscaler_metrics``): ``units``
    (replicas or nodes) moved, GPU-hours and cost, ``work`` that arrived in a ramp."""
    return [("Autoscaler", s["autoscaler_policy"]),
            (f"Mean / peak {units}", f"{s['mean_replicas']:.2f} / {s['peak_replicas']}"),
            ("Scale-ups / drains", f"{s['scale_ups']} / {s['drains']}"),
            ("Scale-up delay (s)", s["scale_up_delay_s"]),
            ("GPU-hours", s["gpu_hours"]), ("Cost (USD)", s["cost"]),
            (f"{work.capitalize()} arrived while scaling up", s["arrived_while_scaling_up"])]


def _table(title: str, rows: list[tuple[str, object]], first: str | None = None) -> str:
    """``vllm bench serve``-style table: ``first`` (a line above it), a centred title rule,
    label/value lines, a rule."""
    lines = [first] if first else []
    lines.append("{s:{c}^60}".format(s=title, c="="))
    for label, v in rows:
        val = f"{v:.2f}" if isinstance(v, float) else str(v)
        lines.append(f"{label:<44}{val:>16}")
    lines.append("=" * 60)
    return "\n".join(lines)


def format_job_summary(s: dict) -> str:
    """The main diffusion metrics as a table like ``format_summary``'s."""
    rows = [*_load_rows(s, "jobs", "jobs_"),
            ("Completed jobs", s["jobs_completed"]), ("Rejected jobs", s["jobs_rejected"]),
            *_reason_rows("rejected", s.get("jobs_rejected_reasons")),
            ("Failed jobs", s["jobs_failed"]),
            *_reason_rows("failed", s.get("jobs_failed_reasons"))]
    if s.get("partial"):
        rows.append(("Unfinished jobs (interrupted)", s.get("jobs_unfinished", 0)))
    rows += [("Duration (s)", s["jobs_duration_s"]), ("Jobs per hour", s["jobs_per_hour"]),
             ("Images per hour", s["images_per_hour"]),
             ("Videos per hour", s["videos_per_hour"]),
             ("GPU utilization", s["gpu_utilization"])]
    for name, title in (("job_latency_s", "job latency (s)"), ("job_queue_s", "queue wait (s)"),
                        ("job_service_s", "service time (s)")):
        rows += _stat_rows(s, name, title)
    rows += [("Mean steps per second", s["mean_steps_per_s"]),
             ("Preemptions", s["num_job_preemptions"]), ("Restarts", s["num_job_restarts"])]
    if "gpu_hours" in s and "request_throughput" not in s:  # its nodes autoscaled
        rows += _autoscaler_rows(s, "nodes", "jobs")
    if s.get("num_node_failures"):
        rows += [("Node failures", s["num_node_failures"]),
                 ("Node availability", s["node_availability"])]
    return _table(" Diffusion Serving Result (simulated) ", rows, s.get("jobs_load_verdict"))
