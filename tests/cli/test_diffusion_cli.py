"""End-to-end runs of ``python -m sim`` on diffusion clusters: the issue's single-video
example, an image stream under a priority policy, a mixed LLM + diffusion cluster, one day of
the Alibaba trace; and a Ctrl-C that keeps what was simulated."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from sim.config.cluster import ClusterConfig
from sim.config.diffusion_cluster import DiffusionJobCostConfig
from sim.diffusion.run import simulate_diffusion

SHARED = Path(__file__).resolve().parents[3] / "shared"
ALIBABA = SHARED / "traces" / "alibaba_t2i_diffusion.csv"
VIDEO = ["workload=diffusion", "model=hunyuan_video", "workload.height=720",
         "workload.width=1280", "workload.frames=129", "workload.steps=50",
         "workload.num_requests=1", "cluster=diffusion", "cluster.parallel.ulysses=8",
         "hardware=h100_sxm"]
JOB_KEYS = ("jobs_per_hour", "images_per_hour", "videos_per_hour", "gpu_utilization",
            "mean_steps_per_s", "median_steps_per_s", "num_job_preemptions",
            "num_job_restarts", "jobs_completed", "jobs_rejected", "jobs_failed",
            *(f"{s}_{m}" for m in ("job_latency_s", "job_queue_s", "job_service_s")
              for s in ("mean", "median", "p90", "p99")))


@pytest.fixture(scope="module")
def runs(tmp_path_factory, sim_cli):
    """Every run of this module, once, in parallel."""
    cwd = tmp_path_factory.mktemp("diffusion_cli")
    jobs = {
        "video": VIDEO,
        "images": ["workload=diffusion", "model=flux1_dev", "cluster=diffusion",
                   "workload.num_requests=60", "workload.rate=0.6", "cluster.nodes=1",
                   "cluster.policy=priority", "cluster.job_cost.name=constant",
                   "cluster.job_cost.step_ms=400", "plots=false",
                   "workload.priority_classes=[{name: paid, weight: 1, priority: 0},"
                   "{name: free, weight: 3, priority: 1}]"],
        "mixed": ["workload=mixed", "cluster=mixed", "workload.num_requests=200",
                  "plots=false"],
        "video_defaults": ["workload=diffusion", "model=hunyuan_video", "cluster=diffusion",
                           "workload.num_requests=1", "plots=false"],
        "video_as_image": ["workload=diffusion", "model=hunyuan_video", "cluster=diffusion",
                           "workload.num_requests=1", "workload.frames=1", "plots=false"],
        "mixed_llm_jobs": ["workload=mixed", "cluster=mixed", "workload.model=llama3_8b",
                           "workload.num_requests=20", "plots=false"],
        "day": ["workload=diffusion_diurnal", "model=flux1_dev",
                "cluster=diffusion_autoscaled", "workload.rate_profile.hour_s=30",
                "cluster.autoscaler.interval_s=5", "cluster.autoscaler.provision_s=5",
                "cluster.autoscaler.scale_down_stabilization_s=30"],
    }
    if ALIBABA.is_file():
        jobs["alibaba"] = ["workload=alibaba_t2i", "cluster=diffusion", "cluster.nodes=16",
                           f"workload.trace_path={ALIBABA}", "plots=false"]
    return sim_cli.run_many(jobs, cwd)


def test_the_issues_single_video_run(runs):
    run = runs["video"]
    assert run.returncode == 0, run.describe()
    jobs = pd.read_parquet(run.outdir / "jobs.parquet")
    assert len(jobs) == 1
    j = jobs.iloc[0]
    assert j["status"] == "completed" and j["gpus"] == 8 and j["plan"] == "ulysses8"
    assert (j["height"], j["width"], j["frames"], j["steps"]) == (720, 1280, 129, 50)
    assert j["completion_s"] - j["arrival_s"] == pytest.approx(j["service_s"])
    s = json.loads((run.outdir / "summary.json").read_text())
    for key in JOB_KEYS:
        assert key in s, key
    assert s["completed"] == s["jobs_completed"] == 1 and s["videos_per_hour"] > 0
    assert s["partial"] is False and s["cluster"] == "diffusion"
    for name in ("jobs.parquet", "nodes.parquet", "job_latency_ecdf.png",
                 "node_occupancy.png"):
        assert name in s["outputs"] and (run.outdir / name).is_file()
    nodes = pd.read_parquet(run.outdir / "nodes.parquet")
    assert nodes["busy_gpus"].max() == 8


def test_a_video_pipeline_runs_its_own_default_shape(runs):
    # workload=diffusion leaves size, frames and steps at 0: HunyuanVideo's 720p clip
    run = runs["video_defaults"]
    assert run.returncode == 0, run.describe()
    j = pd.read_parquet(run.outdir / "jobs.parquet").iloc[0]
    assert (j["height"], j["width"], j["frames"], j["steps"]) == (720, 1280, 129, 50)
    assert j["status"] == "completed" and j["gpus"] == 8
    assert "video pipeline" not in run.stdout + run.stderr


def test_a_video_pipeline_asked_for_one_frame_makes_an_image_and_says_so(runs):
    run = runs["video_as_image"]
    assert run.returncode == 0, run.describe()
    assert "workload.frames=1: hunyuan_video is a video pipeline" in run.stdout + run.stderr
    j = pd.read_parquet(run.outdir / "jobs.parquet").iloc[0]
    assert (j["height"], j["width"], j["frames"]) == (720, 1280, 1)
    s = json.loads((run.outdir / "summary.json").read_text())
    assert s["images_per_hour"] > 0 and s["videos_per_hour"] == 0


def test_an_llm_as_the_jobs_pipeline_of_a_mixed_cluster_fails_before_the_memory_plan(runs):
    run = runs["mixed_llm_jobs"]
    assert run.returncode == 2, run.describe()
    assert run.stderr.strip().startswith("error: workload.model='llama3_8b'"), run.describe()
    assert "num_gpu_blocks" not in run.stdout + run.stderr
    log = run.outdir / "app.log"
    assert not log.is_file() or "num_gpu_blocks" not in log.read_text()


def test_an_image_stream_with_priority_classes(runs):
    run = runs["images"]
    assert run.returncode == 0, run.describe()
    jobs = pd.read_parquet(run.outdir / "jobs.parquet")
    assert len(jobs) == 60 and (jobs["status"] == "completed").all()
    assert set(jobs["class"]) == {"paid", "free"}
    wait = (jobs["start_s"] - jobs["arrival_s"]).groupby(jobs["class"]).mean()
    assert wait["paid"] < wait["free"]
    s = json.loads((run.outdir / "summary.json").read_text())
    assert s["num_job_preemptions"] == int(jobs["num_preemptions"].sum()) > 0
    assert 0 < s["gpu_utilization"] <= 1


def test_a_mixed_cluster_writes_both_tables_and_both_metrics(runs):
    run = runs["mixed"]
    assert run.returncode == 0, run.describe()
    requests = pd.read_parquet(run.outdir / "requests.parquet")
    jobs = pd.read_parquet(run.outdir / "jobs.parquet")
    assert len(requests) == 200 and len(jobs) == 8  # 200 requests × 0.2 / 5 jobs
    s = json.loads((run.outdir / "summary.json").read_text())
    assert s["completed"] == 200 and s["jobs_completed"] == 8
    assert s["mean_ttft_ms"] > 0 and s["mean_job_latency_s"] > 0
    assert "Serving Benchmark Result" in run.stdout and "Diffusion Serving" in run.stdout


@pytest.mark.skipif(not ALIBABA.is_file(), reason="../shared/traces (Alibaba trace) absent")
def test_a_day_of_the_alibaba_trace_on_16_nodes(runs):
    run = runs["alibaba"]
    assert run.returncode == 0, run.describe()
    jobs = pd.read_parquet(run.outdir / "jobs.parquet")
    assert len(jobs) > 100 and (jobs["status"] == "completed").all()
    s = json.loads((run.outdir / "summary.json").read_text())
    assert s["images_per_hour"] >= s["jobs_per_hour"] > 0


def test_ctrl_c_keeps_what_was_simulated():
    class StopAfter:
        def __init__(self, n):
            self.left = n

        def update(self, k):
            self.left -= k
            if self.left <= 0:
                raise KeyboardInterrupt

    cost = DiffusionJobCostConfig(name="constant", step_ms=100.0)
    cfg = SimpleNamespace(cluster=ClusterConfig(kind="diffusion", job_cost=cost),
                          hardware=SimpleNamespace(gpus_per_node=8), seed=0,
                          check_invariants=False)
    n = 50
    jobs = pd.DataFrame({"arrival_time_s": np.arange(n, dtype=float), "model": "flux1_dev",
                         "height": 1024, "width": 1024, "frames": 1, "steps": 10,
                         "images": 1, "guidance": "", "priority": 0})
    r = simulate_diffusion(cfg, jobs, progress=StopAfter(10))
    assert r.partial and r.meta["interrupted_at_sim_s"] < n
    assert (r.jobs["status"] == "completed").sum() == 10
    assert r.jobs["status"].isin(["pending", "queued", "running", "completed"]).all()


def test_an_autoscaled_day_of_diffusion_jobs_bills_its_nodes(runs):
    """workload=diffusion_diurnal on cluster=diffusion_autoscaled over a compressed day: nodes
    start and drain (replicas.parquet), summary.json has the GPU-hours of the nodes billed
    and each hour's nodes and job latency, and day.png draws them."""
    run = runs["day"]
    assert run.returncode == 0, run.describe()
    s = json.loads((run.outdir / "summary.json").read_text())
    states = pd.read_parquet(run.outdir / "replicas.parquet")
    assert set(states["state"]) == {"off", "starting", "ready", "draining"}
    assert s["scale_ups"] >= 1 and s["drains"] >= 1 and s["peak_replicas"] > 1
    assert s["cost"] == pytest.approx(s["gpu_hours"] * 3.0)
    assert s["jobs_completed"] == s["completed"] > 0 and s["jobs_failed"] == 0
    hourly = s["hourly"]
    assert len(hourly) >= 24 and {"mean_latency_s", "p99_latency_s", "replicas"} <= set(
        hourly[12])
    assert sum(h["gpu_hours"] for h in hourly) == pytest.approx(s["gpu_hours"], rel=1e-6)
    assert sum(h["arrivals"] for h in hourly) == s["jobs_completed"]
    assert "Mean / peak nodes" in run.stdout and "jobs/s" in run.stdout
    for name in ("replicas.parquet", "day.png"):
        assert name in s["outputs"] and (run.outdir / name).is_file()
