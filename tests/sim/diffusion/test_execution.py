"""Eager vs compiled DiT steps (sim.diffusion.execution) by hand, the eager-cost fit recovering
known costs from simulated pairs, and ``python -m calibration validate-diffusion`` on a small
CSV and on the development set."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

import calibration.fit_execution as fe
from calibration.__main__ import main as calibration_main
from calibration.validate_diffusion import parse_parallel, plan_rows, simulate_rows
from sim.config.diffusion_model import check_diffusion_pipeline
from sim.diffusion.dit import DitSplit, dit_step_ops
from sim.diffusion.execution import Execution, execution_of
from sim.diffusion.pipeline import load_pipeline
from sim.errors import ConfigError
from tests.sim.diffusion.test_dit_cost import h100_pricer

SHARED_CSV = Path(__file__).resolve().parents[4] / "shared" / "data" / "diffusion" / \
    "xdit_dev.csv"
FLUX_TOKENS = 4096  # 1024x1024: a 128x128 latent in 2x2 patches


def _step(execution: Execution, ulysses: int = 1):
    p, pipe = h100_pricer(), load_pipeline("flux1_dev")
    ops = dit_step_ops(p, pipe.dit, FLUX_TOKENS, DitSplit(batch=1, ulysses=ulysses),
                       pipe.attention_impl, execution)
    return ops, sum(o.time_s for o in ops)


def test_compiled_step_has_no_host_time_and_fused_elementwise():
    ops, _ = _step(Execution("compiled"))
    assert not [o for o in ops if o.bound == "host"]
    eager_same, _ = _step(Execution("eager", 0.0, 1.0))  # eager without costs: the same step
    assert [o.time_s for o in eager_same] == [o.time_s for o in ops]


def test_eager_step_is_the_longer_of_gpu_and_host_by_hand():
    gpu_ops, gpu = _step(Execution("eager", 0.0, 3.0))  # unfused elementwise, no host cost
    fused_ops, fused = _step(Execution("compiled"))
    assert gpu > fused  # three times the elementwise passes and kernels
    ew = [o for o in gpu_ops if "norms_residuals" in o.name]
    ew_fused = [o for o in fused_ops if "norms_residuals" in o.name]
    assert sum(o.bytes for o in ew) > 1.5 * sum(o.bytes for o in ew_fused)  # 3x the passes
    # host-bound: 1 ms per launch is far beyond the GPU's step
    ops, total = _step(Execution("eager", 1e-3, 3.0))
    host = [o for o in ops if o.name == "eager.host_dispatch"]
    assert len(host) == 1
    launches = host[0].count
    assert total == pytest.approx(launches * 1e-3, rel=1e-3)
    assert host[0].time_s == pytest.approx(launches * 1e-3 - gpu, rel=1e-3)
    # GPU-bound: 1 ns per launch never outlasts the GPU
    ops, total = _step(Execution("eager", 1e-9, 3.0))
    assert total == pytest.approx(gpu) and not [o for o in ops if o.bound == "host"]


def test_splitting_the_sequence_divides_gpu_time_not_launches():
    _, one = _step(Execution("eager", 1e-4, 2.0), ulysses=1)
    _, four = _step(Execution("eager", 1e-4, 2.0), ulysses=4)
    _, four_c = _step(Execution("compiled"), ulysses=4)
    _, one_c = _step(Execution("compiled"), ulysses=1)
    assert one_c / four_c > 2.5  # compiled keeps scaling
    assert one / four < one_c / four_c  # eager scales less (the host is not split)


def test_execution_of_reads_the_pipeline_then_the_calibration():
    pipe = load_pipeline("flux1_dev")
    assert pipe.execution == "eager"
    cal = execution_of(pipe, "h100_sxm")
    assert cal.eager and cal.launch_s > 0 and cal.unfused >= 1
    pipe.eager_launch_us, pipe.eager_unfused = 7.0, 2.5
    assert execution_of(pipe, "h100_sxm") == Execution("eager", 7e-6, 2.5)
    assert execution_of(pipe, "no_such_calibration") == Execution("eager", 7e-6, 2.5)
    pipe.execution = "compiled"
    assert not execution_of(pipe, "h100_sxm").eager


@pytest.mark.parametrize("field,value", [("execution", "jit"), ("eager_unfused", 0.5),
                                         ("eager_launch_us", -1.0)])
def test_bad_execution_settings_name_their_field(field, value):
    pipe = load_pipeline("flux1_dev")
    setattr(pipe, field, value)
    with pytest.raises(ConfigError, match=f"model.diffusion.{field}"):
        check_diffusion_pipeline(pipe)


def _rows(*plans):
    return pd.DataFrame([{"model": "FLUX.1-dev (12B)", "gpu": "H100", "num_gpus": g,
                          "parallel_config": f"{text} ({mode})", "resolution": "1024x1024",
                          "frames": float("nan"), "steps": 28, "metric": "end_to_end_latency",
                          "value": 1.0} for g, text in plans
                         for mode in ("PyTorch eager", "torch.compile")])


def test_fit_execution_recovers_known_costs_from_simulated_pairs(monkeypatch):
    table = plan_rows(_rows((1, "1 GPU"), (4, "Ulysses-4")))
    truth = simulate_rows(table, type("C", (), {"backend": "vllm", "overrides": [
        "model.diffusion.eager_launch_us=40", "model.diffusion.eager_unfused=3"]})())
    table["meas_s"] = truth["pred_s"]  # "measured" = simulated with the known costs
    monkeypatch.setattr(fe, "LAUNCH_GRID_US", (10.0, 40.0, 100.0))
    monkeypatch.setattr(fe, "UNFUSED_GRID", (1.0, 3.0, 6.0))
    x = fe.fit(fe.pairs_of(table), table, "vllm")
    assert x == pytest.approx([40.0, 3.0], rel=0.05)


def test_parallel_configs_of_the_development_set_parse():
    assert parse_parallel("Ulysses-2 x Ring-2 (torch.compile)")[0].label() == "ulysses2xring2"
    assert parse_parallel("Ulysses SP=6")[0].label() == "ulysses6"
    assert parse_parallel("1 GPU (PyTorch eager)")[1] == "eager"
    assert parse_parallel("PipeFusion-4")[2].startswith("parallel_config")


def test_validate_diffusion_on_a_small_csv(tmp_path, capsys):
    rows = _rows((1, "1 GPU"), (2, "Ulysses-2"))
    rows.loc[len(rows)] = {**rows.iloc[0].to_dict(), "model": "NoSuchNet"}
    csv = tmp_path / "dev.csv"
    rows.to_csv(csv, index=False)
    rc = calibration_main(["validate-diffusion", f"csv={csv}", f"hydra.run.dir={tmp_path}"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "4 of 5 rows simulated" in out and "NoSuchNet" in out
    assert "| flux1_dev | h100_sxm | ulysses2 | compiled |" in out
    assert (tmp_path / "rows.parquet").is_file()


def test_xdit_flux_rows_run_their_scripts_256_text_tokens():
    """xDiT's FLUX.1 table was measured with flux_example.py's max_sequence_length=256: those
    rows price 256 T5 tokens (encoder and DiT); other sources keep the pipeline's 512."""
    rows = _rows((1, "1 GPU"))
    rows["source"] = ["github:xdit-project/xDiT@175e0bf docs/performance/flux.md (table)",
                      "a diffusers run"]
    table = plan_rows(rows)
    assert table.loc[0, "overrides"] == ("model.diffusion.dit.text_tokens=256",
                                         "model.diffusion.text_encoders.1.tokens=256")
    assert table.loc[1, "overrides"] == ()
    assert load_pipeline("flux1_dev").text_encoders[1].name == "t5_xxl"
    table["mode"] = "compiled"
    pred = simulate_rows(table, type("C", (), {"backend": "vllm", "overrides": []})())
    # fewer joint tokens: a shorter job, by about what 4,352 of 4,608 tokens take off
    ratio = pred.loc[0, "pred_s"] / pred.loc[1, "pred_s"]
    assert 0.90 < ratio < 0.97


def test_validate_diffusion_refuses_a_missing_csv_in_one_line(tmp_path, capsys):
    rc = calibration_main(["validate-diffusion", f"csv={tmp_path / 'x.csv'}",
                           f"hydra.run.dir={tmp_path}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "csv=" in err


@pytest.mark.skipif(not SHARED_CSV.is_file(), reason="../shared/data/diffusion not present")
def test_validate_diffusion_maps_every_development_row(tmp_path, capsys):
    rc = calibration_main(["validate-diffusion", f"csv={SHARED_CSV}",
                           f"hydra.run.dir={tmp_path}"])
    out = capsys.readouterr().out
    assert rc == 0 and " of 23 rows simulated" in out
    # every row maps; a row is left out only where its plan does not fit in memory
    refused = [x for x in out.split("\n") if x.startswith("- row ")]
    assert all("does not fit" in x for x in refused)
