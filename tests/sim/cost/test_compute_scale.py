"""``cost_model.compute_scale``: every FLOP roof times the scale, bandwidths unchanged; read
from the calibrated file's ``compute:`` block unless the key sets it; the same in both
engines."""

from __future__ import annotations

import numpy as np
import pytest

from calibration.host_fit import write_block
from calibration.silicon_rows import calibration_file
from sim import simulate
from sim.builders import build_cost_model, plain
from sim.cost.calibration_file import load_calibration
from sim.cost.gemm import gemm_time
from sim.errors import ConfigError
from tests.sim.schedulers.test_compiled_core import assert_same_records


def ops(cfg, new_tokens, context):
    """The step's operators by name."""
    m = build_cost_model(plain(cfg))
    return {op.name: op for op in m.breakdown(np.array(new_tokens), np.array(context))}


def test_a_compute_bound_gemm_takes_twice_as_long_at_half_the_speed(compose_cfg):
    """A 8,192-token prefill's QKV GEMM (Llama-3.1-8B: 8192x4096 . 4096x6144, 32 layers) is
    compute bound: at scale 0.5 it is the roofline at half the BF16 peak, 2x but for the
    kernel launch; a one-token decode's QKV GEMM reads its weights, at the HBM's speed
    either way."""
    full, half = (ops(compose_cfg(f"cost_model.compute_scale={s}"), [8192], [0])
                  for s in (1.0, 0.5))
    eff = load_calibration("h100_sxm", "vllm")[0].gemm["bfloat16"]
    t, cb = gemm_time(eff, 8192, 6144, 4096, 0.5 * 989.4e12, 3.35e12, 2.0, num_sms=132)
    assert full["qkv_proj"].bound == "compute" and cb
    assert half["qkv_proj"].time_s == pytest.approx(32 * float(t), rel=1e-12)
    assert 1.99 < half["qkv_proj"].time_s / full["qkv_proj"].time_s <= 2.0
    assert half["attn_prefill"].time_s > 1.5 * full["attn_prefill"].time_s
    full, half = (ops(compose_cfg(f"cost_model.compute_scale={s}"), [1], [100])
                  for s in (1.0, 0.5))
    assert full["qkv_proj"].bound == "memory"
    assert half["qkv_proj"].time_s == pytest.approx(full["qkv_proj"].time_s, rel=1e-9)
    assert half["attn_decode"].time_s == pytest.approx(full["attn_decode"].time_s, rel=1e-9)


def test_the_calibrated_files_compute_block_sets_the_scale_unless_the_key_does(
        compose_cfg, tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(calibration_file("h100_sxm", "vllm").read_text())
    write_block(path, "compute", {"scale": 0.5, "fitted": True})
    base = ops(compose_cfg(), [8192], [0])["qkv_proj"].time_s
    from_file = ops(compose_cfg(f"cost_model.calibration={path}"), [8192], [0])
    assert 1.99 < from_file["qkv_proj"].time_s / base <= 2.0
    key = ops(compose_cfg(f"cost_model.calibration={path}", "cost_model.compute_scale=1"),
              [8192], [0])
    assert key["qkv_proj"].time_s == pytest.approx(base, rel=1e-9)


@pytest.mark.parametrize("value", ["0", "5"])
def test_a_scale_out_of_range_is_one_config_error(compose_cfg, requests_for, value):
    cfg = compose_cfg(f"cost_model.compute_scale={value}")
    with pytest.raises(ConfigError, match=rf"cost_model.compute_scale={value}.0: must be in"):
        simulate(cfg, requests_for(cfg))


@pytest.mark.parametrize("value", [0, "abc"])
def test_a_bad_scale_in_a_calibrated_file_is_one_config_error(compose_cfg, tmp_path, value):
    path = tmp_path / "mine.yaml"
    path.write_text(calibration_file("h100_sxm", "vllm").read_text())
    write_block(path, "compute", {"scale": value})
    with pytest.raises(ConfigError, match=r"compute.scale.*must be in"):
        build_cost_model(plain(compose_cfg(f"cost_model.calibration={path}")))


def test_diffusion_jobs_and_the_explained_roofs_take_the_scale(compose_cfg):
    """A FLUX.1 job is mostly compute bound (its DiT steps; the VAE and the launches less):
    at half the speed it takes well over 1.3x as long, at most 2x; the roofline table of
    ``sim.explain`` draws the scaled roof."""
    from cli.explain import operator_table
    from sim.diffusion.cost import DiffusionCostModel
    from sim.diffusion.job import JobShape, ParallelPlan

    times = []
    for s in (1.0, 0.5):
        cfg = plain(compose_cfg("model=flux1_dev", f"cost_model.compute_scale={s}"))
        times.append(DiffusionCostModel.from_config(cfg).timing(
            JobShape("flux1_dev", 1024, 1024), ParallelPlan()).total_s)
    assert 1.3 < times[1] / times[0] <= 2.0
    half = operator_table(plain(compose_cfg("cost_model.compute_scale=0.5")),
                          np.array([8192]), np.array([0]))[1]
    full = operator_table(plain(compose_cfg()), np.array([8192]), np.array([0]))[1]
    assert half["peaks"]["bf16"] == pytest.approx(0.5 * full["peaks"]["bf16"])
    assert half["bandwidth"] == full["bandwidth"]


def test_the_scale_is_the_same_in_both_engines(compose_cfg, requests_for):
    over = ("workload.num_requests=300", "cost_model.compute_scale=0.6")
    cfg = compose_cfg(*over)
    req = requests_for(cfg)
    out = [simulate(compose_cfg(*over, f"engine={e}"), req) for e in ("python", "auto")]
    assert out[1].meta["engine"] == "compiled"
    assert_same_records(*out)
    slower = simulate(compose_cfg("workload.num_requests=300"), req)
    assert out[1].requests["first_token_s"].sum() != slower.requests["first_token_s"].sum()
