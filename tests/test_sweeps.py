"""Sweeps (``python -m sim -m``) on Hydra launchers: a failing job is recorded in its
``failed.json`` while the others finish, and the multirun callback writes
``sweep_summary.parquet``/``.csv``. The basic and joblib launchers run here; the Ray launcher
against a running cluster is in ``test_sweeps_ray.py``."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import cli.app
from analysis.collect import collect_sweep

SMALL = ["workload.num_requests=20", "plots=false", "progress=false"]
HAS_JOBLIB = importlib.util.find_spec("hydra_plugins.hydra_joblib_launcher") is not None
SWEEPS = {
    # 2 schedulers × 2 rates; rate=-1 is bad input, so jobs 0 and 2 fail at run time
    "joblib": ["scheduler=vllm,sarathi", "workload.rate=-1,4.5", "hydra/launcher=joblib",
               "hydra.launcher.n_jobs=2"],
    "basic": ["scheduler.max_num_seqs=0,8"],
}


def run_sweep(args: list[str], sweep_dir: Path) -> subprocess.CompletedProcess:
    """``python -m sim -m ARGS`` writing into ``sweep_dir``, as CI would run it."""
    env = dict(os.environ, CI="1")
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, "-m", "sim", "-m", *args, *SMALL,
                           f"hydra.sweep.dir={sweep_dir}"], cwd=sweep_dir.parent, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """Each sweep of SWEEPS run once, in parallel (the joblib one only if it is installed)."""
    root = tmp_path_factory.mktemp("sweeps")
    names = [n for n in SWEEPS if n != "joblib" or HAS_JOBLIB]
    with ThreadPoolExecutor(max_workers=len(names)) as pool:
        futures = {n: pool.submit(run_sweep, SWEEPS[n], root / n) for n in names}
        return {n: (f.result(), root / n) for n, f in futures.items()}


def _done(sweeps, name: str) -> tuple[subprocess.CompletedProcess, Path]:
    if name not in sweeps:
        pytest.skip("hydra-joblib-launcher is not installed (pip install -e '.[test]')")
    proc, sweep_dir = sweeps[name]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, sweep_dir


def test_joblib_sweep_finishes_every_job_and_writes_the_table(sweeps):
    proc, sweep_dir = _done(sweeps, "joblib")
    table = pd.read_parquet(sweep_dir / "sweep_summary.parquet")
    assert len(table) == 4 and table["job"].tolist() == [0, 1, 2, 3]
    assert table["scheduler"].tolist() == ["vllm", "vllm", "sarathi", "sarathi"]
    assert table["workload.rate"].tolist() == [-1, 4.5, -1, 4.5]
    bad = table["workload.rate"] < 0
    assert table["status"].tolist() == ["failed", "ok", "failed", "ok"]
    assert table.loc[bad, "error"].str.startswith("WorkloadError: workload.rate=-1").all()
    ok = table[~bad]
    assert (ok["completed"] == 20).all() and (ok["mean_ttft_ms"] > 0).all()
    assert ok["p99_tpot_ms"].notna().all() and table.loc[bad, "mean_ttft_ms"].isna().all()
    # one line per failed job, and one for the table
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: job")]
    assert len(errors) == 2 and all("WorkloadError" in ln for ln in errors)
    assert "sweep: 4 jobs, 2 failed" in proc.stdout
    listed = [ln for ln in proc.stdout.splitlines() if ln.startswith("  job ")]
    assert [ln.split(" failed: ")[0] for ln in listed] == [
        "  job 0 (scheduler=vllm workload.rate=-1)", "  job 2 (scheduler=sarathi workload.rate=-1)"]
    assert all("WorkloadError: workload.rate=-1" in ln for ln in listed)
    csv = pd.read_csv(sweep_dir / "sweep_summary.csv")
    np.testing.assert_allclose(csv["mean_ttft_ms"], table["mean_ttft_ms"])


def test_failed_job_leaves_failed_json_with_its_overrides(sweeps):
    _, sweep_dir = _done(sweeps, "joblib")
    record = json.loads((sweep_dir / "0" / "failed.json").read_text())
    assert record["error_type"] == "WorkloadError"
    assert record["message"].startswith("workload.rate=-1")
    assert "\n" not in record["message"] and "traceback" not in record
    assert record["overrides"][:2] == ["scheduler=vllm", "workload.rate=-1"]
    assert not (sweep_dir / "0" / "summary.json").exists()
    assert (sweep_dir / "1" / "summary.json").exists()
    assert not (sweep_dir / "1" / "failed.json").exists()


def test_collect_rebuilds_the_callbacks_table(sweeps):
    _, sweep_dir = _done(sweeps, "joblib")
    written = pd.read_parquet(sweep_dir / "sweep_summary.parquet")
    pd.testing.assert_frame_equal(collect_sweep(sweep_dir), written, check_dtype=False)


def test_basic_launcher_also_finishes_after_a_failed_job(sweeps):
    proc, sweep_dir = _done(sweeps, "basic")
    table = pd.read_parquet(sweep_dir / "sweep_summary.parquet")
    assert table["status"].tolist() == ["failed", "ok"]
    assert table.loc[0, "error"] == "ConfigError: scheduler.max_num_seqs=0: must be > 0"
    assert table["scheduler.max_num_seqs"].tolist() == [0, 8]
    assert "sweep: 2 jobs, 1 failed" in proc.stdout
    # the end of the sweep lists each failure with its overrides and error
    assert ("  job 0 (scheduler.max_num_seqs=0) failed: ConfigError: "
            "scheduler.max_num_seqs=0: must be > 0") in proc.stdout.splitlines()


def test_unexpected_error_is_recorded_with_its_traceback(tmp_path, monkeypatch, capsys):
    def boom(cfg, outdir):
        raise RuntimeError("simulated crash\nsecond line")

    monkeypatch.setattr(cli.app, "run", boom)
    assert cli.app.run_sweep_job(None, tmp_path, "7", ["seed=3"]) is None
    record = json.loads((tmp_path / "failed.json").read_text())
    assert record["error_type"] == "RuntimeError"
    assert record["message"] == "simulated crash; second line"
    assert record["overrides"] == ["seed=3"]
    assert "Traceback" in record["traceback"] and "boom" in record["traceback"]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: job 7 (seed=3) failed: RuntimeError")


def test_a_job_that_succeeds_clears_an_old_failed_json(tmp_path, monkeypatch):
    (tmp_path / "failed.json").write_text("{}")
    monkeypatch.setattr(cli.app, "run", lambda cfg, outdir: {"completed": 1})
    assert cli.app.run_sweep_job(None, tmp_path, "0", []) == {"completed": 1}
    assert not (tmp_path / "failed.json").exists()


def test_bad_input_of_a_single_run_still_exits_2(tmp_path):
    env = dict(os.environ, CI="1")
    proc = subprocess.run([sys.executable, "-m", "sim", "workload.rate=-1", *SMALL,
                           f"hydra.run.dir={tmp_path / 'run'}"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("error: workload.rate=-1.0: must be a number > 0 "
                                   "(inf: every request at once)")
    assert not (tmp_path / "run" / "failed.json").exists()



def test_sweep_variants_try_every_value_once():
    from cli.preflight import sweep_variants
    got = sweep_variants(["scheduler=vllm,sarathi", "workload.rate=2,4,6", "seed=0",
                          "+foo=a,b"])
    assert got[0] == ["scheduler=vllm", "workload.rate=2", "seed=0", "+foo=a"]
    assert ["scheduler=sarathi", "workload.rate=2", "seed=0", "+foo=a"] in got
    assert ["scheduler=vllm", "workload.rate=6", "seed=0", "+foo=a"] in got
    assert ["scheduler=vllm", "workload.rate=2", "seed=0", "+foo=b"] in got
    assert len(got) == 1 + 1 + 2 + 1


@pytest.mark.parametrize("bad, expected", [
    ("scheduler=vllm,bogus", "error: scheduler='bogus': unknown option; available:"),
    ("workload.rate=2,abc", "error: workload.rate: Value 'abc'"),
])
def test_a_bad_sweep_value_is_one_line_before_any_job(tmp_path, bad, expected):
    env = dict(os.environ, CI="1")
    proc = subprocess.run([sys.executable, "-m", "sim", "-m", bad, *SMALL,
                           f"hydra.sweep.dir={tmp_path / 'sweep'}"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(expected)
    assert not (tmp_path / "sweep").exists()
