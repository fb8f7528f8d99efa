"""``python -m sim.explain`` on a diffusion pipeline: stages, the plan's communication, the
scaling table that explains sub-linear speed-up, the chart, and one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.diffusion.explain import parse_shape
from sim.diffusion.job import JobShape
from sim.errors import ConfigError
from sim.explain import main


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
    assert "8 GPUs:" in out and "not 8x" in out


@pytest.mark.parametrize("args,field", [
    (["model=sd35_large", "plan=ulysses8"], "plan"),  # 38 heads
    (["model=flux1_dev", "plan=cfg2"], "plan"),  # distilled guidance: no second pass
    (["model=flux1_dev", "job=1000x1000"], "job.height"),
    (["model=flux1_dev", "job=big"], "job"),
    (["model=flux1_dev", "plan=ulysses4", "gpus=8"], "plan"),
    (["model=flux1_dev", "batch=decode:1x10"], "batch"),
    (["model=llama3_8b", "job=1024x1024"], "job"),
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
