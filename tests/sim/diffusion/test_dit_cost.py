"""The DiT, encoder and VAE costs on the roofline: a GEMM by hand, steps, CFG parallel,
Ulysses, tensor parallel, PipeFusion, data parallel, and sub-linear scaling."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from sim.config import HardwareConfig
from sim.cost.calibration_file import load_calibration
from sim.cost.pricing import Pricer
from sim.diffusion.cost import DiffusionCostModel
from sim.diffusion.dit import chunked
from sim.diffusion.job import JobShape, ParallelPlan
from sim.diffusion.pipeline import load_pipeline
from sim.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]
MODELS = ("flux1_dev", "flux1_schnell", "sd35_large", "hunyuan_video", "wan21_t2v_14b",
          "cogvideox_5b")


def h100_pricer() -> Pricer:
    """One H100 (conf/hardware/h100_sxm.yaml) with the committed vLLM calibration."""
    raw = OmegaConf.load(ROOT / "conf" / "hardware" / "h100_sxm.yaml")
    raw.pop("defaults")
    hw = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(HardwareConfig), raw))
    eff, _ = load_calibration("h100_sxm", "vllm")
    return Pricer(hw, eff)


@pytest.fixture(scope="module")
def cost() -> DiffusionCostModel:
    return DiffusionCostModel(h100_pricer())


def default(cost, name: str, **kw) -> JobShape:
    p = cost.pipeline(name)
    return JobShape(name, p.height, p.width, p.frames, **kw)


def ops_by_name(ops):
    return {op.name: op for op in ops}


def test_one_dit_gemm_by_hand(cost):
    """Flux's text-stream QKV on one H100: m = 512 T5 tokens, n = 3 × 3072, k = 3072, in
    each of the 19 double blocks; the roofline with the calibrated GEMM efficiency."""
    op = ops_by_name(cost.breakdown(default(cost, "flux1_dev"), ParallelPlan(),
                                    "step"))["double.txt_qkv"]
    m, n, k, layers = 512, 3 * 3072, 3072, 19
    flops = 2.0 * m * n * k
    nbytes = 2.0 * (m * k + k * n + m * n)  # bf16 activations, weights and output
    eff, _ = load_calibration("h100_sxm", "vllm")
    e = eff.gemm["bfloat16"]
    t_compute = flops / (989.4e12 * e.compute_eta(m, n, k))
    t_memory = nbytes / (3.35e12 * e.memory_eta(m, n, k))
    t = max(t_compute, t_memory) + e.launch_s
    assert op.count == layers
    assert op.flops == pytest.approx(layers * flops)
    assert op.bytes == pytest.approx(layers * nbytes)
    assert op.time_s == pytest.approx(layers * t, rel=1e-9)
    assert op.bound == ("compute" if t_compute >= t_memory else "memory")
    assert op.intensity == pytest.approx(flops / nbytes)  # 419 FLOP/B, above the 295 balance


def test_doubling_steps_doubles_dit_time(cost):
    for name, plan in (("flux1_dev", ParallelPlan()), ("hunyuan_video", ParallelPlan(ulysses=8)),
                       ("sd35_large", ParallelPlan(cfg=2, ring=2))):
        a = cost.timing(default(cost, name, steps=10), plan)
        b = cost.timing(default(cost, name, steps=20), plan)
        assert b.steps * b.step_s == pytest.approx(2 * a.steps * a.step_s)
        assert (b.encode_s, b.decode_s) == (a.encode_s, a.decode_s)


def test_cfg_parallel_halves_step_compute_and_adds_a_gather(cost):
    shape = default(cost, "sd35_large")
    one = cost.breakdown(shape, ParallelPlan(), "step")
    two = cost.breakdown(shape, ParallelPlan(cfg=2), "step")
    assert sum(o.flops for o in two) == pytest.approx(sum(o.flops for o in one) / 2)
    gathers = [o for o in two if o.name == "cfg_allgather"]
    assert len(gathers) == 1 and gathers[0].bound == "comm" and gathers[0].time_s > 0
    assert not any(o.name == "cfg_allgather" for o in one)
    # both noise predictions of the image: 2 × 16 channels × 128 × 128 latent × bf16
    assert gathers[0].bytes == 2 * 16 * 128 * 128 * 2
    assert cost.timing(shape, ParallelPlan(cfg=2)).step_s < cost.timing(
        shape, ParallelPlan()).step_s


def test_ulysses8_divides_attention_and_adds_four_all_to_alls(cost):
    shape = default(cost, "flux1_dev")
    one = ops_by_name(cost.breakdown(shape, ParallelPlan(), "step"))
    u8 = cost.breakdown(shape, ParallelPlan(ulysses=8), "step")
    by = ops_by_name(u8)
    for attn in ("double.attention", "single.attention"):
        assert by[attn].flops == pytest.approx(one[attn].flops / 8)
    a2a = [o for o in u8 if o.name.endswith("_ulysses_a2a")]
    attention_layers = 19 + 38
    assert sum(o.count for o in a2a) == 4 * attention_layers
    # each: this GPU's 4608 / 8 joint tokens × 24 heads × 128 × bf16
    assert by["single.attention_ulysses_a2a"].bytes == pytest.approx(
        4 * 38 * (4608 // 8) * 24 * 128 * 2)
    assert not any(o.name.endswith("_ulysses_a2a") for o in one.values())


def test_tensor_parallel_all_reduces(cost):
    ops = ops_by_name(cost.breakdown(default(cost, "flux1_dev"), ParallelPlan(tensor=2), "step"))
    assert ops["double.tp_allreduce"].count == 2 * 19
    assert ops["single.tp_allreduce"].count == 38


def test_ring_sends_and_merges(cost):
    ops = ops_by_name(cost.breakdown(default(cost, "hunyuan_video"), ParallelPlan(ring=4),
                                     "step"))
    assert ops["single.attention"].count == 4 * 40  # r passes per layer
    assert ops["single.attention_ring_p2p"].count == 3 * 40  # r − 1 sends per layer
    assert ops["single.attention_ring_merge"].time_s > 0


def test_pipefusion_fill_once_per_job(cost):
    shape = default(cost, "flux1_dev")
    a = ops_by_name(cost.breakdown(shape, ParallelPlan(pipefusion=4), "step"))
    b = ops_by_name(cost.breakdown(default(cost, "flux1_dev", steps=100),
                                   ParallelPlan(pipefusion=4), "step"))
    assert a["pipefusion_fill_drain"].time_s == pytest.approx(
        2 * b["pipefusion_fill_drain"].time_s)  # spread over twice the steps
    assert a["single.qkv_mlp_in"].count == 4 * 10  # ⌈38 / 4⌉ blocks × 4 patches


@pytest.mark.parametrize("steps", [1, 2, 50])
def test_pipefusion_warmup_runs_the_stages_in_turn(cost, steps):
    """xDiT's first step (num_pipeline_warmup_steps = 1) passes the whole sequence through
    the p stages in turn: (p − 1) more times the step's DiT time and a hand-off of the full
    sequence, once per job; the async patch pipeline's fill/drain only when steps remain."""
    p = 4
    shape = default(cost, "sd35_large", steps=steps)
    ops = cost.breakdown(shape, ParallelPlan(pipefusion=p, ulysses=2), "step")
    by = ops_by_name(ops)
    dit = sum(o.time_s for o in ops if not o.name.startswith(("pipefusion", "sp_output")))
    job = cost.job(shape)
    tokens = -(-(job.image_tokens + job.text_tokens) // 2)  # this GPU's half of the sequence
    hand_off = cost.pricer.comm("x", "p2p", 2 * tokens * 2432 * 2, 2, cost.link_bw)
    warm = by["pipefusion_warmup"]
    assert warm.bound == "serial" and warm.count == 1 and warm.flops == 0
    assert warm.time_s * steps == pytest.approx((p - 1) * (dit + hand_off.time_s))
    assert warm.bytes == pytest.approx((p - 1) * hand_off.bytes)
    assert ("pipefusion_fill_drain" in by) == (steps > 1)
    # a one-step job is one synchronous step: p stages' work in sequence, plus hand-offs
    if steps == 1:
        t = cost.timing(shape, ParallelPlan(pipefusion=p, ulysses=2))
        assert t.step_s == pytest.approx(p * dit + (p - 1) * hand_off.time_s
                                         + by["pipefusion_p2p"].time_s
                                         + by["sp_output_allgather"].time_s)


def test_data_parallel_needs_several_images(cost):
    with pytest.raises(ConfigError) as e:  # one image: the second group would idle
        cost.timing(default(cost, "flux1_dev"), ParallelPlan(data=2))
    assert e.value.field == "cluster.parallel.data"
    four = cost.timing(default(cost, "flux1_dev", images=4), ParallelPlan(data=2))
    two = cost.timing(default(cost, "flux1_dev", images=2), ParallelPlan())
    assert four.step_s == pytest.approx(two.step_s)


def test_guidance_doubles_encoder_batch(cost):
    shape = default(cost, "flux1_dev")
    distilled = cost.timing(shape, ParallelPlan())
    cfg = cost.timing(default(cost, "flux1_dev", guidance="cfg"), ParallelPlan())
    assert cfg.encode_s > distilled.encode_s
    assert cfg.step_s > 1.8 * distilled.step_s


@pytest.mark.parametrize("name", MODELS)
def test_one_to_eight_gpus_is_sub_linear(cost, name):
    shape = default(cost, name)
    one, eight = cost.best(shape, 1), cost.best(shape, 8)
    speedup = one.total_s / eight.total_s
    assert 1 < speedup < 8
    assert eight.plan.gpus == 8 and one.plan == ParallelPlan()


def test_timing_is_cached(cost):
    shape = default(cost, "cogvideox_5b")
    assert cost.timing(shape, ParallelPlan(ulysses=2)) is cost.timing(shape,
                                                                      ParallelPlan(ulysses=2))
    assert cost.best(shape, 4) is cost.best(shape, 4)


def test_chunking_never_prices_above_the_whole(cost):
    p = cost.pricer
    for rows, n, k in ((118_800, 3072, 3072), (18_900, 5120, 13_824)):
        whole = p.gemm("x", rows, n, k, "bfloat16")
        best = chunked(lambda r, n=n, k=k: p.gemm("x", r, n, k, "bfloat16"), rows)
        assert best.time_s <= whole.time_s
        assert (best.flops, best.bytes, best.count) == (whole.flops, whole.bytes, 1)
    # Wan's MLP down on one of 8 Ulysses GPUs prices faster in pieces (of ⌈18,900 / k⌉ rows)
    assert best.time_s < whole.time_s


def test_chunked_operators_report_their_exact_work(cost):
    """Wan's FFN: up [m, h]·[h, f] and down [m, f]·[f, h] do the same 2·m·h·f FLOPs, however
    each is split into pieces to price its time."""
    shape = default(cost, "wan21_t2v_14b")
    by = ops_by_name(cost.breakdown(shape, ParallelPlan(ulysses=8), "step"))
    m, h, f, layers = 2 * 75_600 // 8, 5120, 13_824, 40  # CFG: 2 sequences, 1/8 of each
    assert by["cross.mlp_up"].flops == by["cross.mlp_down"].flops == 2.0 * m * h * f * layers
    assert by["cross.self_qkv"].flops == 2.0 * m * 3 * h * h * layers


def test_encoders_and_vae_are_priced(cost):
    shape = default(cost, "wan21_t2v_14b")
    enc = ops_by_name(cost.breakdown(shape, ParallelPlan(), "encode"))
    # umT5-XXL, batch 2 under CFG (negative prompt), 512 tokens: FFN-in 2 × 10240 wide
    assert enc["umt5_xxl.ffn_up"].flops == pytest.approx(24 * 2 * (2 * 512) * (2 * 10240)
                                                         * 4096)
    dec1 = cost.breakdown(shape, ParallelPlan(), "decode")
    dec8 = cost.breakdown(shape, ParallelPlan(ulysses=8), "decode")
    t1, t8 = (sum(o.time_s for o in d) for d in (dec1, dec8))
    assert t8 == pytest.approx(t1)  # Wan decodes on one rank: the VAE is not split
    split = DiffusionCostModel(cost.pricer, {"wan21_t2v_14b": dataclasses.replace(
        cost.pipeline("wan21_t2v_14b"), vae_parallel=True)})
    t8p = sum(o.time_s for o in split.breakdown(shape, ParallelPlan(ulysses=8), "decode"))
    assert t1 / 8 < t8p < t1  # a parallel VAE: split over 8 GPUs, with halos and a gather
    conv = ops_by_name(dec1)["vae.conv_out"]
    # 81 × 720 × 1280 output voxels, 96 → 3 channels, 3×3×3 kernels
    assert conv.flops == pytest.approx(2.0 * 81 * 720 * 1280 * 3 * 96 * 27)


def test_from_config_uses_the_runs_model(compose_cfg):
    from sim.builders import plain

    cfg = plain(compose_cfg("model=flux1_dev", "model.diffusion.steps=7", "hardware=h100_sxm"))
    cost = DiffusionCostModel.from_config(cfg)
    assert cost.timing(JobShape("flux1_dev", 1024, 1024), ParallelPlan()).steps == 7
    assert cost.pipeline("sd35_large") == load_pipeline("sd35_large")


def test_unknown_model_in_a_job_is_a_config_error(cost):
    with pytest.raises(ConfigError) as e:
        cost.best(JobShape("nope", 1024, 1024), 8)
    assert e.value.field == "model"
