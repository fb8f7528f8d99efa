"""End-to-end runs of ``python -m sim`` that should succeed: files, metrics, determinism,
sweeps, every workload, model/hardware/cost-model switches and max_model_len rejections."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest

N = 200  # requests of the small runs
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOTS = ("latency_ecdf.png", "timeline.png", "bound_share.png")
LATENCIES = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")
SUMMARY_KEYS = (
    "completed", "rejected", "duration_s", "request_throughput", "output_throughput",
    "total_token_throughput",
    *(f"{stat}_{name}" for name in LATENCIES for stat in ("mean", "median", "p90", "p99")),
)
TIMELINE_COLUMNS = ("batch_size", "scheduled_tokens", "kv_blocks_used", "queue_length",
                    "step_time_s", "bound")
SMALL = [f"workload.num_requests={N}", "plots=false"]
TRACE_ROWS = 30
CONCURRENCY = 4
MAX_MODEL_LEN = 512


def _write_trace(path) -> pd.DataFrame:
    rng = np.random.default_rng(7)
    trace = pd.DataFrame({
        "arrival_time_s": np.round(np.cumsum(rng.exponential(0.2, TRACE_ROWS)), 6),
        "input_tokens": rng.integers(16, 400, TRACE_ROWS),
        "output_tokens": rng.integers(2, 120, TRACE_ROWS),
    })
    trace["arrival_time_s"] -= trace["arrival_time_s"].iloc[0]  # the replay starts at 0
    trace.to_csv(path, index=False)
    return trace


@pytest.fixture(scope="module")
def runs(tmp_path_factory, sim_cli):
    """Every successful run of this module, run once, in parallel."""
    cwd = tmp_path_factory.mktemp("cli_runs")
    trace = _write_trace(cwd / "small_trace.csv")
    jobs = {
        # the slowest first: the only run that writes plots, and the two-job sweep
        "default": [f"workload.num_requests={N}"],
        "multirun": ["-m", "seed=1,2", "workload.num_requests=100", "plots=false",
                     f"hydra.sweep.dir={cwd / 'sweep'}"],
        "default_again": list(SMALL),
        "seed1_slo_none": [*SMALL, "seed=1", "slo=none"],
        "poisson": [*SMALL, "workload=poisson"],
        "gamma": [*SMALL, "workload=gamma"],
        "closed_loop": [*SMALL, "workload=closed_loop", f"workload.concurrency={CONCURRENCY}"],
        "trace": ["plots=false", "workload=trace", "workload.trace_path=small_trace.csv"],
        "diurnal": ["plots=false", "workload=diurnal", "workload.rate_profile.hour_s=2",
                    "workload.rate=4"],
        "autoscaled": ["workload=diurnal", "workload.rate_profile.hour_s=10", "workload.rate=30",
                       "cluster=autoscaled", "cluster.autoscaler.interval_s=2",
                       "cluster.autoscaler.provision_s=5", "cluster.autoscaler.engine_start_s=0",
                       "cluster.autoscaler.scale_down_stabilization_s=20"],
        "llama70b_tp4": [*SMALL, "model=llama3_70b", "cluster.tensor_parallel_size=4"],
        "a100": [*SMALL, "hardware=a100_80g_sxm"],
        "constant": [*SMALL, "cost_model=constant", "cost_model.step_time_ms=5"],
        "random_burst": ["plots=false", "workload=random", "workload.num_requests=100",
                         "workload.random.input_len=256", "workload.random.output_len=16"],
        "reject_all": ["plots=false", f"scheduler.max_model_len={MAX_MODEL_LEN}",
                       "workload.input_tokens=600", "workload.num_requests=50"],
        "reject_some": ["plots=false", f"scheduler.max_model_len={MAX_MODEL_LEN}",
                        "workload.input.dist=uniform", "workload.input.low=100",
                        "workload.input.high=1000", "workload.num_requests=100"],
    }
    out = sim_cli.run_many(jobs, cwd)
    out["trace_csv"] = trace
    out["sweep_dir"] = cwd / "sweep"
    return out


def _ok(run):
    assert run.returncode == 0, run.describe()
    assert "Traceback" not in run.stdout + run.stderr, run.describe()
    assert "error:" not in run.stderr, run.describe()
    return run


def _summary(run_or_dir) -> dict:
    outdir = getattr(run_or_dir, "outdir", run_or_dir)
    return json.loads((outdir / "summary.json").read_text())


def _requests(run) -> pd.DataFrame:
    return pd.read_parquet(run.outdir / "requests.parquet")


# --- 1. the default run -------------------------------------------------------------------


def test_vllm_bench_random_burst_says_so_first(runs):
    # workload=random sends all its requests at once, as vllm bench serve's default
    run = _ok(runs["random_burst"])
    first = run.stdout.split("=====")[0].strip().splitlines()[-1]  # the line before the table
    assert first.startswith("BURST: every one of the requests arrived at once")
    assert re.search(r"Steady state\s+no: BURST", run.stdout)
    s = _summary(run)
    assert s["burst"] is True and s["offered_rate"] is None and s["completed"] == 100
    assert s["steady"] is False and s["overloaded"] is False


def test_default_run_writes_every_file(runs):
    run = _ok(runs["default"])
    for name in ("requests.parquet", "timeline.parquet", "summary.json", ".hydra/config.yaml"):
        assert (run.outdir / name).is_file(), name
    assert "Serving Benchmark Result" in run.stdout


def test_default_run_writes_nonempty_pngs(runs):
    run = _ok(runs["default"])
    for name in PLOTS:
        data = (run.outdir / name).read_bytes()
        assert len(data) > 1000, name
        assert data.startswith(PNG_MAGIC), name


def test_plots_false_writes_no_png(runs):
    run = _ok(runs["default_again"])
    assert not list(run.outdir.glob("*.png"))


def test_summary_has_vllm_metric_names(runs):
    s = _summary(_ok(runs["default"]))
    missing = [k for k in SUMMARY_KEYS if k not in s]
    assert not missing
    for key in SUMMARY_KEYS:
        assert isinstance(s[key], (int, float)), (key, s[key])
    assert s["completed"] > 0
    assert s["median_ttft_ms"] <= s["p90_ttft_ms"] <= s["p99_ttft_ms"]
    assert s["median_e2el_ms"] <= s["p90_e2el_ms"] <= s["p99_e2el_ms"]


def test_default_slo_is_chat_and_gives_goodput(runs):
    s = _summary(_ok(runs["default"]))
    assert "request_goodput" in s and "slo_attainment" in s
    assert 0.0 <= s["slo_attainment"] <= 1.0
    assert 0.0 <= s["request_goodput"] <= s["request_throughput"] + 1e-9
    # the chat SLO (ttft 500 ms, tpot 50 ms) is set in the resolved config of the run
    config = (runs["default"].outdir / ".hydra" / "config.yaml").read_text()
    assert re.search(r"^slo:\n(  .*\n)*  name: chat$", config, re.M), config


def test_slo_none_drops_goodput(runs):
    run = _ok(runs["seed1_slo_none"])
    s = _summary(run)
    assert "request_goodput" not in s
    assert "slo_attainment" not in s
    assert "goodput" not in run.stdout.lower()
    assert s["completed"] + s["rejected"] == N


def test_every_request_is_counted_once(runs):
    run = _ok(runs["default"])
    s, req = _summary(run), _requests(run)
    assert s["completed"] + s["rejected"] == N
    assert len(req) == N
    assert sorted(req["request_id"]) == list(range(N))
    assert set(req["status"]) <= {"completed", "rejected"}
    assert (req["status"] == "completed").sum() == s["completed"]


def test_timeline_columns(runs):
    tl = pd.read_parquet(_ok(runs["default"]).outdir / "timeline.parquet")
    missing = [c for c in TIMELINE_COLUMNS if c not in tl.columns]
    assert not missing
    assert len(tl) > 0
    assert (tl["step_time_s"] > 0).all()
    assert (tl["batch_size"] >= 1).all()
    assert set(tl["bound"].astype(str)) <= {"compute", "memory", "comm", "host"}


def test_num_gpu_blocks_is_logged_on_stdout(runs):
    # Hydra's default job logging writes INFO records to stdout (and to the run dir's log file)
    run = _ok(runs["default"])
    s = _summary(run)
    m = re.search(r"num_gpu_blocks=(\d+)", run.stdout)
    assert m, run.describe()
    assert int(m.group(1)) == s["num_gpu_blocks"] > 0
    assert "num_gpu_blocks" not in run.stderr


def test_printed_table_matches_summary(runs):
    run = _ok(runs["default"])
    s = _summary(run)
    assert re.search(rf"^Completed requests\s+{s['completed']}$", run.stdout, re.M)
    assert re.search(rf"^Rejected requests\s+{s['rejected']}$", run.stdout, re.M)
    assert f"outputs: {run.outdir}" in run.stdout


# --- 2. determinism ----------------------------------------------------------------------


def test_same_seed_same_requests(runs):
    a, b = _requests(_ok(runs["default"])), _requests(_ok(runs["default_again"]))
    pd.testing.assert_frame_equal(a, b)
    ta = pd.read_parquet(runs["default"].outdir / "timeline.parquet")
    tb = pd.read_parquet(runs["default_again"].outdir / "timeline.parquet")
    pd.testing.assert_frame_equal(ta, tb)


def test_other_seed_other_requests(runs):
    a, b = _requests(_ok(runs["default"])), _requests(_ok(runs["seed1_slo_none"]))
    assert len(a) == len(b) == N
    assert not a.equals(b)
    assert not np.array_equal(a["arrival_s"], b["arrival_s"])
    assert _summary(runs["seed1_slo_none"])["seed"] == 1


# --- 3. multirun -------------------------------------------------------------------------


def test_multirun_writes_one_dir_per_job(runs):
    _ok(runs["multirun"])
    sweep = runs["sweep_dir"]
    seeds = []
    for job in ("0", "1"):
        s = _summary(sweep / job)
        assert s["completed"] + s["rejected"] == 100
        assert (sweep / job / "requests.parquet").is_file()
        seeds.append(s["seed"])
    assert seeds == [1, 2]
    a = pd.read_parquet(sweep / "0" / "requests.parquet")
    b = pd.read_parquet(sweep / "1" / "requests.parquet")
    assert not a.equals(b)


# --- 4. workloads ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["poisson", "gamma", "closed_loop"])
def test_synthetic_workloads_run(runs, name):
    run = _ok(runs[name])
    s, req = _summary(run), _requests(run)
    assert s["workload"] == name
    assert s["completed"] + s["rejected"] == len(req) == N
    assert s["completed"] > 0


def test_a_day_of_traffic_is_reported_hour_by_hour(runs):
    """workload=diurnal compressed to 2 s hours: summary.json carries one row per hour, each
    counting the requests that arrived in it, and the run prints them as a table."""
    run = _ok(runs["diurnal"])
    s, req = _summary(run), _requests(run)
    hourly = s["hourly"]  # the day's 24 hours and those the run went on after it
    assert [h["hour"] for h in hourly] == list(range(len(hourly))) and len(hourly) >= 24
    counts = np.bincount((req["arrival_s"] // 2).astype(int), minlength=len(hourly))
    assert [h["arrivals"] for h in hourly] == counts.tolist()
    assert sum(h["completed"] for h in hourly) == s["completed"]
    assert "Hour by hour (by arrival)" in run.stdout and "slo_attainment" in hourly[13]


def test_an_autoscaled_day_writes_its_replicas_and_their_cost(runs):
    """cluster=autoscaled over a compressed day: replicas.parquet holds every state change,
    summary.json the GPU-hours and each hour's replicas, and the cost is GPU-hours × price."""
    run = _ok(runs["autoscaled"])
    s = _summary(run)
    states = pd.read_parquet(run.outdir / "replicas.parquet")
    assert "replicas.parquet" in s["outputs"]
    assert list(states.columns) == ["time_s", "replica", "state"] and len(states) >= 8
    assert s["scale_ups"] >= 1 and s["peak_replicas"] > 1
    assert s["cost"] == pytest.approx(s["gpu_hours"] * 3.0)
    assert sum(h["gpu_hours"] for h in s["hourly"]) == pytest.approx(s["gpu_hours"], rel=1e-6)
    assert "Autoscaler" in run.stdout and "ready_replicas" in run.stdout
    assert (run.outdir / "day.png").read_bytes()[:8] == PNG_MAGIC and "day.png" in s["outputs"]


def test_gamma_arrivals_differ_from_poisson(runs):
    a, b = _requests(_ok(runs["poisson"])), _requests(_ok(runs["gamma"]))
    assert not np.allclose(a["arrival_s"], b["arrival_s"])


def test_closed_loop_never_exceeds_concurrency(runs):
    req = _requests(_ok(runs["closed_loop"]))
    assert set(req["client"]) == set(range(CONCURRENCY))
    arrival = req["arrival_s"].to_numpy()
    completion = req["completion_s"].to_numpy()
    assert np.isfinite(arrival).all() and np.isfinite(completion).all()
    in_system = [int(((arrival <= t) & (t < completion)).sum()) for t in arrival]
    assert max(in_system) <= CONCURRENCY
    assert max(in_system) == CONCURRENCY  # all clients are busy at the start


def test_trace_workload_replays_the_csv(runs):
    run = _ok(runs["trace"])
    trace = runs["trace_csv"]
    s, req = _summary(run), _requests(run)
    assert s["workload"] == "trace"
    assert len(req) == TRACE_ROWS
    assert s["completed"] + s["rejected"] == TRACE_ROWS
    req = req.sort_values("request_id").reset_index(drop=True)
    np.testing.assert_allclose(req["arrival_s"], trace["arrival_time_s"], rtol=0, atol=1e-9)
    np.testing.assert_array_equal(req["input_tokens"], trace["input_tokens"])
    np.testing.assert_array_equal(req["output_tokens"], trace["output_tokens"])


# --- 5. model, hardware and cost-model switches ------------------------------------------


def test_llama3_70b_on_four_gpus(runs):
    run = _ok(runs["llama70b_tp4"])
    s, default = _summary(run), _summary(runs["default"])
    assert s["model"] == "llama3_70b"
    assert s["completed"] + s["rejected"] == N and s["completed"] > 0
    assert 0 < s["num_gpu_blocks"] != default["num_gpu_blocks"]
    assert f"num_gpu_blocks={s['num_gpu_blocks']}" in run.stdout


def test_a100_hardware(runs):
    s, default = _summary(_ok(runs["a100"])), _summary(runs["default"])
    assert s["hardware"] == "a100_80g_sxm"
    assert s["completed"] + s["rejected"] == N and s["completed"] > 0
    assert s["num_gpu_blocks"] != default["num_gpu_blocks"]
    # the same requests take longer on the slower GPU
    assert s["mean_e2el_ms"] > _summary(runs["default_again"])["mean_e2el_ms"]


def test_constant_cost_model_steps_take_step_time(runs):
    run = _ok(runs["constant"])
    s = _summary(run)
    assert s["completed"] + s["rejected"] == N and s["completed"] > 0
    tl = pd.read_parquet(run.outdir / "timeline.parquet")
    np.testing.assert_allclose(tl["step_time_s"], 0.005, rtol=1e-9)
    assert s["mean_step_time_ms"] == pytest.approx(5.0)


# --- 7. requests longer than max_model_len -----------------------------------------------


def test_all_requests_too_long_are_rejected(runs):
    run = runs["reject_all"]  # nothing completed: exit code 1 and the reasons, no table
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.describe()
    s, req = _summary(run), _requests(run)
    assert s["completed"] == 0
    assert s["rejected"] == 50
    assert s["rejected_reasons"] == {"exceeds_max_model_len": 50}
    assert (req["status"] == "rejected").all()
    assert (req["reject_reason"] == "exceeds_max_model_len").all()
    assert ("error: no request completed: 50 rejected (exceeds_max_model_len: 50), 0 failed"
            in run.stderr)
    assert "Serving Benchmark Result" not in run.stdout


def test_some_requests_too_long_are_rejected(runs):
    run = _ok(runs["reject_some"])
    s, req = _summary(run), _requests(run)
    assert len(req) == 100
    assert s["completed"] + s["rejected"] == 100
    assert 0 < s["rejected"] < 100
    assert s["rejected_reasons"] == {"exceeds_max_model_len": s["rejected"]}
    rejected = req[req["status"] == "rejected"]
    completed = req[req["status"] == "completed"]
    assert len(rejected) == s["rejected"] and len(completed) == s["completed"]
    assert (rejected["reject_reason"] == "exceeds_max_model_len").all()
    # vLLM's rule: prompt + max output tokens must fit in the context window
    assert (rejected["input_tokens"] + rejected["output_tokens"] > MAX_MODEL_LEN).all()
    assert (completed["input_tokens"] + completed["output_tokens"] <= MAX_MODEL_LEN).all()
    assert (completed["generated_tokens"] == completed["output_tokens"]).all()
