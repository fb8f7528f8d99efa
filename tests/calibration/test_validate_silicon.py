"""End-to-end fidelity script ``calibration.validate_silicon`` on the shared silicon CSV."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[2]
SILICON = REPO.parent / "shared" / "data" / "aiconfigurator" / "silicon_sample_h100.csv"
if str(REPO) not in sys.path:  # run without installing the package
    sys.path.insert(0, str(REPO))

from calibration.validate_silicon import COLUMNS, concurrency_of, main  # noqa: E402


def test_three_rows_write_finite_errors(tmp_path, capsys):
    if not SILICON.is_file():
        pytest.skip(f"silicon CSV not found at {SILICON} (expected ../shared next to the repo)")
    out = tmp_path / "results.csv"
    rc = main(["--data", str(SILICON), "--rows", "3", "--num-requests-per-client", "3",
               "--out", str(out)])
    assert rc == 0
    table = pd.read_csv(out)
    assert list(table.columns) == COLUMNS
    assert len(table) == 3
    assert (table["backend"] == "trtllm").all()
    for col in ("pred_ttft_ms", "pred_tpot_ms", "ttft_err_pct", "tpot_err_pct"):
        assert np.isfinite(table[col]).all(), col
    assert (table["pred_ttft_ms"] > 0).all() and (table["pred_tpot_ms"] > 0).all()
    # 3 requests per client, the first and last of each discarded
    assert (table["steady_requests"] == table["concurrency"]).all()
    printed = capsys.readouterr().out
    assert "TensorRT-LLM (trtllm)" in printed and "imitates vLLM" in printed
    assert "Median absolute % error" in printed


def test_missing_data_is_one_line_exit_2(tmp_path, capsys):
    missing = tmp_path / "nope.csv"
    rc = main(["--data", str(missing), "--out", str(tmp_path / "r.csv")])
    assert rc == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"error: --data={missing}: not found"]
    assert not (tmp_path / "r.csv").exists()


def test_concurrency_prefers_stated_value():
    rows = pd.DataFrame({
        "silicon_data_source": ["a; silicon_concurrency=12", "b", "c"],
        "batch_size": [8.0, 8.0, 16.0],
        "attention_dp_size": [np.nan, 4.0, np.nan],
    })
    assert concurrency_of(rows).tolist() == [12, 32, 16]
