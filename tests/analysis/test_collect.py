"""``analysis.collect``: the sweep table from hand-made job folders (no simulation runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from analysis.collect import (
    NOT_FINISHED,
    collect_sweep,
    failure_lines,
    parse_overrides,
    write_sweep_summary,
)
from sim.errors import ConfigError


def _job(root: Path, sub: str, num: int | None, overrides: list[str], summary: dict | None = None,
         failed: dict | None = None) -> Path:
    d = root / sub
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    if num is not None:
        (d / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"job": {"num": num}}}))
    if summary is not None:
        (d / "summary.json").write_text(json.dumps(summary))
    if failed is not None:
        (d / "failed.json").write_text(json.dumps(failed))
    return d


def _summary(ttft: float, scheduler: str, seed: int, **extra) -> dict:
    return {"completed": 10, "mean_ttft_ms": ttft, "prefix_cache_hit_rate": None,
            "rejected_reasons": {}, "scheduler": scheduler, "seed": seed, **extra}


@pytest.fixture
def sweep(tmp_path) -> Path:
    """A 2 schedulers × 2 rates sweep: three jobs done (one with nested metrics), one failed,
    one that never finished; job folders 0..4 written out of order, plus a multirun.yaml."""
    root = tmp_path / "sweep"
    (root).mkdir()
    (root / "multirun.yaml").write_text("hydra: {}\n")
    _job(root, "3", 3, ["scheduler=sarathi", "workload.rate=4"],
         failed={"error_type": "ConfigError", "message": "scheduler.chunk_size=0: must be > 0",
                 "overrides": ["scheduler=sarathi", "workload.rate=4"]})
    _job(root, "0", 0, ["scheduler=vllm", "workload.rate=2"], _summary(50.0, "vllm", 0))
    _job(root, "1", 1, ["scheduler=vllm", "workload.rate=4.5"],
         _summary(80.0, "vllm", 0, rejected_reasons={"exceeds_max_model_len": 2}))
    _job(root, "2", 2, ["scheduler=sarathi", "workload.rate=2"], _summary(40.0, "sarathi", 0))
    _job(root, "4", 4, ["scheduler=sarathi", "workload.rate=8"])
    return root


def test_one_row_per_job_with_status_and_error(sweep):
    t = collect_sweep(sweep)
    assert list(t.columns[:4]) == ["job", "dir", "status", "error"]
    assert t["job"].tolist() == [0, 1, 2, 3, 4]
    assert t["dir"].tolist() == ["0", "1", "2", "3", "4"]
    assert t["status"].tolist() == ["ok", "ok", "ok", "failed", "failed"]
    assert t.loc[3, "error"] == "ConfigError: scheduler.chunk_size=0: must be > 0"
    assert t.loc[4, "error"] == NOT_FINISHED
    assert t.loc[:2, "error"].isna().all()


def test_override_columns_are_typed_and_metrics_flattened(sweep):
    t = collect_sweep(sweep)
    assert t["scheduler"].tolist() == ["vllm", "vllm", "sarathi", "sarathi", "sarathi"]
    assert pd.api.types.is_float_dtype(t["workload.rate"])
    assert t["workload.rate"].tolist() == [2, 4.5, 2, 4, 8]
    np.testing.assert_allclose(t["mean_ttft_ms"], [50, 80, 40, np.nan, np.nan])
    assert t.loc[1, "rejected_reasons.exceeds_max_model_len"] == 2
    assert np.isnan(t.loc[0, "rejected_reasons.exceeds_max_model_len"])
    # the summary's scheduler repeats the override: one column; seed is not an override here
    assert "summary.scheduler" not in t and t["seed"].iloc[0] == 0
    # override columns come before metrics
    cols = list(t.columns)
    assert cols.index("workload.rate") < cols.index("completed")


def test_parse_overrides_types_values():
    got = parse_overrides(["workload.rate=2", "a=2.5", "+b.c=true", "~d", "e=null", "f='3'",
                           "g=[1,2]", "kv_cache=paged"])
    assert got == {"workload.rate": 2, "a": 2.5, "b.c": True, "d": None, "e": None, "f": "3",
                   "g": "[1, 2]", "kv_cache": "paged"}


def test_mixed_override_types_become_strings(tmp_path):
    _job(tmp_path, "0", 0, ["kv_cache.num_gpu_blocks=null"], _summary(1.0, "vllm", 0))
    _job(tmp_path, "1", 1, ["kv_cache.num_gpu_blocks=100"], _summary(1.0, "vllm", 0))
    _job(tmp_path, "2", 2, ["kv_cache.num_gpu_blocks=auto"], _summary(1.0, "vllm", 0))
    t = collect_sweep(tmp_path)
    col = t["kv_cache.num_gpu_blocks"]
    assert pd.isna(col[0]) and col[1:].tolist() == ["100", "auto"]
    write_sweep_summary(tmp_path)  # parquet can hold it


def test_metric_that_differs_from_its_override_is_kept_apart(tmp_path):
    _job(tmp_path, "0", 0, ["model=/x/config.json"], {"model": "llama", "completed": 1})
    t = collect_sweep(tmp_path)
    assert t.loc[0, "model"] == "/x/config.json" and t.loc[0, "summary.model"] == "llama"


def test_newer_of_summary_and_failed_wins(tmp_path):
    d = _job(tmp_path, "0", 0, ["seed=1"], _summary(1.0, "vllm", 1),
             failed={"error_type": "ValueError", "message": "old"})
    os.utime(d / "failed.json", (1, 1))
    assert collect_sweep(tmp_path)["status"].tolist() == ["ok"]
    os.utime(d / "summary.json", (0, 0))
    assert collect_sweep(tmp_path)["status"].tolist() == ["failed"]


def test_nested_subdirs_and_job_number_fallback(tmp_path):
    _job(tmp_path, "rate=2/seed=0", 7, ["seed=0"], _summary(1.0, "vllm", 0))
    _job(tmp_path, "5", None, ["seed=1"], _summary(1.0, "vllm", 1))
    t = collect_sweep(tmp_path)
    assert t["job"].tolist() == [5, 7] and t["dir"].tolist() == ["5", "rate=2/seed=0"]


def test_write_sweep_summary_parquet_and_csv_match(sweep):
    out = write_sweep_summary(sweep)
    assert out == sweep / "sweep_summary.parquet"
    table = collect_sweep(sweep)
    back = pd.read_parquet(out)
    pd.testing.assert_frame_equal(back, table, check_dtype=False)
    csv = pd.read_csv(sweep / "sweep_summary.csv")
    assert csv.shape == table.shape and list(csv.columns) == list(table.columns)
    np.testing.assert_allclose(csv["workload.rate"], table["workload.rate"])


def test_empty_or_missing_dir_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="no job folder"):
        collect_sweep(tmp_path)
    with pytest.raises(ConfigError, match="existing sweep directory"):
        collect_sweep(tmp_path / "nope")


def test_cli_rebuilds_the_table_and_rejects_bad_dir(sweep, tmp_path):
    ok = subprocess.run([sys.executable, "-m", "analysis.collect", str(sweep)],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "5 jobs, 2 failed" in ok.stdout and (sweep / "sweep_summary.csv").exists()
    bad = subprocess.run([sys.executable, "-m", "analysis.collect", str(tmp_path / "nope")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "DIR=" in bad.stderr


def test_partial_job_and_bookkeeping_keys(tmp_path):
    _job(tmp_path, "0", 0, ["seed=0"], _summary(1.0, "vllm", 0, partial=False, unfinished=0,
                                               outputs=["requests.parquet"],
                                               config_sha256="ab"))
    _job(tmp_path, "1", 1, ["seed=1"], _summary(2.0, "vllm", 1, partial=True, unfinished=7,
                                               interrupted_at_sim_s=12.5, outputs=[],
                                               config_sha256="cd"))
    t = collect_sweep(tmp_path)
    assert t["status"].tolist() == ["ok", "partial"]
    assert t.loc[1, "error"] == "interrupted at 12.5 simulated s with 7 requests unfinished"
    assert t["unfinished"].tolist() == [0, 7] and t["partial"].tolist() == [False, True]
    assert "outputs" not in t and "config_sha256" not in t
    write_sweep_summary(tmp_path)


def test_failure_lines_name_each_job_its_overrides_and_error(sweep):
    lines = failure_lines(collect_sweep(sweep))
    assert lines == [
        "  job 3 (scheduler=sarathi workload.rate=4) failed: ConfigError: "
        "scheduler.chunk_size=0: must be > 0",
        f"  job 4 (scheduler=sarathi workload.rate=8) failed: {NOT_FINISHED}",
    ]
