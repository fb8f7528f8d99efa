"""Property tests of the diffusion node pool: under every policy, gang size, elastic
splitting, batching, preemption and node failures, the pool's invariants hold after every
event (``check_invariants``: a node never runs more GPUs than it has, gangs hold exactly the
busy GPUs, every job is in one place) and every job ends completed, rejected or failed with
a reason. Examples are derandomized under ``CI``."""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysis.diffusion_metrics import summarize_jobs
from sim.config.cluster import ClusterConfig, FailureConfig
from sim.config.diffusion_cluster import DiffusionBatchingConfig, DiffusionJobCostConfig
from sim.diffusion.records import JOB_FAIL_REASONS, JOB_REJECT_REASONS
from sim.diffusion.run import simulate_diffusion

EXAMPLES = int(os.environ.get("HYPOTHESIS_EXAMPLES", 40))
SETTINGS = dict(max_examples=EXAMPLES, deadline=None, derandomize=bool(os.environ.get("CI")),
                suppress_health_check=[HealthCheck.too_slow])


@st.composite
def pools(draw):
    """A small pool, its policy and options, and a job stream that keeps it busy."""
    gpus_per_node = draw(st.sampled_from([1, 2, 4, 8]))
    elastic = draw(st.booleans())
    failures = draw(st.booleans())
    c = ClusterConfig(
        kind="diffusion", nodes=draw(st.integers(1, 3)),
        policy=draw(st.sampled_from(["fcfs", "sjf", "priority"])),
        preemption=draw(st.booleans()), elastic=elastic,
        gpus_per_job=draw(st.sampled_from([g for g in (1, 2, 4, 8) if g <= gpus_per_node])),
        batching=DiffusionBatchingConfig(max_images=draw(st.integers(1, 4)),
                                         max_wait_s=draw(st.sampled_from([0.0, 0.2]))),
        checkpointing=draw(st.booleans()),
        failure=FailureConfig(mtbf_s=draw(st.sampled_from([3.0, 10.0])) if failures else None,
                              mttr_s=draw(st.sampled_from([0.5, 2.0, None])),
                              max_retries=draw(st.sampled_from([None, 0, 2]))),
        job_cost=DiffusionJobCostConfig(name="constant", step_ms=draw(st.sampled_from(
            [50.0, 200.0])), encode_ms=draw(st.sampled_from([0.0, 300.0])), decode_ms=100.0))
    cfg = SimpleNamespace(cluster=c, hardware=SimpleNamespace(gpus_per_node=gpus_per_node),
                          seed=draw(st.integers(0, 3)), check_invariants=True)
    n = draw(st.integers(1, 40))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    jobs = pd.DataFrame({
        "arrival_time_s": np.sort(rng.uniform(0, draw(st.sampled_from([0.5, 5.0, 20.0])), n)),
        "model": "flux1_dev", "height": rng.choice([512, 1024], n), "width": 1024,
        "frames": rng.choice([1, 1, 33], n), "steps": rng.integers(1, 30, n),
        "images": rng.choice([1, 2, 4], n), "guidance": "", "priority": rng.integers(0, 3, n)})
    return cfg, jobs


@settings(**SETTINGS)
@given(pools())
def test_gangs_and_conservation_hold_and_every_job_ends(case):
    cfg, jobs = case
    r = simulate_diffusion(cfg, jobs)  # the pool checks its invariants after every event
    j = r.jobs
    assert len(j) == len(jobs)
    assert j["status"].isin(["completed", "rejected", "failed"]).all()
    assert (j.loc[j["status"] == "failed", "fail_reason"].isin(JOB_FAIL_REASONS[1:])).all()
    assert (j.loc[j["status"] == "rejected", "reject_reason"].isin(JOB_REJECT_REASONS[1:])).all()
    assert (j.loc[j["status"] == "completed", "steps_done"]
            == j.loc[j["status"] == "completed", "steps"]).all()
    g = cfg.hardware.gpus_per_node
    assert r.nodes["busy_gpus"].between(0, g).all()
    started = j[j["start_s"].notna()]
    assert started["gpus"].between(1, g).all()
    if not cfg.cluster.elastic:
        assert (started["gpus"] == cfg.cluster.gpus_per_job).all()
    if cfg.cluster.failure.mtbf_s is None:
        assert (j["status"] == "completed").all()
    if not (cfg.cluster.policy == "priority" and cfg.cluster.preemption):
        assert j["num_preemptions"].sum() == 0
    s = summarize_jobs(r)
    assert s["jobs_completed"] + s["jobs_rejected"] + s["jobs_failed"] == len(jobs)
    assert s["gpu_utilization"] != s["gpu_utilization"] or 0 <= s["gpu_utilization"] <= 1 + 1e-9


@settings(**{**SETTINGS, "max_examples": max(5, EXAMPLES // 4)})
@given(pools())
def test_same_seed_same_outputs(case):
    cfg, jobs = case
    a, b = simulate_diffusion(cfg, jobs), simulate_diffusion(cfg, jobs)
    pd.testing.assert_frame_equal(a.jobs, b.jobs)
    pd.testing.assert_frame_equal(a.nodes, b.nodes)
