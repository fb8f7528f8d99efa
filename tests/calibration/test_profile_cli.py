"""The GPU profiler's command line: arguments, their errors, and the real kernels on the CPU
(when torch is importable), or the one line that says how to get torch."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from calibration.aiconfigurator import load_table
from calibration.profile import main
from calibration.profile.args import DEFAULT_FULL_BUDGET_S, parse_overrides
from calibration.profile.shapes import TABLES, tiny_plan
from sim.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
HAS_TORCH = importlib.util.find_spec("torch") is not None


# --- arguments -----------------------------------------------------------------------------

def test_arguments_parse_with_defaults(tmp_path):
    a = parse_overrides([f"out_dir={tmp_path}", "device=cpu", "plan=tiny", "ops=gemm,attention"])
    assert (a.out_dir, a.device, a.plan) == (tmp_path, "cpu", "tiny")
    assert a.ops == ("gemm", "attention_prefill", "attention_decode")
    assert a.budget_s is None and a.gpus is None and a.graph
    full = parse_overrides([f"out_dir={tmp_path}", "gpus=8,2", "repeats=5"])
    assert full.budget_s == DEFAULT_FULL_BUDGET_S and full.gpus == (2, 8) and full.repeats == 5
    assert parse_overrides([f"out_dir={tmp_path}", "budget_s=none"]).budget_s is None


@pytest.mark.parametrize("bad, field", [
    (["device=tpu"], "device"), (["plan=huge"], "plan"), (["ops=gemm,conv"], "ops"),
    (["gpus=1"], "gpus"), (["budget_s=-3"], "budget_s"), (["repeats=1"], "repeats"),
    (["colour=red"], "colour"), (["plan"], "argument"), (["seed=1", "seed=2"], "seed"),
    (["graph=maybe"], "graph"),
])
def test_bad_argument_names_the_field(tmp_path, bad, field):
    with pytest.raises(ConfigError) as e:
        parse_overrides([f"out_dir={tmp_path}", *bad])
    assert e.value.field == field


def test_missing_out_dir_is_one_line_exit_2(capsys):
    assert main(["device=cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: out_dir=None") and "\n" not in err


def test_out_dir_must_be_new_or_empty(tmp_path, capsys):
    (tmp_path / "old.parquet").write_text("x")
    assert main([f"out_dir={tmp_path}", "device=cpu", "plan=tiny"]) == 2
    assert capsys.readouterr().err.startswith("error: out_dir=")


def test_module_entry_point_bad_key_no_traceback():
    proc = subprocess.run([sys.executable, "-m", "calibration.profile", "out_dir=x", "dev=cpu"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: dev='cpu'") and "Traceback" not in proc.stderr


# --- the real kernels on the CPU ------------------------------------------------------------

@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed (optional extra 'profile')")
def test_torch_cpu_smoke(tmp_path):
    import torch

    out = tmp_path / "prof"
    assert main([f"out_dir={out}", "device=cpu", "plan=tiny", "gpus=2"]) == 0
    version = str(torch.__version__)
    for op, (fam, table, _) in TABLES.items():
        df, _ = load_table(out, fam, "torch", table, version)
        assert len(df) == len(tiny_plan().shapes[op]), table
        assert (df["latency"] > 0).all() and (df["timing"] == "perf_counter").all()
        meta = yaml.safe_load((out / fam / "torch" / version / "collection_meta.yaml")
                              .read_text())
        assert meta["tables"][table]["status"] == "complete"
        assert meta["environment"]["torch"] == version
    nccl, _ = load_table(out, "comm", "gloo", "nccl_perf")
    assert set(nccl["num_gpus"]) == {2} and "all_reduce" in set(nccl["op_name"])
    entry = yaml.safe_load((out / "comm" / "gloo" / version / "collection_meta.yaml")
                           .read_text())["tables"]["nccl_perf"]
    assert entry["rows"] == len(nccl)
    assert entry["rows"] + entry["failed_shapes"] == len(tiny_plan().comm_sizes) * 4


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed (optional extra 'profile')")
def test_cuda_without_a_gpu_is_one_line(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: device=cuda would run the full profile")
    assert main([f"out_dir={tmp_path}", "device=cuda"]) == 2
    assert capsys.readouterr().err.startswith("error: device='cuda'")


@pytest.mark.skipif(HAS_TORCH, reason="torch is installed: the profiler would run")
def test_without_torch_says_how_to_install(tmp_path, capsys):
    assert main([f"out_dir={tmp_path}", "device=cpu", "plan=tiny"]) == 2
    err = capsys.readouterr().err
    assert "needs PyTorch" in err and "[profile]" in err and "\n" not in err.strip()
    assert not any(tmp_path.iterdir())
