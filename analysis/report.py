"""Write a run's files (parquet, summary.json) atomically and print its summary table."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from sim.cost.base import BOUNDS
from sim.records import Records

KINDS = ("step", "kv_transfer")  # codes of the timeline's ``kind`` column


def atomic_write(path: Path, write) -> None:
    """Write through a temp file in the same folder, then rename over ``path``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def json_safe(v):
    """``v`` with numpy scalars made Python ones and NaN or infinite floats made ``None``
    (JSON has neither), through dicts, lists and tuples; for ``json.dumps(allow_nan=False)``."""
    if isinstance(v, dict):
        return {str(k): json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    if isinstance(v, np.bool_):
        return bool(v)
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return float(v) if math.isfinite(v) else None
    return v


def write_run(records: Records, summary: dict, outdir: Path) -> None:
    """``requests.parquet``, ``timeline.parquet`` and ``summary.json`` into ``outdir``."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    tl = records.timeline.copy()
    tl["bound"] = pd.Categorical.from_codes(tl["bound"].astype(int), categories=list(BOUNDS))
    if "kind" in tl:
        tl["kind"] = pd.Categorical.from_codes(tl["kind"].astype(int), categories=list(KINDS))
    atomic_write(
        outdir / "requests.parquet", lambda p: records.requests.to_parquet(p, index=False)
    )
    atomic_write(outdir / "timeline.parquet", lambda p: tl.to_parquet(p, index=False))
    text = json.dumps(json_safe(summary), indent=2, allow_nan=False) + "\n"
    atomic_write(outdir / "summary.json", lambda p: Path(p).write_text(text))


def format_summary(s: dict) -> str:
    """A vLLM-benchmark-style table of the main metrics."""
    rows = [
        ("Completed requests", s["completed"]),
        ("Rejected requests", s["rejected"]),
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
        rows += [
            (f"{p.capitalize()} {title}", s[f"{p}_{name}"])
            for p in ("mean", "median", "p90", "p99")
        ]
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
    if s.get("num_replicas", 1) > 1:
        rows.append(("Replicas", s["num_replicas"]))
    if "mean_kv_transfer_ms" in s:
        rows.append(("Mean KV transfer (ms)", s["mean_kv_transfer_ms"]))
    if s.get("num_failures"):
        rows += [("Replica failures", s["num_failures"]),
                 ("Retried requests", s["retried_requests"]),
                 ("Availability", s["availability"])]
    rows += [(f"Step time bound by {b}", s.get(f"{b}_bound_share", 0.0)) for b in BOUNDS]
    for name, c in s.get("classes", {}).items():
        rows += [(f"[{name}] completed / rejected", f"{c['completed']} / {c['rejected']}"),
                 (f"[{name}] Mean TTFT (ms)", c["mean_ttft_ms"]),
                 (f"[{name}] P99 TTFT (ms)", c["p99_ttft_ms"]),
                 (f"[{name}] Mean TPOT (ms)", c["mean_tpot_ms"])]
        if "ttft_slo_attainment" in c:
            rows.append((f"[{name}] TTFT SLO attainment", c["ttft_slo_attainment"]))
    lines = ["{s:{c}^60}".format(s=" Serving Benchmark Result (simulated) ", c="=")]
    for label, v in rows:
        val = f"{v:.2f}" if isinstance(v, float) else str(v)
        lines.append(f"{label:<44}{val:>16}")
    lines.append("=" * 60)
    return "\n".join(lines)


if __name__ == "__main__":  # python -m analysis.report DIR: the Markdown report of DIR
    import sys

    from analysis.report_md import main

    sys.exit(main())
