"""Parallel plans: enumeration, labels, validity with one clear message per bad degree, the
plan's communication formulas, ``best``, and the VAE split."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from sim.config import HardwareConfig
from sim.cost.calibration_file import load_calibration
from sim.cost.pricing import Pricer
from sim.diffusion.cost import DiffusionCostModel
from sim.diffusion.job import JobShape, JobTiming, ParallelPlan
from sim.diffusion.pipeline import load_pipeline, resolve
from sim.diffusion.plans import (
    check_plan,
    enumerate_plans,
    parse_plan,
    simpler_first,
    valid_plans,
)
from sim.diffusion.vae import HALO_LATENT_ROWS, split_factor
from sim.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def cost() -> DiffusionCostModel:
    """Jobs priced on one H100 (conf/hardware/h100_sxm.yaml) with the vLLM calibration."""
    raw = OmegaConf.load(ROOT / "conf" / "hardware" / "h100_sxm.yaml")
    raw.pop("defaults")
    hw = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(HardwareConfig), raw))
    eff, _ = load_calibration("h100_sxm", "vllm")
    return DiffusionCostModel(Pricer(hw, eff))


def job(name: str, **kw):
    p = load_pipeline(name)
    return resolve(JobShape(name, p.height, p.width, p.frames, **kw), p)


def test_enumeration_covers_every_factorization():
    plans = enumerate_plans(8)
    assert all(p.gpus == 8 for p in plans)
    assert len(plans) == len(set(plans)) == math.comb(3 + 5, 5)  # 2^3 over six degrees
    assert len(enumerate_plans(1)) == 1 and enumerate_plans(1)[0].label() == "single"
    with pytest.raises(ConfigError):
        enumerate_plans(0)


@pytest.mark.parametrize("label", ["single", "ulysses4xcfg2", "ring2xpipefusion4",
                                   "ulysses2xring2xtensor2"])
def test_labels_round_trip(label):
    assert parse_plan(label).label() == label


@pytest.mark.parametrize("text", ["ulysses", "bogus2", "ulysses0", "ring2xring2", ""])
def test_bad_plan_text(text):
    with pytest.raises(ConfigError) as e:
        parse_plan(text)
    assert e.value.field == "plan"


@pytest.mark.parametrize("name,plan,gpus,field", [
    ("flux1_dev", ParallelPlan(ulysses=4), 8, "cluster.parallel"),  # 4 != 8 GPUs
    ("sd35_large", ParallelPlan(ulysses=4), 4, "cluster.parallel.ulysses"),  # 38 heads
    ("flux1_dev", ParallelPlan(cfg=2), 2, "cluster.parallel.cfg"),  # distilled: one pass
    ("sd35_large", ParallelPlan(cfg=4), 4, "cluster.parallel.cfg"),
    ("sd35_large", ParallelPlan(tensor=4), 4, "cluster.parallel.tensor"),
    ("cogvideox_5b", ParallelPlan(pipefusion=64), 64, "cluster.parallel.pipefusion"),
    ("flux1_dev", ParallelPlan(data=2), 2, "cluster.parallel.data"),  # one image, two groups
])
def test_invalid_plans_name_the_degree(name, plan, gpus, field):
    with pytest.raises(ConfigError) as e:
        check_plan(plan, job(name), gpus)
    assert e.value.field == field


def test_valid_plans_for_a_distilled_image_model():
    plans = valid_plans(job("flux1_dev"), 8)
    assert plans and all(p.cfg == 1 for p in plans)
    assert ParallelPlan(ulysses=8) in plans and ParallelPlan(ring=2, ulysses=4) in plans


def test_data_degree_at_most_the_images():
    assert not any(p.data > 1 for p in valid_plans(job("flux1_dev"), 8))
    three = valid_plans(job("flux1_dev", images=3), 4)
    assert ParallelPlan(data=2, ulysses=2) in three and ParallelPlan(data=4) not in three
    check_plan(ParallelPlan(data=8), job("flux1_dev", images=8), 8)


class TiedCost(DiffusionCostModel):
    """Every plan takes the same time (up to float noise), so only the tie rule decides."""

    def timing(self, shape, plan):
        noise = 1e-13 * (hash(plan) % 7)
        return JobTiming(plan, 1, 0.0, 1.0 + noise, 0.0)


def test_ties_go_to_fewer_and_cheaper_degrees(cost):
    tied = TiedCost(cost.pricer)
    shape = JobShape("flux1_dev", 1024, 1024)
    # one-degree plans first; of those, the one that communicates least (not tensor4,
    # the first in enumeration order)
    assert tied.best(shape, 4).plan == ParallelPlan(pipefusion=4)
    assert tied.best(JobShape("flux1_dev", 1024, 1024, images=4), 4).plan == ParallelPlan(
        data=4)
    assert tied.best(JobShape("sd35_large", 1024, 1024), 8).plan == ParallelPlan(pipefusion=8)
    plans = valid_plans(cost.job(shape), 8)
    assert sorted(plans, key=simpler_first) == sorted(reversed(plans), key=simpler_first)
    assert simpler_first(ParallelPlan(ulysses=2, ring=2)) < simpler_first(
        ParallelPlan(ring=2, tensor=2))


def test_best_is_the_fastest_valid_plan(cost):
    shape = JobShape("sd35_large", 1024, 1024)
    best = cost.best(shape, 4)
    times = [cost.timing(shape, p).total_s for p in valid_plans(cost.job(shape), 4)]
    assert best.total_s == min(times)
    assert best.plan.gpus == 4


def test_cfg_gather_and_sequence_gather_sizes(cost):
    shape = JobShape("cogvideox_5b", 480, 720, 49)
    ops = {o.name: o for o in cost.breakdown(shape, ParallelPlan(cfg=2, ulysses=4), "step")}
    latent = 2 * 16 * 13 * 60 * 90  # bf16 noise prediction of one video
    assert ops["cfg_allgather"].bytes == 2 * latent
    assert ops["sp_output_allgather"].bytes == latent  # batch 1 per CFG group
    p = cost.pricer
    assert ops["cfg_allgather"].time_s == pytest.approx(
        p.comm("x", "allgather", 2 * latent, 2, p.hw.nvlink_bandwidth).time_s)


def test_vae_split():
    assert split_factor(8, 8, 128) == 1.0  # one image per GPU
    assert split_factor(9, 8, 128) == 2.0
    assert split_factor(1, 1, 128) == 1.0
    assert split_factor(1, 8, 128) == pytest.approx(1 / 8 + 2 * HALO_LATENT_ROWS / 128)
    assert split_factor(2, 8, 128) == pytest.approx(1 / 4 + 2 * HALO_LATENT_ROWS / 128)
    assert split_factor(1, 8, 8) == 1.0  # strips thinner than their halos gain nothing
