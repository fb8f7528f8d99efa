"""The table a multirun prints when it ends (``analysis.sweep_callback``): one row per job with
its swept overrides, headline metrics and load verdict, failed jobs as failed, at most
``MAX_ROWS`` rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from analysis.collect import collect_sweep
from analysis.sweep_callback import MAX_ROWS, SweepSummary, sweep_table


def _job(root: Path, num: int, overrides: list[str], summary: dict | None = None,
         failed: dict | None = None) -> None:
    d = root / str(num)
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (d / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"job": {"num": num}}}))
    if summary is not None:
        (d / "summary.json").write_text(json.dumps(summary))
    if failed is not None:
        (d / "failed.json").write_text(json.dumps(failed))


def _summary(rate: float, steady: bool, overloaded: bool, **extra) -> dict:
    return {"completed": 30, "partial": False, "request_throughput": rate,
            "median_ttft_ms": 100.0 + rate, "p99_ttft_ms": 400.0 + rate,
            "median_tpot_ms": 12.5, "mean_e2el_ms": 900.0, "steady": steady,
            "overloaded": overloaded, "load_verdict": "...", **extra}


def _end(root: Path, capsys) -> list[str]:
    """Run the callback on the sweep dir ``root``; its stdout lines."""
    SweepSummary().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(root)}}}))
    return capsys.readouterr().out.splitlines()


def _row(lines: list[str], job: int) -> list[str]:
    (row,) = [ln.split() for ln in lines if ln.split()[:1] == [str(job)]]
    return row


@pytest.fixture
def sweep(tmp_path) -> Path:
    """rate=1,2,4,8 × scheduler=vllm: steady, not steady, overloaded, failed; and a partial."""
    root = tmp_path / "sweep"
    root.mkdir()
    _job(root, 0, ["workload.rate=1", "scheduler=vllm"], _summary(1.0, True, False))
    _job(root, 1, ["workload.rate=2", "scheduler=vllm"], _summary(2.0, False, False))
    _job(root, 2, ["workload.rate=4", "scheduler=vllm"], _summary(3.5, False, True))
    _job(root, 3, ["workload.rate=8", "scheduler=vllm"],
         failed={"error_type": "ConfigError", "message": "scheduler.max_num_seqs=0: must be > 0"})
    _job(root, 4, ["workload.rate=16", "scheduler=vllm"],
         _summary(3.0, False, True, partial=True, unfinished=5, interrupted_at_sim_s=9.0))
    return root


def test_the_callback_prints_one_row_per_job_with_its_verdict(sweep, capsys):
    lines = _end(sweep, capsys)
    assert lines[0].startswith("sweep: 5 jobs, 2 failed → ")
    header = next(ln for ln in lines if "request_throughput" in ln).split()
    # the swept override only (scheduler is the same everywhere), then the headline metrics
    assert header == ["job", "workload.rate", "request_throughput", "median_ttft_ms",
                      "p99_ttft_ms", "median_tpot_ms", "result"]
    assert _row(lines, 0) == ["0", "1", "1.00", "101.00", "401.00", "12.50", "steady"]
    assert _row(lines, 1)[-2:] == ["not", "steady"]
    assert _row(lines, 2)[-1] == "OVERLOADED"
    assert _row(lines, 3) == ["3", "8", "-", "-", "-", "-", "failed"]
    assert _row(lines, 4)[-1] == "partial" and _row(lines, 4)[2] == "3.00"
    # the lines naming each failed job are still there, before the table
    assert sum(ln.startswith("  job ") for ln in lines) == 2


def test_at_most_max_rows_jobs_are_printed(tmp_path):
    root = tmp_path / "big"
    root.mkdir()
    n = MAX_ROWS + 7
    for i in range(n):
        _job(root, i, [f"seed={i}"], _summary(2.0, True, False))
    text = sweep_table(collect_sweep(root))
    rows = [ln for ln in text.splitlines() if ln.split()[0].isdigit()]
    assert len(rows) == MAX_ROWS and rows[-1].split()[0] == str(MAX_ROWS - 1)
    assert text.splitlines()[-1].startswith("... 7 more jobs not shown")


def test_other_percentiles_and_summaries_without_a_verdict(tmp_path):
    """A sweep with ``metrics.percentiles=[50,99.9]`` has no p99: its highest percentile
    stands in; a summary without the load verdict is ``ok``."""
    root = tmp_path / "p999"
    root.mkdir()
    for i, rate in enumerate((2, 4)):
        s = {k: v for k, v in _summary(rate, True, False).items()
             if k not in ("p99_ttft_ms", "steady", "overloaded")}
        _job(root, i, [f"workload.rate={rate}"], {**s, "p99.9_ttft_ms": 500.0,
                                                 "p95_ttft_ms": 450.0})
    text = sweep_table(collect_sweep(root))
    assert text.splitlines()[0].split() == ["job", "workload.rate", "request_throughput",
                                            "median_ttft_ms", "p99.9_ttft_ms",
                                            "median_tpot_ms", "result"]
    assert text.splitlines()[1].split()[-2:] == ["12.50", "ok"]


def test_a_real_sweep_prints_its_table(tmp_path):
    env = dict(os.environ, CI="1")
    env.pop("HYDRA_FULL_ERROR", None)
    proc = subprocess.run([sys.executable, "-m", "sim", "-m", "workload.rate=2,4",
                           "workload.num_requests=30", "plots=false", "progress=false",
                           f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("sweep: 2 jobs, 0 failed"))
    header = lines[start + 1].split()
    assert header[:3] == ["job", "workload.rate", "request_throughput"]
    assert header[-1] == "result" and "p99_ttft_ms" in header
    rows = [ln.split() for ln in lines[start + 2:start + 4]]
    assert [r[:2] for r in rows] == [["0", "2"], ["1", "4"]]
    assert all(" ".join(r).endswith(("steady", "OVERLOADED")) for r in rows), rows
