"""Unusual but valid inputs that ``python -m sim`` reads as they are (docs/validation.md,
"Accepted on purpose"): a model folder whose path holds ``${`` (OmegaConf's interpolation
syntax), a sweep over two local ``config.json`` paths, a trace given as a pipe
(``workload.trace_path=<(...)``), which validation and the run both read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest
import yaml

LLAMA = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 256,
         "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 512,
         "vocab_size": 1000, "max_position_embeddings": 8192}
SMALL = ("workload.num_requests=5", "plots=false")
TRACE = "arrival_time_s,input_tokens,output_tokens\n0,100,10\n0.5,200,20\n1.0,300,30\n"


def _model(root: Path, folder: str, **changes) -> Path:
    path = root / folder / "config.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({**LLAMA, **changes}))
    return path


def _piped_trace_run(cwd: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, Path]:
    """``python -m sim workload.trace_path=/dev/fd/N`` with the trace in a pipe, as a shell's
    ``<(cat trace.csv)`` passes it; the run and its output folder."""
    read_fd, write_fd = os.pipe()
    os.write(write_fd, TRACE.encode())
    os.close(write_fd)
    out = cwd / "piped"
    try:
        args = ["workload=trace", f"workload.trace_path=/dev/fd/{read_fd}", "plots=false",
                f"hydra.run.dir={out}"]
        proc = subprocess.run([sys.executable, "-m", "sim", *args], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=180, pass_fds=(read_fd,))
    finally:
        os.close(read_fd)
    return proc, out


@pytest.fixture(scope="module")
def runs(tmp_path_factory, sim_cli):
    """Every run of this module, started at once."""
    cwd = tmp_path_factory.mktemp("accepted")
    odd = _model(cwd, "my${model}")
    a, b = _model(cwd, "a/Tiny"), _model(cwd, "b/Tiny", num_hidden_layers=4)
    jobs = {
        "interpolation": lambda: sim_cli.run([f"model={odd}", *SMALL], cwd, cwd / "interp"),
        "sweep": lambda: sim_cli.run(["-m", f"model={a},{b}", *SMALL,
                                      f"hydra.sweep.dir={cwd / 'sweep'}"], cwd),
        "piped": lambda: _piped_trace_run(cwd, sim_cli.env()),
    }
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = {name: pool.submit(job) for name, job in jobs.items()}
        return {name: f.result() for name, f in futures.items()}, cwd


def test_a_model_folder_named_with_interpolation_syntax_runs(runs):
    run = runs[0]["interpolation"]
    assert run.returncode == 0, run.describe()
    summary = json.loads((run.outdir / "summary.json").read_text())
    assert summary["model"] == "my${model}"


def test_a_sweep_over_two_config_json_paths_runs_one_job_per_path(runs):
    run, cwd = runs[0]["sweep"], runs[1]
    assert run.returncode == 0, run.describe()
    table = pd.read_csv(cwd / "sweep" / "sweep_summary.csv")
    assert table["status"].tolist() == ["ok", "ok"], table
    assert table["model"].str.startswith("Tiny@").all() and table["model"].nunique() == 2
    saved = [yaml.safe_load((cwd / "sweep" / str(j) / ".hydra" / "config.yaml").read_text())
             for j in (0, 1)]
    assert [c["model"]["num_hidden_layers"] for c in saved] == [2, 4]  # a's, then b's
    assert all(c["model"]["name"] == "Tiny" for c in saved)


def test_a_piped_trace_is_read_once_for_validation_and_the_run(runs):
    proc, out = runs[0]["piped"]
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "summary.json").read_text())["completed"] == 3
