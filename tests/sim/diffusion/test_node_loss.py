"""Diffusion node loss mid-job (``cluster.failure`` for nodes): with checkpointing a job
restarts from its last completed step, else from the start; retry limits and permanent loss
end jobs as failed with a reason; every job ends completed, rejected or failed."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from analysis.diffusion_metrics import summarize_jobs
from sim.config.cluster import ClusterConfig, FailureConfig
from sim.config.diffusion_cluster import DiffusionJobCostConfig
from sim.diffusion.run import simulate_diffusion


def config(nodes=1, checkpointing=False, mtbf_s=None, mttr_s=60.0, max_retries=None):
    cost = DiffusionJobCostConfig(name="constant", step_ms=800.0, encode_ms=1000.0,
                                  decode_ms=800.0)
    c = ClusterConfig(kind="diffusion", nodes=nodes, job_cost=cost, checkpointing=checkpointing,
                      failure=FailureConfig(mtbf_s=mtbf_s, mttr_s=mttr_s,
                                            max_retries=max_retries))
    return SimpleNamespace(cluster=c, hardware=SimpleNamespace(gpus_per_node=8), seed=0,
                           check_invariants=True)


def jobs_at(times, steps=50) -> pd.DataFrame:
    n = len(times)
    return pd.DataFrame({"arrival_time_s": np.asarray(times, float), "model": "flux1_dev",
                         "height": 1024, "width": 1024, "frames": 1, "steps": steps,
                         "images": 1, "guidance": "", "priority": 0}, index=range(n))


def fail_at(monkeypatch, schedule):
    """Make the pool's node failures happen at the given (gap to failure, ...) draws: each
    node's stream returns these gaps in order (then never again)."""
    import sim.diffusion.pool as pool

    class Fixed:
        def __init__(self, *_):
            self.gaps = list(schedule)

        def exponential(self, _mean):
            return self.gaps.pop(0) if self.gaps else 1e12

    monkeypatch.setattr(pool.np.random, "default_rng", Fixed)


# One job of 1 s encode + 50 steps of 0.1 s + 0.1 s decode (8 GPUs) starts at 0; its node
# fails at 3.25 s (in step 23: 22 steps done) and is back 2 s later (5.25 s).
@pytest.mark.parametrize("checkpointing, expected_end", [
    (True, 5.25 + 28 * 0.1 + 0.1),        # resumes at step 23, without re-encoding
    (False, 5.25 + 1.0 + 50 * 0.1 + 0.1),  # starts over
])
def test_a_job_on_a_failed_node_restarts_from_its_last_step_or_from_the_start(
        monkeypatch, checkpointing, expected_end):
    fail_at(monkeypatch, [3.25])
    cfg = config(checkpointing=checkpointing, mtbf_s=100.0, mttr_s=2.0)
    r = simulate_diffusion(cfg, jobs_at([0.0]))
    j = r.jobs.iloc[0]
    assert j["status"] == "completed" and j["num_restarts"] == 1
    assert j["completion_s"] == pytest.approx(expected_end)
    assert j["first_step_s"] == pytest.approx(1.0)
    assert j["service_s"] == pytest.approx(3.25 + expected_end - 5.25)
    assert r.meta["num_node_failures"] == 1
    down = r.nodes[~r.nodes["up"]]
    assert len(down) == 1 and down["busy_gpus"].iloc[0] == 0


def test_a_job_moves_to_a_node_that_is_up():
    fail_at(monkeypatch := pytest.MonkeyPatch(), [3.25])
    try:
        cfg = config(nodes=2, checkpointing=True, mtbf_s=100.0, mttr_s=50.0)
        r = simulate_diffusion(cfg, jobs_at([0.0]))
    finally:
        monkeypatch.undo()
    j = r.jobs.iloc[0]
    # both nodes draw the same gaps here: node 1 fails at 3.25 s too, so the job waits for
    # the first repair at 53.25 s
    assert j["completion_s"] == pytest.approx(53.25 + 28 * 0.1 + 0.1)


def test_retries_exhausted_and_no_node_left_end_jobs_as_failed(monkeypatch):
    fail_at(monkeypatch, [3.25, 1.0])
    r = simulate_diffusion(config(mtbf_s=100.0, mttr_s=2.0, max_retries=0), jobs_at([0.0]))
    assert r.jobs["status"].tolist() == ["failed"]
    assert r.jobs["fail_reason"].tolist() == ["retries_exhausted"]
    # a node lost for good: the running job and the ones waiting or still to come fail
    fail_at(monkeypatch, [3.25])
    r = simulate_diffusion(config(mtbf_s=100.0, mttr_s=None), jobs_at([0.0, 1.0, 10.0]))
    assert r.jobs["status"].tolist() == ["failed"] * 3
    assert set(r.jobs["fail_reason"]) == {"no_node_left"}
    s = summarize_jobs(r)
    assert s["jobs_failed"] == 3 and s["jobs_failed_reasons"] == {"no_node_left": 3}


@pytest.mark.parametrize("checkpointing", [True, False])
def test_every_job_ends_under_random_node_failures(checkpointing):
    cfg = config(nodes=3, checkpointing=checkpointing, mtbf_s=20.0, mttr_s=5.0,
                 max_retries=3)
    rng = np.random.default_rng(1)
    jobs = jobs_at(np.cumsum(rng.exponential(2.0, 150)), steps=rng.integers(5, 60, 150))
    r = simulate_diffusion(cfg, jobs)
    j = r.jobs
    assert j["status"].isin(["completed", "failed"]).all()
    assert (j.loc[j["status"] == "failed", "fail_reason"] == "retries_exhausted").all()
    assert r.meta["num_node_failures"] > 0 and j["num_restarts"].sum() > 0
    s = summarize_jobs(r)
    assert s["jobs_completed"] + s["jobs_rejected"] + s["jobs_failed"] == len(jobs)
    assert s["num_job_restarts"] == int(j["num_restarts"].sum())
    assert 0 < s["node_availability"] < 1
    # a count, as docs/metrics.md says
    assert type(s["pool_invariant_checks"]) is int and s["pool_invariant_checks"] > len(jobs)


def test_checkpointing_saves_work():
    rng = np.random.default_rng(2)
    jobs = jobs_at(np.cumsum(rng.exponential(3.0, 120)), steps=60)
    service = {}
    for ckpt in (True, False):
        r = simulate_diffusion(config(nodes=2, checkpointing=ckpt, mtbf_s=15.0, mttr_s=3.0),
                               jobs)
        assert (r.jobs["status"] == "completed").all()
        service[ckpt] = r.jobs["service_s"].sum()
    assert service[True] < service[False]


def test_the_failure_that_ends_a_job_is_not_a_restart(monkeypatch):
    # max_retries=1: the failure at 3.25 s restarts the job (repaired at 5.25 s); the next,
    # 1 s after the repair, ends it: one restart, not two
    fail_at(monkeypatch, [3.25, 1.0])
    r = simulate_diffusion(config(mtbf_s=100.0, mttr_s=2.0, max_retries=1), jobs_at([0.0]))
    j = r.jobs.iloc[0]
    assert (j["status"], j["fail_reason"], j["num_restarts"]) == ("failed",
                                                                  "retries_exhausted", 1)
    assert summarize_jobs(r)["num_job_restarts"] == 1
    # the last node lost for good: the running job fails, never restarted
    fail_at(monkeypatch, [3.25])
    r = simulate_diffusion(config(mtbf_s=100.0, mttr_s=None), jobs_at([0.0, 1.0]))
    assert r.jobs["fail_reason"].tolist() == ["no_node_left"] * 2
    assert r.jobs["num_restarts"].tolist() == [0, 0]
