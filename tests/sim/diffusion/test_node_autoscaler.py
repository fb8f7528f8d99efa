"""The autoscaler on diffusion nodes (``sim.diffusion.node_fleet``): nodes start after the
delay and only then take gangs, drain (no new gang, the running ones finish) and stop at their
last gang's end; every job completes; the GPU-hours follow the nodes billed; a count held
fixed changes nothing; the SLO policy reads job latencies; bad settings name their field."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from scipy.stats import chisquare

from scenarios.diffusion import ARRIVALS, build_jobs, job_rng
from scenarios.workload import open_loop_arrivals
from sim.config.autoscaler import AutoscalerConfig, check_autoscaler
from sim.diffusion.memory import pipeline_bytes
from sim.diffusion.run import simulate_diffusion
from sim.engine.autoscaler import DRAINING, OFF, READY, STARTING, state_seconds
from sim.errors import ConfigError
from tests.sim.diffusion.test_pool import config, jobs_at

# 400 steps of 100 ms on 8 GPUs (linear): 5 s a job on a whole node
JOB_S = 5.0
SCALER = dict(policy="queue", target=2.0, min_replicas=1, max_replicas=4, interval_s=5.0,
              provision_s=10.0, engine_start_s=5.0, scale_down_stabilization_s=0.0)


def scaled(nodes=1, **autoscaler):
    cfg = config(nodes=nodes, autoscaler=AutoscalerConfig(**{**SCALER, **autoscaler}))
    check_autoscaler(cfg.cluster, nodes=True)
    return cfg


def burst(n=40, spread_s=2.0):
    return jobs_at(np.linspace(0.0, spread_s, n), steps=400)


def states(rec) -> pd.DataFrame:
    return pd.DataFrame(rec.meta["autoscaler"]["log"], columns=["time_s", "node", "state"])


def stretches(log: pd.DataFrame, node: int, state: int) -> list[tuple[float, float]]:
    """(start, end) of each stretch node ``node`` spent in ``state``."""
    mine = log[log["node"] == node].reset_index(drop=True)
    ends = [*mine["time_s"].iloc[1:], np.inf]
    return [(t, e) for t, s, e in zip(mine["time_s"], mine["state"], ends, strict=True)
            if s == state]


@pytest.fixture(scope="module")
def burst_run():
    return simulate_diffusion(scaled(), burst())


def test_nodes_serve_only_once_ready_and_drain_before_they_stop(burst_run):
    rec = burst_run
    jobs, log = rec.jobs, states(rec)
    assert (jobs["status"] == "completed").all()  # none lost in a drain
    assert rec.meta["autoscaler"]["scale_up_delay_s"] == 15.0  # 10 + 0 bytes + 5, by hand
    started = log[(log["state"] == STARTING) & (log["time_s"] > 0)]
    assert len(started) == 3 and (started["time_s"] == 5.0).all()  # queue 35 / 2 → 4 nodes
    assert set(log[log["state"] == READY]["time_s"].round(9)) >= {0.0, 20.0}
    for node in range(4):
        ready = stretches(log, node, READY)
        mine = jobs[jobs["node"] == node]
        # every gang began while its node was ready (up to the instant of a drain: the
        # events before the evaluation in that instant)
        for start in mine["start_s"]:
            assert any(a <= start <= b for a, b in ready), (node, start)
        for a, b in stretches(log, node, DRAINING):  # it finished what it held, then off
            held = mine[(mine["start_s"] <= a) & (mine["completion_s"] > a)]
            end = held["completion_s"].max() if len(held) else a
            assert b == pytest.approx(end)
            assert log[(log["node"] == node) & (log["time_s"] == b)]["state"].iloc[-1] == OFF
    assert (log["state"] == DRAINING).sum() >= 3  # the burst over, back to one node


def test_gpu_hours_follow_the_nodes_billed(burst_run):
    m, end = burst_run.meta, burst_run.meta["sim_time_s"]
    billed = state_seconds(m["autoscaler"]["log"], (STARTING, READY, DRAINING), 0.0, end)
    assert m["autoscaler"]["gpu_hours"] == pytest.approx(billed * 8 / 3600)
    assert m["autoscaler"]["gpu_hours"] < 4 * 8 * end / 3600  # not every node all along
    assert m["num_nodes"] == 4  # the pool is built at max_replicas


def test_a_count_held_fixed_changes_nothing():
    jobs = jobs_at(np.cumsum(np.random.default_rng(3).exponential(3.0, 60)), steps=400)
    fixed = simulate_diffusion(config(nodes=2), jobs)
    held = simulate_diffusion(scaled(nodes=2, min_replicas=2, max_replicas=2), jobs)
    pd.testing.assert_frame_equal(fixed.jobs, held.jobs)
    assert held.meta["autoscaler"]["scale_ups"] == 0


def test_the_slo_policy_reads_job_latencies():
    """Jobs of 5 s against a 4 s bound: every completion breaks it, so the count grows one
    node per evaluation (a start counts as the one more) until the bound of max_replicas."""
    rec = simulate_diffusion(scaled(policy="slo", slo_latency_ms=4000.0, slo_window_s=30.0,
                                    engine_start_s=0.0, provision_s=1.0), burst(60, 30.0))
    log = states(rec)
    assert (rec.jobs["status"] == "completed").all()
    ups = log[(log["state"] == STARTING) & (log["time_s"] > 0)]["time_s"].tolist()
    assert ups[:3] == [5.0, 10.0, 15.0]  # one at a time: each ready 1 s later


def test_a_new_node_reads_every_pipelines_weights():
    """FLUX.1-dev: a 12B DiT, T5-XXL's 4.76B encoder and CLIP-L's 123M, bf16 (its model
    card and diffusers' configs): about 33.8 GB a GPU, and the VAE decoder's 50M."""
    from sim.diffusion.shapes import Pipelines

    flux = Pipelines()("flux1_dev")
    assert pipeline_bytes(flux) == pytest.approx(2 * (11.9e9 + 4.76e9 + 0.123e9 + 0.05e9),
                                                 rel=0.03)


@pytest.mark.parametrize("change, field", [
    (dict(policy="kv_usage", target=0.5), "cluster.autoscaler.policy"),
    (dict(policy="slo", slo_ttft_ms=500.0), "cluster.autoscaler.slo_latency_ms"),
    (dict(max_replicas=2), "cluster.nodes"),
])
def test_a_bad_node_autoscaler_names_its_field(change, field):
    c = dataclasses.replace(config(nodes=3).cluster,
                            autoscaler=AutoscalerConfig(**{**SCALER, **change}))
    with pytest.raises(ConfigError) as e:
        check_autoscaler(c, nodes=True)
    assert e.value.field == field


def test_diffusion_jobs_follow_a_rate_profile():
    """Jobs drawn over a rate profile: the LLM requests' process on the job stream, with the
    profile's count per hour (chi-square on 6 hours of 200 s)."""
    from scenarios.config import WorkloadConfig
    from scenarios.rate_profile import RateProfileConfig

    hourly = [0.2, 0.5, 1.0, 1.0, 0.6, 0.3]
    w = WorkloadConfig(kind="diffusion", arrival="poisson", rate=2.0, model="flux1_dev",
                       rate_profile=RateProfileConfig(hour_s=200.0, hourly=hourly))
    jobs = build_jobs(w, "flux1_dev", seed=4)
    assert np.array_equal(jobs["arrival_time_s"],
                          open_loop_arrivals(w, job_rng(4, ARRIVALS)))
    counts = np.bincount((jobs["arrival_time_s"] // 200).astype(int), minlength=6)
    expected = np.array(hourly) * 2.0 * 200
    assert chisquare(counts, expected * counts.sum() / expected.sum()).pvalue > 1e-3


def test_the_library_call_checks_the_node_autoscaler():
    """``simulate_diffusion`` (no CLI validation before it) refuses an autoscaler that cannot
    resize the pool, naming the field, instead of running on a clipped pool."""
    bad = dataclasses.replace(config(nodes=3).cluster,
                              autoscaler=AutoscalerConfig(**{**SCALER, "max_replicas": 2}))
    with pytest.raises(ConfigError) as e:
        simulate_diffusion(config(nodes=3, autoscaler=bad.autoscaler), burst(4))
    assert e.value.field == "cluster.nodes"
