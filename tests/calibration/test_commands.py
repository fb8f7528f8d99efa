"""``python -m calibration fit|check`` end to end on a tiny synthetic folder, and bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from calibration.__main__ import main
from sim.cost.operators import Efficiency

TIMEOUT_S = 300


def _run(args: list[str], cwd) -> subprocess.CompletedProcess:
    env = dict(os.environ, CI="1", OMP_NUM_THREADS="1")
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, "-m", "calibration", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S)


def test_fit_then_check_on_a_synthetic_folder(tmp_path, synthetic):
    data = synthetic.write_aiconfigurator(tmp_path / "aic")
    out = tmp_path / "fitted.yaml"
    fit = _run(["fit", f"data_dir={data}", "hardware=h100_sxm", "backend=vllm", f"out={out}",
                "max_train_rows=600", f"hydra.run.dir={tmp_path / 'fit_run'}"], tmp_path)
    assert fit.returncode == 0, fit.stderr
    doc = yaml.safe_load(out.read_text())
    Efficiency.from_dict(doc["parameters"])
    assert doc["host"]["fitted"] is False  # a new file gets the default host block
    assert doc["command"].startswith("python -m calibration fit data_dir=")
    assert len(doc["data"]["sha256"]) == 64
    for fam in ("gemm_bfloat16", "attention_prefill", "attention_decode", "allreduce"):
        assert doc["errors"][fam]["held_out"]["rows"] > 0, fam
    assert any("p2p" in a for a in doc["assumptions"])
    run_dir = tmp_path / "check_run"
    check = _run(["check", f"data_dir={data}", "backend=vllm", f"calibration={out}",
                  f"hydra.run.dir={run_dir}"], tmp_path)
    assert check.returncode == 0, check.stderr
    summary = json.loads((run_dir / "check.json").read_text())
    for fam in ("gemm_bfloat16", "gemm_fp8", "attention_prefill", "attention_decode",
                "allreduce", "allgather", "moe_bfloat16"):
        entry = summary[fam]
        assert {"n", "median_abs_pct_error", "p90_abs_pct_error"} <= set(entry), fam
        assert entry["n"] > 0 and entry["median_abs_pct_error"] < 5.0, (fam, entry)
    assert "gemm_bfloat16" in check.stdout and "p90" in check.stdout
    rows = pd.read_parquet(run_dir / "predictions.parquet")
    assert {"family", "measured_s", "predicted_s", "abs_pct_error", "held_out"} <= set(rows)
    assert len(rows) == sum(v["n"] for v in summary.values())


def test_bad_data_dir_is_one_line(tmp_path):
    r = _run(["check", f"data_dir={tmp_path / 'nope'}", f"hydra.run.dir={tmp_path / 'run'}"],
             tmp_path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: data_dir=") and "Traceback" not in (
        r.stderr)


@pytest.mark.parametrize("args, needle", [
    (["fit", "data_dir=/tmp", "max_train_rows=abc"], "max_train_rows"),
    (["check", "data_dir=/tmp", "nonsense=1"], "nonsense"),
    (["frobnicate"], "command='frobnicate'"),
])
def test_bad_overrides_are_one_line(args, needle, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and needle in err[0]
