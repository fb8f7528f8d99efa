"""The analysis and calibration commands and ``python -m sim.explain`` refuse a bad input file
or value in one line: exit code 2, one stderr line naming the file or field and what was
expected, no traceback (docs/validation.md, "The commands that read results").

Each case spoils one file of a small hand-made sweep (two schedulers × two seeds, written as
files: no simulation), or passes one bad value, and runs the command through its main
function in this process.
"""

from __future__ import annotations

import errno
import json
import os
import runpy
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from hydra.core.global_hydra import GlobalHydra

from analysis.collect import main as collect_main
from analysis.compare import main as compare_main
from analysis.report_md import main as report_main
from calibration.__main__ import main as calibration_main
from cli.explain import main as explain_main
from sim.errors import OUTPUT_ERROR_EXIT_CODE

SILICON_HEADER = "id,backend,model_path,mode,isl,osl,silicon_ttft_ms,silicon_tpot_ms\n"
# a row no conf model matches: planned with a reason, never simulated
SILICON_ROW = "r1,vllm,nobody/no-such-model,agg,128,16,20.0,5.0\n"
CAPACITY_SMALL = ["workload.num_requests=50", "capacity.search.max_simulations=2",
                  "capacity.verify.enabled=false", "plots=false"]


def _requests(seed: int, n: int = 20) -> pd.DataFrame:
    """A finished run's request table: every request completed, 50 ms TTFT, 1 s E2E."""
    arrival = np.sort(np.random.default_rng(seed).uniform(0.0, 10.0, n))
    return pd.DataFrame({"request_id": np.arange(n), "arrival_s": arrival,
                         "first_scheduled_s": arrival + 0.01, "first_token_s": arrival + 0.05,
                         "completion_s": arrival + 1.0, "input_tokens": 100,
                         "generated_tokens": 50, "status": "completed"})


CONFIG = {"workload": {"rate": 2.0, "arrival": "poisson"},
          "cluster": {"replicas": 1, "tensor_parallel_size": 1, "pipeline_parallel_size": 1},
          "slo": {"name": "none", "ttft_ms": None, "tpot_ms": None, "e2el_ms": None}}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """A finished sweep as ``python -m sim -m scheduler=vllm,sarathi seed=0,1`` leaves it."""
    root = tmp_path_factory.mktemp("inputs") / "sweep"
    for job, (scheduler, seed) in enumerate((s, k) for s in ("vllm", "sarathi") for k in (0, 1)):
        d = root / str(job)
        (d / ".hydra").mkdir(parents=True)
        (d / ".hydra" / "overrides.yaml").write_text(
            yaml.safe_dump([f"scheduler={scheduler}", f"seed={seed}"]))
        (d / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"job": {"num": job}}}))
        (d / ".hydra" / "config.yaml").write_text(yaml.safe_dump(CONFIG))
        _requests(seed).to_parquet(d / "requests.parquet", index=False)
        (d / "summary.json").write_text(json.dumps({"completed": 20, "partial": False,
                                                    "scheduler": scheduler, "seed": seed}))
    return root


@pytest.fixture(autouse=True)
def _fresh_hydra():
    """Each command initializes Hydra itself, as a fresh process would find it."""
    GlobalHydra.instance().clear()
    yield
    GlobalHydra.instance().clear()


@pytest.fixture
def sweep(pristine, tmp_path) -> Path:
    """A copy of the pristine sweep that a case may spoil."""
    return Path(shutil.copytree(pristine, tmp_path / "sweep"))


def _capacity(argv: list[str]) -> int:
    """``python -m analysis.capacity ARGV`` in this process: its exit code."""
    saved = sys.argv
    sys.argv = ["analysis.capacity", *argv]
    try:
        runpy.run_module("analysis.capacity", run_name="__main__", alter_sys=False)
    except SystemExit as e:
        return int(e.code or 0)
    finally:
        sys.argv = saved
    return 0


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "compare": compare_main, "collect": collect_main, "report": report_main,
    "capacity": _capacity, "calibration": calibration_main, "explain": explain_main}


@dataclass(frozen=True)
class Case:
    """One bad input: ``make(sweep, tmp)`` spoils what it needs and returns the command's
    name and arguments; the error line contains every one of ``needles``."""

    id: str
    make: Callable[[Path, Path], tuple[str, list[str]]]
    needles: tuple[str, ...]


def _write(path: Path, data: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data)
    return path


def _spoil(rel: str, data: str | bytes | None, command: str, *extra: str):
    """A case maker that writes ``data`` over ``rel`` in the sweep (None: leaves it whole),
    then runs ``command`` on the sweep with ``extra`` arguments."""
    def make(sweep: Path, tmp: Path) -> tuple[str, list[str]]:
        if data is not None:
            _write(sweep / rel, data)
        return command, [str(sweep), *extra]
    return make


def _run_dir(rel: str, data: str | bytes):
    """Report on job 0 alone (a run's folder), with ``rel`` of it spoiled."""
    def make(sweep: Path, tmp: Path) -> tuple[str, list[str]]:
        _write(sweep / "0" / rel, data)
        return "report", [str(sweep / "0")]
    return make


def _args(command: str, *args: str, files: dict[str, str | bytes] | None = None):
    """A case maker that writes ``files`` (relative to the test's folder) and runs
    ``command`` with ``args``; ``{tmp}`` in an argument is that folder."""
    def make(sweep: Path, tmp: Path) -> tuple[str, list[str]]:
        for rel, data in (files or {}).items():
            _write(tmp / rel, data)
        return command, [a.format(tmp=tmp) for a in args]
    return make


def _parquet_bytes(columns: dict) -> bytes:
    import io
    buf = io.BytesIO()
    pd.DataFrame(columns).to_parquet(buf, index=False)
    return buf.getvalue()


DEEP_LIST = "[" * 100_000 + "]" * 100_000
HUGE_INT = '{"completed": ' + "9" * 5000 + "}"
TRUNCATED = '{"completed": 20, "partial": fa'
REQUESTS = _parquet_bytes({"a": [1]})
_M = 2 ** np.arange(13)
# a small GEMM table in aiconfigurator's layout (latency in ms), enough for fit and check
GEMM = _parquet_bytes({"gemm_dtype": "bfloat16", "m": _M, "n": 4096, "k": 4096,
                       "latency": 0.01 + 2 * _M * 4096 * 4096 / 700e12 * 1e3})
CORRUPT_PARQUET = _parquet_bytes({"arrival_s": [0.0, 1.0]})[:40]
ON_FILE = "{tmp}/a_file/out"  # a folder under a regular file (the case writes a_file)
A_FILE = {"a_file": "not a folder\n"}

CASES = [
    # ---- python -m analysis.compare DIR
    Case("compare_summary_truncated", _spoil("0/summary.json", TRUNCATED, "compare"),
         ("summary.json=", "a run's summary", "not valid JSON")),
    Case("compare_requests_empty", _spoil("1/requests.parquet", b"", "compare"),
         ("requests.parquet=", "the file is empty (0 bytes)")),
    Case("compare_requests_corrupt", _spoil("1/requests.parquet", CORRUPT_PARQUET, "compare"),
         ("requests.parquet=", "not a readable parquet file")),
    Case("compare_requests_columns", _spoil("1/requests.parquet", REQUESTS, "compare"),
         ("requests.parquet=", "lacks the columns ['request_id', 'arrival_s'")),
    Case("compare_config_corrupt", _spoil("2/.hydra/config.yaml", "workload: [rate: 2\n",
                                          "compare"),
         ("config.yaml=", "resolved config", "not valid YAML")),
    Case("compare_config_shape", _spoil("2/.hydra/config.yaml", "workload: {rate: 2}\n",
                                        "compare"),
         ("config.yaml=", "a field is missing or of the wrong type")),
    Case("compare_burst", _spoil("2/.hydra/config.yaml", yaml.safe_dump(
        {**CONFIG, "workload": {"rate": float("inf"), "arrival": "poisson"}}), "compare"),
         ("config.yaml=", "a finite workload.rate", "no steady state to compare")),
    Case("compare_overrides_corrupt", _spoil("3/.hydra/overrides.yaml", ": : [\n", "compare"),
         ("overrides.yaml=", "a Hydra job's overrides", "not valid YAML")),
    Case("compare_warmup_longer_than_runs", _spoil("", None, "compare", "plots=false",
                                                   "warmup=1e9"),
         ("warmup=1000000000.0", "a warm-up shorter than the runs")),
    # ---- python -m analysis.collect DIR
    Case("collect_summary_truncated", _spoil("0/summary.json", TRUNCATED, "collect"),
         ("summary.json=", "not valid JSON")),
    Case("collect_summary_list", _spoil("0/summary.json", "[1, 2]", "collect"),
         ("summary.json=", "it holds a list, not an object")),
    Case("collect_failed_list", _spoil("0/failed.json", "[1, 2]", "collect"),
         ("failed.json=", "it holds a list, not an object")),
    Case("collect_summary_deep", _spoil("0/summary.json", DEEP_LIST, "collect"),
         ("summary.json=", "nested too deeply")),
    Case("collect_summary_5000_digits", _spoil("0/summary.json", HUGE_INT, "collect"),
         ("summary.json=", "not valid JSON", "4300 digits")),
    Case("collect_overrides_corrupt", _spoil("0/.hydra/overrides.yaml", ": : [\n", "collect"),
         ("overrides.yaml=", "not valid YAML")),
    Case("collect_overrides_mapping", _spoil("0/.hydra/overrides.yaml", "seed: 1\n",
                                             "collect"),
         ("overrides.yaml=", "it holds an object, not a list")),
    # ---- python -m analysis.report DIR
    Case("report_compare_truncated", _spoil("compare.json", '{"factor": "sch', "report"),
         ("compare.json=", "a comparison", "not valid JSON")),
    Case("report_compare_shape", _spoil("compare.json", "{}", "report"),
         ("compare.json=", "it lacks 'settings'")),
    Case("report_compare_deep", _spoil("compare.json", DEEP_LIST, "report"),
         ("compare.json=", "nested too deeply")),
    Case("report_compare_5000_digits", _spoil("compare.json", HUGE_INT, "report"),
         ("compare.json=", "4300 digits")),
    Case("report_capacity_truncated", _spoil("capacity.json", "[", "report"),
         ("capacity.json=", "a capacity plan", "not valid JSON")),
    Case("report_summary_not_object", _run_dir("summary.json", '"done"'),
         ("summary.json=", "it holds a string, not an object")),
    # ---- python -m analysis.capacity
    Case("capacity_growth_overflow",
         _args("capacity", *CAPACITY_SMALL, "capacity.forecast.growth_per_month=1e308",
               "hydra.run.dir={tmp}/run"),
         ("capacity.forecast.growth_per_month=", "at most 1e+09 req/s")),
    Case("capacity_compounding_overflow",
         _args("capacity", *CAPACITY_SMALL, "capacity.forecast.growth_per_month=10",
               "capacity.forecast.horizon_months=400", "hydra.run.dir={tmp}/run"),
         ("capacity.forecast.growth_per_month=10.0", "by month 399", "at most 1e+09")),
    Case("capacity_peak_rate_huge",
         _args("capacity", *CAPACITY_SMALL, "capacity.forecast.peak_rate=1e300",
               "hydra.run.dir={tmp}/run"),
         ("capacity.forecast.peak_rate=", "must be at most 1e+09 req/s")),
    Case("capacity_horizon_huge",
         _args("capacity", *CAPACITY_SMALL, "capacity.forecast.horizon_months=1000000000000",
               "hydra.run.dir={tmp}/run"),
         ("capacity.forecast.horizon_months=", "must be in [1, 1200]")),
    Case("capacity_rate_inf",
         _args("capacity", *CAPACITY_SMALL, "workload.rate=inf", "hydra.run.dir={tmp}/run"),
         ("workload.rate=inf", "a finite first rate")),
    Case("capacity_seeds_negative",
         _args("capacity", *CAPACITY_SMALL, "capacity.search.seeds=[0,-1]",
               "hydra.run.dir={tmp}/run"),
         ("capacity.search.seeds=[0, -1]", "each an integer >= 0")),
    Case("capacity_warmup_infinite",
         _args("capacity", *CAPACITY_SMALL, "capacity.search.warmup=1e400",
               "hydra.run.dir={tmp}/run"),
         ("capacity.search.warmup=", "a finite number of seconds >= 0")),
    Case("capacity_warmup_longer_than_runs",
         _args("capacity", *CAPACITY_SMALL, "capacity.search.warmup=1e6",
               "hydra.run.dir={tmp}/run"),
         ("capacity.search.warmup=", "a warm-up shorter than the runs")),
    Case("capacity_more_replicas_than_planned",
         _args("capacity", *CAPACITY_SMALL, "capacity.forecast.peak_rate=1e8",
               "hydra.run.dir={tmp}/run"),
         ("capacity.forecast.peak_rate=", "at most 10,000 replicas")),
    Case("capacity_run_dir_under_file",
         _args("capacity", *CAPACITY_SMALL, f"hydra.run.dir={ON_FILE}", files=A_FILE),
         ("hydra.run.dir=", "a_file is a file")),
    # ---- python -m sim.explain
    Case("explain_sequences_1e20",
         _args("explain", "batch=decode:100000000000000000000x2000", "chart=none"),
         ("batch=", "at most 1,000,000 sequences in one step")),
    Case("explain_context_1e20",
         _args("explain", "context=100000000000000000000", "chart=none"),
         ("context=", "a whole number of tokens in [1, 131072]")),
    Case("explain_chart_under_file",
         _args("explain", "batch=decode:1x100", "chart={tmp}/a_file/roofline.png",
               files=A_FILE),
         ("chart=", "a_file is a file")),
    Case("explain_chart_is_folder",
         _args("explain", "batch=decode:1x100", "chart={tmp}"),
         ("chart=", "it is a folder")),
    Case("explain_diffusion_chart_under_file",
         _args("explain", "model=flux1_dev", "chart={tmp}/a_file/roofline.png", files=A_FILE),
         ("chart=", "a_file is a file")),
    # ---- python -m calibration validate | validate-diffusion | fit-execution | fit-attention-*
    Case("validate_silicon_empty",
         _args("calibration", "validate", "silicon_csv={tmp}/s.csv", "hydra.run.dir={tmp}/run",
               files={"s.csv": ""}),
         ("silicon_csv=", "the file is empty (0 bytes)")),
    Case("validate_silicon_no_rows",
         _args("calibration", "validate", "silicon_csv={tmp}/s.csv", "hydra.run.dir={tmp}/run",
               files={"s.csv": SILICON_HEADER}),
         ("silicon_csv=", "it has a header and no rows")),
    Case("validate_silicon_seed_negative",
         _args("calibration", "validate", "silicon_csv={tmp}/s.csv", "seed=-1",
               "hydra.run.dir={tmp}/run", files={"s.csv": SILICON_HEADER + SILICON_ROW}),
         ("seed=-1", "an integer >= 0")),
    Case("validate_run_dir_under_file",
         _args("calibration", "validate", "silicon_csv={tmp}/s.csv", f"hydra.run.dir={ON_FILE}",
               files={"s.csv": SILICON_HEADER + SILICON_ROW, **A_FILE}),
         ("hydra.run.dir=", "a_file is a file")),
    Case("validate_diffusion_empty",
         _args("calibration", "validate-diffusion", "csv={tmp}/d.csv",
               "hydra.run.dir={tmp}/run", files={"d.csv": ""}),
         ("csv=", "a diffusion benchmark CSV", "the file is empty (0 bytes)")),
    Case("fit_execution_empty",
         _args("calibration", "fit-execution", "csv={tmp}/d.csv", "hydra.run.dir={tmp}/run",
               files={"d.csv": ""}),
         ("csv=", "the file is empty (0 bytes)")),
    Case("fit_attention_split_empty",
         _args("calibration", "fit-attention-split", "csv={tmp}/d.csv",
               "hydra.run.dir={tmp}/run", files={"d.csv": ""}),
         ("csv=", "the file is empty (0 bytes)")),
    Case("fit_vae_conv3d_empty",
         _args("calibration", "fit-vae-conv3d", "csv={tmp}/d.csv",
               "hydra.run.dir={tmp}/run", files={"d.csv": ""}),
         ("csv=", "the file is empty (0 bytes)")),
    # ---- python -m calibration fit | check
    Case("check_table_empty",
         _args("calibration", "check", "data_dir={tmp}/aic", "hydra.run.dir={tmp}/run",
               files={"aic/gemm/vllm/0.1/gemm_perf.parquet": b""}),
         ("data_dir=", "gemm_perf.parquet", "the file is empty (0 bytes)")),
    Case("check_table_columns",
         _args("calibration", "check", "data_dir={tmp}/aic", "hydra.run.dir={tmp}/run",
               files={"aic/gemm/vllm/0.1/gemm_perf.parquet": REQUESTS}),
         ("data_dir=", "gemm_perf.parquet", "it has no column 'latency'")),
    Case("check_vidur_columns",
         _args("calibration", "check", "data_dir={tmp}/vid", "hydra.run.dir={tmp}/run",
               files={"vid/data/profiling/compute/h100/meta/m/mlp.csv": "a,b\n1,2\n"}),
         ("data_dir=", "mlp.csv", "it lacks 'num_tokens'")),
    Case("check_calibration_file_corrupt",
         _args("calibration", "check", "data_dir={tmp}/aic", "calibration={tmp}/c.yaml",
               "hydra.run.dir={tmp}/run",
               files={"aic/gemm/vllm/0.1/gemm_perf.parquet": GEMM, "c.yaml": "a: [1\n"}),
         ("calibration=", "not valid YAML")),
    Case("check_run_dir_under_file",
         _args("calibration", "check", "data_dir={tmp}/aic", f"hydra.run.dir={ON_FILE}",
               files={"aic/gemm/vllm/0.1/gemm_perf.parquet": GEMM, **A_FILE}),
         ("hydra.run.dir=", "a_file is a file")),
    Case("fit_out_under_file",
         _args("calibration", "fit", "data_dir={tmp}/aic", "out={tmp}/a_file/fit.yaml",
               "hydra.run.dir={tmp}/run",
               files={"aic/gemm/vllm/0.1/gemm_perf.parquet": GEMM, **A_FILE}),
         ("out=", "a_file is a file")),
    Case("fit_seed_negative",
         _args("calibration", "fit", "data_dir={tmp}/aic", "seed=-1", "out={tmp}/fit.yaml",
               "hydra.run.dir={tmp}/run",
               files={"aic/gemm/vllm/0.1/gemm_perf.parquet": GEMM}),
         ("seed=-1", "an integer >= 0")),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_and_exit_2(case: Case, sweep: Path, tmp_path: Path, capsys):
    command, argv = case.make(sweep, tmp_path)
    code = COMMANDS[command](argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for needle in case.needles:
        assert needle in lines[0], (needle, lines[0])


def test_the_pristine_sweep_is_compared_and_reported(sweep: Path, capsys):
    """The fixture is a valid sweep: the cases fail for the file they spoil."""
    assert collect_main([str(sweep)]) == 0
    assert compare_main([str(sweep), "plots=false"]) == 0
    assert report_main([str(sweep)]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
@pytest.mark.parametrize("command", ["compare", "collect", "report"])
def test_read_only_sweep_is_one_line(command: str, sweep: Path, capsys):
    sweep.chmod(0o555)
    try:
        code = COMMANDS[command]([str(sweep)])
    finally:
        sweep.chmod(0o755)
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "is not writable" in lines[0], lines


@pytest.mark.parametrize("command, extra", [
    ("compare", ["plots=false"]), ("collect", []), ("report", []),
    ("explain", ["batch=decode:1x100"])])
def test_a_full_disk_is_one_line_and_exit_1(command: str, extra: list[str], sweep: Path,
                                            tmp_path: Path, monkeypatch, capsys):
    """A write that fails after the inputs were checked (the disk fills) is the command's
    one line naming the file, and the exit code of an output error, not a traceback."""
    def no_space(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", no_space)  # every atomic write ends in os.replace
    argv = ([f"chart={tmp_path / 'roofline.png'}"] if command == "explain"
            else [str(sweep)]) + extra
    code = COMMANDS[command](argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == OUTPUT_ERROR_EXIT_CODE, err
    assert len(lines) == 1 and lines[0].startswith("error: cannot write "), err
    assert "No space left on device" in lines[0] and "Traceback" not in err
