"""The diffusion node pool on the constant job cost: queueing theory (M/D/c), exact job
times, gangs, elastic splitting, batching, policies, preemption at step boundaries."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_module
from scipy.stats import poisson

import conf.schema  # noqa: F401  (registers the config schemas)
from sim.config.cluster import ClusterConfig, FailureConfig
from sim.config.diffusion_cluster import (
    DiffusionBatchingConfig,
    DiffusionJobCostConfig,
    DiffusionParallelConfig,
    check_diffusion_cluster,
)
from sim.diffusion.constant_cost import ConstantDiffusionCost
from sim.diffusion.job import JobTiming, ParallelPlan
from sim.diffusion.run import simulate_diffusion
from sim.errors import ConfigError


def jobs_at(times, **cols) -> pd.DataFrame:
    """A job table: one row per arrival time; other columns fixed or per job."""
    n = len(times)
    d = dict(model="flux1_dev", height=1024, width=1024, frames=1, steps=10, images=1,
             guidance="", priority=0)
    d.update(cols)
    out = {"arrival_time_s": np.asarray(times, float)}
    out.update({k: (np.asarray(v) if np.ndim(v) else np.repeat(v, n)) for k, v in d.items()})
    return pd.DataFrame(out)


def poisson_jobs(n, rate, seed, **cols) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return jobs_at(np.cumsum(rng.exponential(1 / rate, n)), **cols)


def config(nodes=1, step_ms=100.0, encode_ms=0.0, decode_ms=0.0, check=True, **cluster):
    """A run config of ``nodes`` 8-GPU nodes with the constant job cost."""
    cost = DiffusionJobCostConfig(name="constant", step_ms=step_ms, encode_ms=encode_ms,
                                  decode_ms=decode_ms)
    c = ClusterConfig(kind="diffusion", nodes=nodes, job_cost=cost, **cluster)
    return SimpleNamespace(cluster=c, hardware=SimpleNamespace(gpus_per_node=8), seed=0,
                           check_invariants=check)


def md_c_mean_wait(lam: float, d: float, c: int, size: int = 300) -> float:
    """Mean queue wait of M/D/c: N(t + D) = max(N(t) − c, 0) + Poisson(λD) holds at any t
    (all jobs in service at t leave by t + D, none that starts later does), so the chain's
    stationary law is the time-average number in system; Little's law gives the wait."""
    arrivals = poisson.pmf(np.arange(size), lam * d)
    p = np.zeros((size, size))
    for n in range(size):
        base = max(n - c, 0)
        p[n, base:] = arrivals[:size - base]
    p[:, -1] += 1 - p.sum(axis=1)
    pi = np.linalg.matrix_power(p, 2048)[0]
    return float(((np.arange(size) - c).clip(0) * pi).sum() / lam)


@pytest.mark.parametrize("nodes, rho", [(1, 0.6), (3, 0.7)])
def test_whole_node_jobs_wait_as_in_m_d_c(nodes, rho):
    """Jobs that each take a whole node with a deterministic service time are M/D/c."""
    d = 10 * 0.1 / 8  # 10 steps of 100 ms, 8x faster on 8 GPUs
    lam = rho * nodes / d
    r = simulate_diffusion(config(nodes, check=False), poisson_jobs(25_000, lam, seed=nodes))
    jobs = r.jobs
    assert (jobs["status"] == "completed").all()
    assert np.allclose(jobs["service_s"], d)
    wait = (jobs["start_s"] - jobs["arrival_s"]).to_numpy()
    theory = md_c_mean_wait(lam, d, nodes)
    if nodes == 1:  # Pollaczek–Khinchine for M/D/1
        assert theory == pytest.approx(rho * d / (2 * (1 - rho)), rel=1e-6)
    assert wait.mean() == pytest.approx(theory, rel=0.05)


def test_one_job_takes_encode_steps_and_decode_on_its_gang():
    cfg = config(step_ms=80.0, encode_ms=500.0, decode_ms=400.0, gpus_per_job=4)
    r = simulate_diffusion(cfg, jobs_at([2.0], steps=25, images=2))
    j = r.jobs.iloc[0]
    step = 0.08 * 2 / 4
    assert j["status"] == "completed" and j["gpus"] == 4 and j["plan"] == "ulysses4"
    assert j["start_s"] == 2.0 and j["first_step_s"] == pytest.approx(2.5)
    assert j["completion_s"] == pytest.approx(2.5 + 25 * step + 0.4 * 2 / 4)
    assert j["step_s"] == pytest.approx(step) and j["steps"] == 25
    assert r.nodes["busy_gpus"].max() == 4


def test_a_fixed_plan_is_every_jobs_plan():
    cfg = config(gpus_per_job=8, parallel=DiffusionParallelConfig(ulysses=4, cfg=2))
    r = simulate_diffusion(cfg, jobs_at([0.0, 0.0]))
    assert (r.jobs["plan"] == "ulysses4xcfg2").all() and (r.jobs["gpus"] == 8).all()


def test_a_shape_the_fixed_plan_cannot_run_is_one_error_naming_the_workload_field():
    class Picky(ConstantDiffusionCost):
        def timing(self, shape, plan):
            if shape.height % 64:
                raise ConfigError("job.height", shape.height, "a multiple of 64")
            return super().timing(shape, plan)

    cfg = config(gpus_per_job=8, parallel=DiffusionParallelConfig(ulysses=8))
    with pytest.raises(ConfigError, match=r"workload\.height=1000"):
        simulate_diffusion(cfg, jobs_at([0.0], height=1000), cost=Picky(0, 0.1, 0))


def test_a_job_no_gang_can_run_is_rejected_with_a_reason():
    class BigOnly(ConstantDiffusionCost):
        def best(self, shape, gpus):
            if shape.frames > 1 and gpus < 8:
                raise ConfigError("cluster.parallel", gpus, "8 GPUs for a video")
            return super().best(shape, gpus)

    r = simulate_diffusion(config(gpus_per_job=4), jobs_at([0.0, 0.1], frames=[1, 33]),
                           cost=BigOnly(0, 0.1, 0))
    assert r.jobs["status"].tolist() == ["completed", "rejected"]
    assert r.jobs["reject_reason"].tolist() == ["", "no_valid_plan"]


def test_elastic_gangs_follow_the_queue_and_the_parallel_efficiency():
    # speed-up 1 + 0.5 (g − 1): efficiency 0.75 on 2 GPUs, below the default 0.8. A long job
    # holds the node while eight image jobs queue: under load each takes 1 GPU; a lone job
    # later gets the whole node (its fastest plan)
    cfg = config(elastic=True)
    cfg.cluster.job_cost.parallel_efficiency = 0.5
    r = simulate_diffusion(cfg, jobs_at([0.0] + [0.1] * 8 + [100.0], steps=[80] + [10] * 9))
    assert r.jobs["gpus"].tolist() == [8] + [1] * 8 + [8]
    assert (r.jobs["start_s"].iloc[1:9] == r.jobs["completion_s"].iloc[0]).all()
    # with a lower bar (0.7) the same queue takes 2 GPUs each (0.75 >= 0.7; 4 GPUs: 0.625)
    cfg.cluster.elastic_efficiency = 0.7
    r = simulate_diffusion(cfg, jobs_at([0.0] + [0.1] * 8, steps=[80] + [10] * 8))
    assert r.jobs["gpus"].tolist() == [8] + [2] * 8
    # perfect scaling: every job keeps the whole node, queue or not
    cfg = config(elastic=True)
    r = simulate_diffusion(cfg, jobs_at([0.0, 0.1, 0.1], frames=[1, 33, 33], steps=80))
    assert r.jobs["gpus"].tolist() == [8, 8, 8]


def test_elastic_on_the_roofline_a_video_keeps_a_node_and_images_under_load_get_1_or_2():
    # one image alone takes the node; a Wan 2.1 video (≈97 % efficient on 8 GPUs) and four
    # images queue behind it: the video keeps 8 GPUs under load, the images (FLUX.1-dev,
    # ≈90 % on 2 GPUs, ≈70 % on 4) get 1 or 2 while others wait; a lone image later, the node
    with initialize_config_module("conf", version_base=None):
        cfg = compose("config", overrides=["workload=diffusion", "cluster=diffusion",
                                           "model=flux1_dev", "hardware=h100_sxm",
                                           "cluster.nodes=1", "cluster.elastic=true"])
    video = dict(model="wan21_t2v_14b", height=720, width=1280, frames=33, steps=50)
    image = dict(model="flux1_dev", height=1024, width=1024, frames=1, steps=28)
    rows = [image, video] + [image] * 5
    jobs = jobs_at([0.0] + [0.01] * 5 + [1e4], **{k: [r[k] for r in rows] for k in image})
    r = simulate_diffusion(cfg, jobs)
    g = r.jobs["gpus"].tolist()
    assert (r.jobs["status"] == "completed").all()
    assert g[0] == 8 and g[1] == 8 and set(g[2:6]) <= {1, 2} and g[6] == 8, g


@pytest.mark.parametrize("bar", [0.0, 1.5, float("nan")])
def test_the_elastic_efficiency_bar_is_a_fraction(bar):
    c = config(elastic=True).cluster
    c.elastic_efficiency = bar
    with pytest.raises(ConfigError, match=r"cluster\.elastic_efficiency="):
        check_diffusion_cluster(c, 8)
    c.elastic_efficiency = 1.0
    check_diffusion_cluster(c, 8)


def test_batching_waits_for_a_full_batch_at_most_max_wait():
    batching = DiffusionBatchingConfig(max_images=4, max_wait_s=0.5)
    cfg = config(batching=batching)
    r = simulate_diffusion(cfg, jobs_at([0.0, 0.1, 0.2, 0.3, 2.0, 2.1]))
    j = r.jobs
    assert j["batch_size"].tolist() == [4, 4, 4, 4, 2, 2]
    assert (j["start_s"].iloc[:4] == 0.3).all()  # full at the fourth arrival
    assert (j["start_s"].iloc[4:] == 2.5).all()  # not full: 0.5 s after the first
    step = 0.1 * 4 / 8
    assert j["step_s"].iloc[0] == pytest.approx(step)
    assert j["completion_s"].iloc[0] == pytest.approx(0.3 + 10 * step)


def test_queued_jobs_of_one_shape_start_together_without_waiting():
    cfg = config(batching=DiffusionBatchingConfig(max_images=3, max_wait_s=0.0))
    times = [0.0, 0.01, 0.02, 0.03, 0.04]
    r = simulate_diffusion(cfg, jobs_at(times, height=[1024, 1024, 1024, 512, 1024]))
    j = r.jobs
    # the first starts alone; the others queue behind it; 1024² ones batch (at most 3),
    # the 512² one runs alone, in arrival order of the batch's first job
    assert j["batch_size"].tolist() == [1, 3, 3, 1, 3]
    assert j["start_s"].iloc[1] == j["start_s"].iloc[2] == j["start_s"].iloc[4]
    assert j["start_s"].iloc[3] > j["start_s"].iloc[1]


def test_videos_and_other_priorities_never_batch():
    cfg = config(batching=DiffusionBatchingConfig(max_images=4, max_wait_s=1.0))
    r = simulate_diffusion(cfg, jobs_at([0.0, 0.0, 0.0, 0.0], frames=[33, 33, 1, 1],
                                        priority=[0, 0, 0, 1]))
    assert r.jobs["batch_size"].tolist() == [1, 1, 1, 1]


def test_sjf_runs_short_jobs_first():
    times = [0.0, 0.1, 0.2, 0.3]
    steps = [100, 80, 40, 5]  # the first holds the node while the others queue
    fcfs = simulate_diffusion(config(), jobs_at(times, steps=steps)).jobs
    sjf = simulate_diffusion(config(policy="sjf"), jobs_at(times, steps=steps)).jobs
    assert fcfs["start_s"].rank().tolist() == [1, 2, 3, 4]
    assert sjf["start_s"].rank().tolist() == [1, 4, 3, 2]
    fcfs_lat = (fcfs["completion_s"] - fcfs["arrival_s"]).mean()
    sjf_lat = (sjf["completion_s"] - sjf["arrival_s"]).mean()
    assert sjf_lat < fcfs_lat


def test_priority_pauses_a_less_urgent_job_at_its_next_step_boundary():
    # step 0.1 s on 8 GPUs after a 1 s encode: the low job (100 steps) starts at 0; the urgent
    # one arrives at 3.234 s, inside step 23 (steps run from 1.0 s); the low job pauses at
    # 1.0 + 23 × 0.1 = 3.3 s and resumes when the urgent one ends, without re-encoding
    cfg = config(step_ms=800.0, encode_ms=1000.0, policy="priority")
    r = simulate_diffusion(cfg, jobs_at([0.0, 3.234], steps=[100, 5], priority=[5, 0]))
    low, high = r.jobs.iloc[0], r.jobs.iloc[1]
    assert high["start_s"] == pytest.approx(3.3)
    assert high["completion_s"] == pytest.approx(3.3 + 1.0 + 5 * 0.1)
    assert low["num_preemptions"] == 1 and high["num_preemptions"] == 0
    assert low["completion_s"] == pytest.approx(high["completion_s"] + 77 * 0.1)
    assert low["service_s"] == pytest.approx(1.0 + 100 * 0.1)
    no_preempt = simulate_diffusion(config(step_ms=800.0, encode_ms=1000.0, policy="priority",
                                           preemption=False),
                                    jobs_at([0.0, 3.234], steps=[100, 5], priority=[5, 0]))
    assert no_preempt.jobs["num_preemptions"].sum() == 0
    assert no_preempt.jobs["start_s"].iloc[1] == pytest.approx(11.0)


def test_a_job_in_its_last_step_is_not_paused():
    cfg = config(step_ms=800.0, policy="priority")
    r = simulate_diffusion(cfg, jobs_at([0.0, 0.95], steps=[10, 1], priority=[5, 0]))
    assert r.jobs["num_preemptions"].sum() == 0
    assert r.jobs["start_s"].iloc[1] == pytest.approx(1.0)


def test_closed_loop_jobs_follow_their_clients_previous_job():
    jobs = jobs_at([0.0, np.nan, 0.0, np.nan])
    jobs["client"] = [0, 0, 1, 1]
    jobs["think_time_s"] = [0.0, 2.0, 0.0, 0.5]
    r = simulate_diffusion(config(nodes=2), jobs)
    j = r.jobs
    assert j["arrival_s"].iloc[1] == pytest.approx(j["completion_s"].iloc[0] + 2.0)
    assert j["arrival_s"].iloc[3] == pytest.approx(j["completion_s"].iloc[2] + 0.5)
    assert (j["status"] == "completed").all()


def test_node_occupancy_rows_follow_the_gangs():
    r = simulate_diffusion(config(nodes=2, gpus_per_job=4), jobs_at([0.0, 0.0, 0.0]))
    nodes = r.nodes
    assert nodes.iloc[:2]["busy_gpus"].tolist() == [0, 0]  # every node idle at time 0
    assert nodes["busy_gpus"].max() == 8 and (nodes["busy_gpus"] <= 8).all()
    last = nodes.groupby("node").tail(1)
    assert (last["busy_gpus"] == 0).all()


def test_same_seed_same_records_and_timing_cache_is_exact():
    cfg = config(nodes=2, elastic=True, failure=FailureConfig(mtbf_s=5.0, mttr_s=1.0))
    jobs = poisson_jobs(200, 5.0, seed=3, steps=20)
    a, b = simulate_diffusion(cfg, jobs), simulate_diffusion(cfg, jobs)
    pd.testing.assert_frame_equal(a.jobs, b.jobs)
    pd.testing.assert_frame_equal(a.nodes, b.nodes)
    cost = ConstantDiffusionCost(0.0, 0.1, 0.0)
    t = cost.best(SimpleNamespace(steps=3, images=1), 2)
    assert t == JobTiming(ParallelPlan(ulysses=2), 3, 0.0, 0.05, 0.0)
