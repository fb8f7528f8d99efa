"""A 4-job sweep through Hydra's Ray launcher joining a running Ray cluster.

Runs only when ``SIM_RAY_ADDRESS`` (``HOST:PORT`` of a cluster started with ``ray start
--head``) is set and the ``ray`` extra is installed; ``.ci/sweeps`` does both.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pandas as pd
import pytest

ADDRESS = os.environ.get("SIM_RAY_ADDRESS", "")
pytestmark = [
    pytest.mark.skipif(not ADDRESS, reason="no Ray cluster: set SIM_RAY_ADDRESS=HOST:PORT "
                       "(.ci/sweeps starts one)"),
    pytest.mark.skipif(importlib.util.find_spec("hydra_plugins.hydra_ray_launcher") is None,
                       reason="hydra-ray-launcher is not installed (pip install -e '.[ray]')"),
]


def test_ray_sweep_writes_the_aggregated_table(tmp_path):
    sweep_dir = tmp_path / "ray_sweep"
    env = dict(os.environ, CI="1")
    env.pop("HYDRA_FULL_ERROR", None)
    proc = subprocess.run(
        [sys.executable, "-m", "sim", "-m", "scheduler=vllm,sarathi", "seed=0,1",
         "workload.num_requests=20", "plots=false", "progress=false", "hydra/launcher=ray",
         f"hydra.launcher.ray.init.address={ADDRESS}", f"hydra.sweep.dir={sweep_dir}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Connecting to existing Ray cluster" in proc.stdout + proc.stderr
    table = pd.read_parquet(sweep_dir / "sweep_summary.parquet")
    assert len(table) == 4 and (table["status"] == "ok").all(), table.iloc[:, :6]
    assert sorted(zip(table["scheduler"], table["seed"], strict=True)) == [
        ("sarathi", 0), ("sarathi", 1), ("vllm", 0), ("vllm", 1)]
    assert (table["completed"] == 20).all()
    for metric in ("mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "request_throughput"):
        assert table[metric].gt(0).all(), metric
    # common random numbers: the same seed gives both schedulers the same requests
    by_seed = table.groupby("seed")["total_input_tokens"].nunique()
    assert (by_seed == 1).all()
    assert (sweep_dir / "sweep_summary.csv").exists()
