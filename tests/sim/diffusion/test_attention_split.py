"""An attention kernel class carried to another GPU (sim.cost.attention_kernels: its SM part at
that GPU's FP32 rate, its tensor part at its tensor peak) and the fit of the SM share
(calibration/fit_attention_split): the carry-over by hand, the shipped share read, a DiT
attention priced by hand on an H20, the fit recovering a known share from simulated jobs,
bad settings refused in one line."""

from __future__ import annotations

import dataclasses
import types

import pandas as pd
import pytest
from omegaconf import OmegaConf

import calibration.fit_attention_split as fs
from calibration.__main__ import main as calibration_main
from calibration.validate_diffusion import plan_rows, simulate_rows
from sim.config.diffusion_model import DiffusionPipelineConfig, check_diffusion_pipeline
from sim.config.hardware import HardwareConfig, check_hardware
from sim.config.model import ModelConfig
from sim.cost.attention_kernels import KernelClass, KernelCurve, load_kernel_classes
from sim.cost.calibration_file import load_calibration
from sim.cost.operators import encoder_attention_work
from sim.cost.pricing import ACT_BYTES, Pricer
from sim.errors import ConfigError
from tests.sim.diffusion.test_dit_cost import ROOT

H100 = (989.4e12, 67e12)
H20 = (148e12, 44e12)
FLAT = KernelClass("fa2", {128: KernelCurve(0.4, 1.0, 1.0)}, *H100, sm_share=0.5)


def test_the_measured_gpu_is_not_moved():
    assert FLAT.slowdown(*H100) == 1.0


def test_a_gpu_of_another_tensor_to_fp32_ratio_by_hand():
    # the SM part runs (67/44) slower, the tensor part 989.4/148 slower: relative to the
    # tensor-peak carry-over the SM half takes (67/44) / (989.4/148) of its time
    sm_ratio = (67 / 44) / (989.4 / 148)
    assert FLAT.slowdown(*H20) == pytest.approx(0.5 + 0.5 * sm_ratio)
    assert float(FLAT.eta_on(1e6, 128, *H20)) == pytest.approx(
        float(FLAT.eta(1e6, 128)) / (0.5 + 0.5 * sm_ratio))
    assert FLAT.slowdown(*H20, sm_share=0.0) == 1.0  # an override
    assert FLAT.slowdown(*H20, sm_share=1.0) == pytest.approx(sm_ratio)


def test_an_unknown_fp32_rate_carries_by_the_tensor_peak():
    assert FLAT.slowdown(148e12, 0.0) == 1.0
    assert dataclasses.replace(FLAT, measured_fp32_flops=0.0).slowdown(*H20) == 1.0


def test_the_shipped_classes_have_their_gpu_and_the_fitted_share():
    classes = load_kernel_classes("h100_sxm")
    fa2 = classes["fa2"]
    assert (fa2.measured_bf16_flops, fa2.measured_fp32_flops) == H100
    assert 0.0 < fa2.sm_share < 1.0  # fitted on the H20 jobs of xdit_dev.csv
    assert classes["fa3"].sm_share == 0.0  # no second GPU measured it


def _hardware(name: str) -> HardwareConfig:
    raw = OmegaConf.load(ROOT / "conf" / "hardware" / f"{name}.yaml")
    raw.pop("defaults")
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(HardwareConfig), raw))


def test_a_dit_attention_on_an_h20_by_hand():
    hw = _hardware("h20")
    eff, _ = load_calibration("h100_sxm", "vllm")
    op = Pricer(hw, eff).encoder_attention("a", 1, 16384, 16384, 24, 128, "fa2")
    k = load_kernel_classes("h100_sxm")["fa2"]
    f, _ = encoder_attention_work(1.0, 16384.0, 16384.0, 24.0, 128.0, ACT_BYTES)
    slow = (1 - k.sm_share) + k.sm_share * (67 / 44) / (989.4 / 148)
    assert op.time_s == pytest.approx(f / (148e12 * float(k.eta(16384, 128)) / slow))
    again = Pricer(hw, eff).encoder_attention("a", 1, 16384, 16384, 24, 128, "fa2", 0.0)
    assert again.time_s == pytest.approx(f / (148e12 * float(k.eta(16384, 128))))


def _raw_rows() -> pd.DataFrame:
    return pd.DataFrame([
        {"model": "HunyuanVideo (13B)", "gpu": gpu, "num_gpus": g,
         "parallel_config": f"Ulysses SP={g}", "resolution": "960x960", "frames": 129,
         "steps": 50, "metric": "end_to_end_latency", "value": 1.0}
        for gpu in ("H20", "L20") for g in (2, 3)])


def _h20_rows():
    return plan_rows(_raw_rows())


def test_the_fit_recovers_a_known_share_from_simulated_jobs():
    table = _h20_rows()
    truth = simulate_rows(table, types.SimpleNamespace(
        backend="vllm", overrides=["model.diffusion.attention_sm_share=0.3"]))
    table["meas_s"] = truth["pred_s"]  # "measured" = simulated with the known share
    rows = fs.kernel_rows(table, "fa2", ["h20"])
    assert set(rows["hardware"]) == {"h20"} and len(rows) == 2
    assert fs.fit_share(rows, "vllm") == pytest.approx(0.3, abs=0.01)


def test_only_rows_of_the_kernel_are_fitted():
    assert fs.pipeline_kernel("hunyuan_video") == "fa2"
    assert fs.pipeline_kernel("flux1_dev") == "fa2"  # sdpa_flash is FlashAttention-2
    assert fs.kernel_rows(_h20_rows(), "fa3", ["h20"]).empty


@pytest.mark.parametrize("args, words", [
    (["gpus=[h20]", "held_out_gpus=[h20]"], ("held_out_gpus=", "must not hold out")),
    (["kernel=flash9"], ("kernel='flash9'", "one of")),
    (["gpus=[]"], ("gpus=", "at least one")),
])
def test_the_fit_refuses_bad_settings_in_one_line(tmp_path, capsys, args, words):
    csv = tmp_path / "d.csv"
    _raw_rows().to_csv(csv, index=False)
    rc = calibration_main(["fit-attention-split", f"csv={csv}", "write=false",
                           f"hydra.run.dir={tmp_path}/run", *args])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err
    assert all(w in err for w in words), err


def test_a_share_outside_zero_one_is_refused():
    with pytest.raises(ConfigError, match="attention_sm_share"):
        check_diffusion_pipeline(DiffusionPipelineConfig(attention_sm_share=1.5))


def test_a_negative_fp32_rate_is_refused():
    with pytest.raises(ConfigError, match="hardware.fp32_flops"):
        check_hardware(dataclasses.replace(_hardware("h20"), fp32_flops=-1.0), ModelConfig())
