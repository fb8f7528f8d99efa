"""Stages and memory of a diffusion job (sim.diffusion.memory): weights near the published
model sizes, a plan refused for memory in one line naming the plan and the GiB, offload's
PCIe traffic by hand, plan=auto picking only plans that fit, tiling, FSDP, and where the VAE
decodes."""

from __future__ import annotations

import dataclasses

import pytest

from sim.diffusion.cost import DiffusionCostModel
from sim.diffusion.job import JobShape, ParallelPlan
from sim.diffusion.memory import (
    BYTES,
    GiB,
    dit_params,
    encoder_params,
    offload_seconds,
    plan_memory,
    vae_params,
    vae_working_set,
)
from sim.diffusion.pipeline import load_pipeline
from sim.errors import ConfigError
from tests.sim.diffusion.test_dit_cost import h100_pricer

# parameters of the DiTs as their model cards give them (billions)
PUBLISHED = {"flux1_dev": 12.0, "hunyuan_video": 13.0, "wan21_t2v_14b": 14.0,
             "sd35_large": 8.1, "cogvideox_5b": 5.0}


@pytest.mark.parametrize("model,billions", sorted(PUBLISHED.items()))
def test_dit_weights_are_near_the_published_sizes(model, billions):
    assert dit_params(load_pipeline(model).dit) / 1e9 == pytest.approx(billions, rel=0.12)


def test_text_encoders_and_vae_are_counted():
    p = load_pipeline("flux1_dev")
    t5 = next(e for e in p.text_encoders if "t5" in e.name)
    assert encoder_params(t5) / 1e9 == pytest.approx(4.7, rel=0.05)  # T5-XXL's encoder
    assert 20e6 < vae_params(p.vae) < 200e6


def _cost(hardware: str = "h100_sxm", **pipe_fields) -> tuple[DiffusionCostModel, str]:
    pricer = h100_pricer()
    if hardware == "small":  # a 40 GiB GPU of the same speed
        pricer.hw = dataclasses.replace(pricer.hw, name="small", cuda_total_bytes=40 * GiB)
    pipe = dataclasses.replace(load_pipeline("hunyuan_video"), **pipe_fields)
    return DiffusionCostModel(pricer, {"hunyuan_video": pipe}), "hunyuan_video"


SHAPE = JobShape("hunyuan_video", 960, 960, 129, 2)


def test_a_plan_that_does_not_fit_is_refused_naming_plan_and_gib():
    cost, _ = _cost("small")
    with pytest.raises(ConfigError) as e:
        cost.timing(SHAPE, ParallelPlan())
    msg = str(e.value)
    assert "plan='single'" in msg and "GiB of 40.0 GiB" in msg and "\n" not in msg
    assert "model.diffusion.offload=model" in msg


def test_offload_fits_the_same_plan_and_pays_pcie_by_hand():
    cost, _ = _cost("small", offload="model")
    base, _ = _cost("h100_sxm")
    t = cost.timing(SHAPE, ParallelPlan())
    t0 = base.timing(SHAPE, ParallelPlan())
    job = cost.job(SHAPE)
    p = job.pipe
    enc = sum(encoder_params(e) for e in p.text_encoders) * BYTES
    dit, vae = dit_params(p.dit) * BYTES, vae_params(p.vae) * BYTES
    bw = float(cost.pricer.hw.pcie_bandwidth)
    assert offload_seconds(job, ParallelPlan(), bw) == pytest.approx(
        ((2 * enc + dit) / bw, (dit + 2 * vae) / bw))
    # each GPU of a tensor-parallel plan copies its own quarter of the DiT
    tp4 = offload_seconds(job, ParallelPlan(tensor=4), bw)
    assert tp4 == pytest.approx(((2 * enc + dit / 4) / bw, (dit / 4 + 2 * vae) / bw))
    assert t.encode_s - t0.encode_s == pytest.approx((2 * enc + dit) / bw)
    assert t.decode_s - t0.decode_s == pytest.approx((dit + 2 * vae) / bw)
    m = cost.memory(SHAPE, ParallelPlan())
    assert m.peak == pytest.approx(max(m.encoder_weights, m.dit_weights + m.dit_activations
                                       + m.attention, m.vae_weights + m.vae_working))


def test_auto_picks_only_plans_that_fit():
    cost, _ = _cost("small")
    job = cost.job(SHAPE)
    best = cost.best(SHAPE, 4)
    assert plan_memory(job, best.plan, cost.capacity).fits
    # one GPU cannot hold it at all: the refusal names the least hungry plan
    with pytest.raises(ConfigError, match="does not fit"):
        cost.best(SHAPE, 1)


def test_tensor_parallel_and_fsdp_split_weights_ulysses_replicates():
    cost, _ = _cost()
    job = cost.job(SHAPE)
    one = plan_memory(job, ParallelPlan(), cost.capacity)
    uly = plan_memory(job, ParallelPlan(ulysses=4), cost.capacity)
    tp = plan_memory(job, ParallelPlan(tensor=4), cost.capacity)
    assert uly.dit_weights == one.dit_weights and tp.dit_weights == pytest.approx(
        one.dit_weights / 4)
    assert uly.dit_activations < one.dit_activations / 3  # a quarter of the tokens each
    fsdp, _ = _cost(fsdp=True)
    f = plan_memory(fsdp.job(SHAPE), ParallelPlan(ulysses=4), cost.capacity)
    assert f.dit_weights == pytest.approx(one.dit_weights / 4)
    assert f.encoder_weights == pytest.approx(one.encoder_weights / 4)
    # FSDP over a tensor-parallel gang: the weights split four ways, not sixteen
    ft = plan_memory(fsdp.job(SHAPE), ParallelPlan(tensor=4), cost.capacity)
    assert ft.dit_weights == pytest.approx(one.dit_weights / 4)


def test_tiling_bounds_the_vae_working_set():
    cost, _ = _cost()
    job = cost.job(SHAPE)
    untiled = dataclasses.replace(job, pipe=dataclasses.replace(
        job.pipe, vae=dataclasses.replace(job.pipe.vae, tile_px=0, tile_stride_px=0,
                                          tile_frames=0, tile_stride_frames=0)))
    # the largest tile: 32 x 32 latent pixels (256 px) and 16 + 1 latent frames, which the
    # decoder's two temporal up-samplings make 65 frames (the whole latent's 33 make 129)
    share = (256 ** 2 / (960 * 960)) * (65 / 129)
    one = ParallelPlan()
    assert vae_working_set(job, one) == pytest.approx(vae_working_set(untiled, one) * share)
    assert vae_working_set(untiled, one) > 60 * GiB  # why the reference code tiles


def test_vae_decodes_whole_unless_parallel():
    cost, _ = _cost()
    par, _ = _cost(vae_parallel=True)
    one = cost.timing(SHAPE, ParallelPlan()).decode_s
    assert cost.timing(SHAPE, ParallelPlan(ulysses=4)).decode_s == pytest.approx(one)
    assert par.timing(SHAPE, ParallelPlan(ulysses=4)).decode_s < one / 2


def test_the_math_kernel_holds_its_scores():
    cost, _ = _cost()
    math_, _ = _cost(attention_impl="sdpa_math")
    flash = cost.memory(SHAPE, ParallelPlan(ulysses=8)).attention
    scores = math_.memory(SHAPE, ParallelPlan(ulysses=8)).attention - flash
    seq = cost.job(SHAPE).image_tokens + 256
    assert scores == pytest.approx(24 / 8 * seq * seq * 2 * BYTES, rel=1e-3)
    with pytest.raises(ConfigError, match="does not fit"):
        math_.timing(SHAPE, ParallelPlan(ulysses=8))


def test_auto_gangs_check_memory_on_the_largest_gang_not_one_gpu():
    """A job too big for one GPU still runs under plan=auto on a gang it fits on."""
    from sim.diffusion.timings import Timings

    cost, _ = _cost("small")
    sizer = type("S", (), {"sizes": [1, 2, 4, 8]})()
    Timings(cost, None, sizer).check_shapes([SHAPE])  # fits on 2+ GPUs: no error
    with pytest.raises(ConfigError, match="plan='single'"):
        Timings(cost, ParallelPlan(), sizer).check_shapes([SHAPE])  # a fixed one-GPU plan


def test_fa3_is_refused_off_hopper():
    pricer = h100_pricer()
    pricer.hw = dataclasses.replace(pricer.hw, name="l20", arch="ada")
    pipe = dataclasses.replace(load_pipeline("flux1_dev"), attention_impl="fa3")
    cost = DiffusionCostModel(pricer, {"flux1_dev": pipe})
    with pytest.raises(ConfigError, match="attention_impl='fa3': runs on hopper GPUs only"):
        cost.timing(JobShape("flux1_dev", 1024, 1024), ParallelPlan())


def test_bad_offload_names_its_field():
    from sim.config.diffusion_model import check_diffusion_pipeline

    with pytest.raises(ConfigError, match="model.diffusion.offload"):
        check_diffusion_pipeline(dataclasses.replace(load_pipeline("flux1_dev"),
                                                     offload="sequential"))
