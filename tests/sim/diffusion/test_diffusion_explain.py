"""``python -m sim.explain`` on a diffusion pipeline: stages, the plan's communication, the
scaling table that explains sub-linear speed-up, the chart, and one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.diffusion_explain import parse_shape
from cli.explain import main
from sim.diffusion.job import JobShape
from sim.errors import ConfigError


def test_explain_cfg_parallel_job(capsys, tmp_path: Path):
    chart = tmp_path / "dit.png"
    rc = main(["model=sd35_large", "job=1024x1024", "plan=ring4xcfg2", "hardware=h100_sxm",
               "backend=vllm", f"chart={chart}"])
    out = capsys.readouterr().out
    assert rc == 0
    for text in ("[encode]", "[step]", "[decode]", "clip_g.qkv", "double.img_qkv",
                 "double.attention_ring_p2p", "cfg_allgather", "vae.conv_out",
                 "plan: ring4xcfg2 (8 GPUs)", "4,096 image tokens + 333 text tokens",
                 "FLOP/B", "balance", "comm_%", "serial_%", "of the time is communication"):
        assert text in out, text
    assert chart.is_file() and chart.stat().st_size > 0


def test_explain_auto_shows_scaling(capsys):
    rc = main(["model=hunyuan_video", "plan=auto", "gpus=4", "steps=10", "chart=none"])
    out = capsys.readouterr().out
    assert rc == 0 and "the fastest valid plan (plan=auto)" in out
    table = out[out.index("best plan by GPU count"):]
    assert all(f"\n    {g} " in table for g in (1, 2, 4, 8))
    assert "118,800 image tokens" in out and "(4 GPUs)" in out.split("\n")[2]
    # the closing line explains the plan shown (the best on 4 GPUs), not the 8-GPU row
    last = out.strip().split("\n")[-1]
    assert "(the best plan on 4 GPUs) on 4 GPUs:" in last and "not 4x" in last


def test_closing_line_describes_the_plan_asked_for(capsys):
    assert main(["model=flux1_dev", "plan=ulysses2", "steps=5", "chart=none"]) == 0
    last = capsys.readouterr().out.strip().split("\n")[-1]
    assert last.startswith("plan ulysses2 (as asked) on 2 GPUs:") and "not 2x" in last


def test_a_data_parallel_plan_is_not_called_one_gpu(capsys):
    assert main(["model=flux1_schnell", "plan=data8", "images=8", "chart=none"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.split("\n") if x.startswith("communication, serial and eager host"))
    assert "one GPU" not in line and "8 data-parallel groups" in line


@pytest.mark.parametrize("args,field", [
    (["model=sd35_large", "plan=ulysses8"], "plan"),  # 38 heads
    (["model=flux1_dev", "plan=cfg2"], "plan"),  # distilled guidance: no second pass
    (["model=flux1_dev", "job=1000x1000"], "job.height"),
    (["model=flux1_dev", "job=big"], "job"),
    (["model=flux1_dev", "plan=ulysses4", "gpus=8"], "plan"),
    (["model=flux1_dev", "batch=decode:1x10"], "batch"),
    (["model=llama3_8b", "job=1024x1024"], "job"),
    (["model=flux1_dev", "gpus=16"], "gpus"),  # above hardware.gpus_per_node=8
    (["model=flux1_dev", "plan=ulysses8xring2"], "plan"),  # 16 GPUs on an 8-GPU node
    (["model=flux1_dev", "plan=data2"], "plan"),  # one image: a data group would idle
])
def test_errors_are_one_line(capsys, args, field):
    assert main(args + ["chart=none"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {field}=") and "\n" not in err


def test_parse_shape():
    default = JobShape("wan21_t2v_14b", 720, 1280, 81)
    s = parse_shape("wan21_t2v_14b", default, {"job": "480x832x33", "steps": "30",
                                               "guidance": "none", "images": "2"})
    assert s == JobShape("wan21_t2v_14b", 480, 832, 33, 30, 2, "none")
    assert parse_shape("wan21_t2v_14b", default, {}) == default
    with pytest.raises(ConfigError) as e:
        parse_shape("wan21_t2v_14b", default, {"steps": "0"})
    assert e.value.field == "steps"


@pytest.mark.parametrize("override,field,value", [
    ("vae.spatial_compression=0", "vae.spatial_compression", 0),
    ("vae.temporal_compression=0", "vae.temporal_compression", 0),
    ("dit.heads=0", "dit.heads", 0),
    ("dit.head_dim=0", "dit.head_dim", 0),
    ("dit.text_tokens=-1", "dit.text_tokens", -1),
    ("dit.patch_size=0", "dit.patch_size", 0),
    ("dit.ffn=0", "dit.ffn", 0),
    ("dit.double_layers=-1", "dit.double_layers", -1),
    ("steps=0", "steps", 0),
    ("vae.up_channels=[]", "vae.up_channels", []),
    ("vae.mid_channels=0", "vae.mid_channels", 0),
    ("text_encoders.1.heads=0", "text_encoders[1].heads", 0),
    ("guidance=foo", "guidance", "foo"),
    ("height=1000", "height", 1000),  # not a multiple of 16
])
def test_bad_pipeline_fields_are_one_line(capsys, override, field, value):
    assert main(["model=flux1_dev", f"model.diffusion.{override}", "chart=none"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: model.diffusion.{field}={value!r}:") and "\n" not in err
