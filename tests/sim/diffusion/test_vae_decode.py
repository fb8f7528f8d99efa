"""The VAE decode as the reference code runs it (sim.diffusion.vae, sim.cost.conv3d,
calibration/fit_vae_conv3d): HunyuanVideo's tiles counted by hand, a cached decoder costing
the whole latent, the channels-first 3D class priced by hand and carried to another GPU at
its FP32 rate, the mask loop's host time by hand, the fit recovering a known efficiency from
simulated jobs, bad settings refused in one line."""

from __future__ import annotations

import dataclasses
import types

import pytest

import calibration.fit_vae_conv3d as fv
from calibration.__main__ import main as calibration_main
from calibration.validate_diffusion import plan_rows, simulate_rows
from cli.explain import main as explain_main
from sim.config.diffusion_model import VAEConfig, check_diffusion_pipeline
from sim.cost.conv3d import calibrated_conv3d_efficiency
from sim.cost.eager import calibrated_eager_costs
from sim.cost.operators import encoder_attention_work
from sim.cost.pricing import Pricer
from sim.diffusion.cost import DiffusionCostModel
from sim.diffusion.job import JobShape, ParallelPlan
from sim.diffusion.memory import vae_working_set
from sim.diffusion.pipeline import load_pipeline
from sim.diffusion.vae import axis_tiles, compute_tiles, conv_op, decode_ops, decode_tiles
from sim.errors import ConfigError
from tests.sim.diffusion.test_attention_split import _hardware, _raw_rows
from tests.sim.diffusion.test_dit_cost import h100_pricer

HUNYUAN = load_pipeline("hunyuan_video").vae  # the official repository's tiling
LATENT = (33, 120, 120)  # 129 frames of 960 x 960


def test_an_axis_is_cut_as_the_reference_loop_cuts_it():
    # for i in range(0, 120, 24): z[..., i : i + 32]
    assert axis_tiles(120, 32, 24) == [32, 32, 32, 32, 24]
    # for i in range(0, 33, 12): z[:, :, i : i + 16 + 1]
    assert axis_tiles(33, 16, 12, 1) == [17, 17, 9]
    assert axis_tiles(64, 32, 0) == [32, 32]  # no stride: the tile, no overlap


def test_hunyuan_video_decodes_75_tiles_by_hand():
    tiles = dict((shape, n) for n, shape in decode_tiles(HUNYUAN, *LATENT))
    assert sum(tiles.values()) == 3 * 5 * 5
    assert tiles[(17, 32, 32)] == 2 * 16 and tiles[(9, 24, 24)] == 1
    assert tiles[(17, 32, 24)] == 2 * 4 and tiles[(17, 24, 32)] == 2 * 4
    # latent pixels decoded: 43 frames x 152^2 over 33 x 120^2
    decoded = sum(n * t * h * w for n, (t, h, w) in decode_tiles(HUNYUAN, *LATENT))
    assert decoded == (17 + 17 + 9) * 152 * 152


def test_a_latent_within_one_tile_is_decoded_whole():
    assert decode_tiles(HUNYUAN, 16, 32, 32) == [(1, (16, 32, 32))]
    # space is tiled on both axes once either side is longer than a tile, each cut by the
    # same loop (starts 0 and 24 of a 30-pixel side: 30 and 6 wide)
    assert {shape for _, shape in decode_tiles(HUNYUAN, 16, 40, 30)} == {
        (16, 32, 30), (16, 32, 6), (16, 16, 30), (16, 16, 6)}


def test_a_cached_decoder_costs_the_whole_latent_and_holds_a_chunk():
    wan = load_pipeline("wan21_t2v_14b").vae
    assert wan.tile_mode == "cached"
    assert compute_tiles(wan, 21, 90, 160) == [(1, (21, 90, 160))]
    assert decode_tiles(wan, 21, 90, 160)[0] == (21, (1, 90, 160))  # one latent frame a chunk


def test_the_channels_first_class_by_hand():
    pricer = h100_pricer()
    m, c_in, c_out = 65 * 256 * 256, 128, 128
    eta = 0.5
    op = conv_op(pricer, "c", m, c_in, c_out, 27, eta)
    flops = 2.0 * m * c_out * c_in * 27
    launch = pricer.eff.gemm["bfloat16"].launch_s
    assert op.flops == flops and op.bound == "compute" and op.dtype == "fp32"
    assert op.time_s == pytest.approx(flops / (67e12 * eta) + launch)
    tensor = conv_op(pricer, "c", m, c_in, c_out, 27)
    assert tensor.dtype == "bfloat16" and tensor.time_s < op.time_s / 5


def test_another_gpu_runs_the_class_at_its_fp32_rate():
    a = h100_pricer()
    b = Pricer(_hardware("h20"), a.eff)
    ta = conv_op(a, "c", 1e8, 256, 256, 27, 0.7).time_s
    tb = conv_op(b, "c", 1e8, 256, 256, 27, 0.7).time_s
    launch = a.eff.gemm["bfloat16"].launch_s
    assert (tb - launch) / (ta - launch) == pytest.approx(67 / 44)


def test_the_decode_uses_the_class_only_for_channels_first_3d():
    pricer = h100_pricer()
    eff = calibrated_conv3d_efficiency("h100_sxm")
    assert eff is not None and 0 < eff <= 1  # fitted on xdit_dev.csv's H100 rows
    first = {o.name: o for o in decode_ops(pricer, HUNYUAN, *LATENT)}
    last = {o.name: o for o in decode_ops(pricer, dataclasses.replace(
        HUNYUAN, conv3d_layout="channels_last"), *LATENT)}
    assert first["vae.up3_conv"].dtype == "fp32" and last["vae.up3_conv"].dtype == "bfloat16"
    assert first["vae.up3_conv"].flops == last["vae.up3_conv"].flops
    assert first["vae.up3_conv"].time_s > 10 * last["vae.up3_conv"].time_s
    flux = {o.name: o for o in decode_ops(pricer, load_pipeline("flux1_dev").vae, 1, 128, 128)}
    assert flux["vae.up3_conv"].dtype == "bfloat16"  # 2D convolutions keep the tensor cores


def test_the_mask_loop_and_the_joint_attention_by_hand():
    pricer = h100_pricer()
    launch_s = calibrated_eager_costs("h100_sxm")["launch_us"] * 1e-6
    ops = {o.name: o for o in decode_ops(pricer, HUNYUAN, *LATENT, launch_s)}
    rows = (17 + 17 + 9) * 152 * 152  # one indexed fill per query row of every tile's mask
    loop = ops["vae.causal_mask_loop"]
    assert (loop.count, loop.bound) == (rows, "host")
    assert loop.time_s == pytest.approx(rows * launch_s)
    # every tile attends over all its latent frames at once: 4 x seq^2 x 512 FLOPs
    seq2 = sum(n * (t * h * w) ** 2 for n, (t, h, w) in decode_tiles(HUNYUAN, *LATENT))
    f, _ = encoder_attention_work(1.0, 1.0, 1.0, 1.0, 512.0, 2)
    assert ops["vae.mid_attention"].flops == pytest.approx(seq2 * f)
    quiet = {o.name for o in decode_ops(pricer, dataclasses.replace(
        HUNYUAN, causal_mask_loop=False), *LATENT, launch_s)}
    assert "vae.causal_mask_loop" not in quiet


def test_the_fit_recovers_a_known_efficiency_from_simulated_jobs():
    table = plan_rows(_raw_rows().assign(gpu="H100"))
    truth = simulate_rows(table, types.SimpleNamespace(
        backend="vllm", overrides=["model.diffusion.vae.conv3d_efficiency=0.3"]))
    table["meas_s"] = truth["pred_s"]
    rows = fv.conv3d_rows(table, ["h100_sxm"])
    assert len(rows) == 4
    assert fv.fit_efficiency(rows, "vllm") == pytest.approx(0.3, abs=0.005)


def test_only_pipelines_with_channels_first_3d_convolutions_are_fitted():
    assert fv.channels_first_3d("hunyuan_video") and fv.channels_first_3d("wan21_t2v_14b")
    assert not fv.channels_first_3d("flux1_dev")


@pytest.mark.parametrize("field, value, words", [
    ("tile_stride_px", 320, "at most tile_px=256"),
    ("tile_stride_px", 100, "a multiple of 8"),
    ("tile_frames", 6, "a multiple of the compression 4"),
    ("tile_mode", "sliced", "one of"),
    ("conv3d_layout", "nhwc", "one of"),
    ("conv3d_efficiency", 0.0, "(0, 1]"),
])
def test_bad_vae_settings_are_refused_naming_the_field(field, value, words):
    pipe = load_pipeline("hunyuan_video")
    bad = dataclasses.replace(pipe, vae=dataclasses.replace(pipe.vae, **{field: value}))
    with pytest.raises(ConfigError) as e:
        check_diffusion_pipeline(bad)
    assert f"model.diffusion.vae.{field}" in str(e.value) and words in str(e.value)


@pytest.mark.parametrize("args, words", [
    (["gpus=[h20]", "held_out_gpus=[h20]"], ("held_out_gpus=", "must not hold out")),
    (["gpus=[]"], ("gpus=", "at least one")),
])
def test_the_fit_refuses_bad_settings_in_one_line(tmp_path, capsys, args, words):
    csv = tmp_path / "d.csv"
    _raw_rows().to_csv(csv, index=False)
    rc = calibration_main(["fit-vae-conv3d", f"csv={csv}", "write=false",
                           f"hydra.run.dir={tmp_path}/run", *args])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err
    assert all(w in err for w in words), err


def test_a_vae_default_config_is_untiled():
    v = VAEConfig()
    assert decode_tiles(v, 1, 128, 128) == [(1, (1, 128, 128))]


def test_a_cached_chunk_holds_the_frames_it_decodes():
    # Wan decodes one latent frame at a time into 4 frames (its cache holds the ones before):
    # the working set is 4 / 81 of the whole decode's top level, not 1 / 81
    job = load_pipeline("wan21_t2v_14b")
    v = job.vae
    cost = DiffusionCostModel(h100_pricer())
    whole = dataclasses.replace(v, tile_frames=0)
    shape = JobShape("wan21_t2v_14b", 720, 1280, 81, 2)
    one = ParallelPlan()
    chunked = vae_working_set(cost.job(shape), one)
    untiled = vae_working_set(dataclasses.replace(cost.job(shape), pipe=dataclasses.replace(
        cost.job(shape).pipe, vae=whole)), one)
    assert chunked == pytest.approx(untiled * 4 / 81)


def test_a_split_decode_tiles_its_strip():
    cost = DiffusionCostModel(h100_pricer())
    job = cost.job(JobShape("hunyuan_video", 960, 960, 129, 2))
    split = dataclasses.replace(job, pipe=dataclasses.replace(job.pipe, vae_parallel=True))
    # 8 strips of 120 latent rows: 15 + 2 x 4 halo rows = 23 rows, within one 32-row tile:
    # the largest tile is 17 x 23 x 32 latent, not 1/8 of a 17 x 32 x 32 one
    eight = vae_working_set(split, ParallelPlan(ulysses=8))
    whole = vae_working_set(job, ParallelPlan())
    assert eight == pytest.approx(whole * 23 / 32)


def test_an_image_job_of_a_video_pipeline_is_tiled_in_space_only():
    tiles = decode_tiles(HUNYUAN, 1, 120, 120)
    assert {t for _, (t, _, _) in tiles} == {1} and sum(n for n, _ in tiles) == 25


def test_a_gpu_without_an_fp32_rate_prices_tensor_cores_and_says_so():
    pricer = Pricer(dataclasses.replace(h100_pricer().hw, name="nofp32", fp32_flops=0.0),
                    h100_pricer().eff)
    with pytest.warns(UserWarning, match="no fp32_flops"):
        ops = {o.name: o for o in decode_ops(pricer, HUNYUAN, *LATENT)}
    assert ops["vae.up3_conv"].dtype == "bfloat16"


def test_a_mask_loop_without_the_joint_attention_is_refused():
    pipe = load_pipeline("hunyuan_video")
    for vae, field in ((dataclasses.replace(pipe.vae, mid_attention_joint=False),
                        "causal_mask_loop"),
                       (dataclasses.replace(pipe.vae, mid_attention=False), "mid_attention_joint")):
        with pytest.raises(ConfigError, match=f"model.diffusion.vae.{field}"):
            check_diffusion_pipeline(dataclasses.replace(pipe, vae=vae))


def test_explain_shows_the_decode_at_the_deployment_compute_speed(capsys):
    assert explain_main(["model=hunyuan_video", "job=960x960x129", "plan=single",
                         "cost_model.compute_scale=0.5"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("vae decode:"))
    assert "75 tiles" in line and "24 TFLOP/s" in line and "Python loop" in line
    row = next(x for x in out.splitlines() if x.strip().startswith("vae.up3_conv"))
    assert " fp32 " in row


def test_an_image_pipeline_warns_of_nothing(recwarn):
    cost = DiffusionCostModel(h100_pricer())
    cost.timing(JobShape("flux1_dev", 1024, 1024, 1, 28), ParallelPlan())
    assert not [w for w in recwarn if "conv" in str(w.message) or "mask" in str(w.message)]


@pytest.mark.parametrize("args, words", [
    (["gpus=[nope]"], ("gpus=", "no conf/hardware file for ['nope']")),
    (["held_out_gpus=[nope]"], ("held_out_gpus=", "no conf/hardware file")),
])
def test_unknown_gpu_names_are_one_line(tmp_path, capsys, args, words):
    csv = tmp_path / "d.csv"
    _raw_rows().to_csv(csv, index=False)
    for command in ("fit-vae-conv3d", "fit-attention-split"):
        rc = calibration_main([command, f"csv={csv}", "write=false",
                               f"hydra.run.dir={tmp_path}/run", *args])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and "\n" not in err
        assert all(w in err for w in words), err


def test_a_bad_vae_setting_on_the_command_line_is_one_line(capsys):
    assert explain_main(["model=hunyuan_video", "model.diffusion.vae.tile_stride_px=300"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "model.diffusion.vae.tile_stride_px=300" in err
