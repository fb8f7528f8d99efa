"""The compiled event loop (``sim.compiled``) gives the SimPy engine's records to float
rounding, and runs only where it applies."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim import simulate
from sim.errors import ConfigError

FLOAT_COLUMNS = ("arrival_s", "first_scheduled_s", "first_token_s", "completion_s")


def both_engines(cfg, req):
    """Records of ``req`` under ``cfg`` from the SimPy engine and from the compiled loop."""
    out = []
    for engine in ("python", "auto"):
        cfg.engine = engine
        out.append(simulate(cfg, req))
    a, b = out
    assert a.meta["engine"] == "python (engine=python)"
    assert b.meta["engine"] == "compiled"
    return a, b


def assert_same_records(a, b) -> None:
    """Every request column, timeline row, ITL bin and step total equal (floats to 1e-9)."""
    ra, rb = a.requests, b.requests
    assert list(ra.columns) == list(rb.columns)
    for col in ra.columns:
        x, y = ra[col].to_numpy(), rb[col].to_numpy()
        if x.dtype.kind == "f":
            np.testing.assert_allclose(x, y, rtol=1e-9, atol=0, err_msg=col)
        else:
            assert (x == y).all(), col
    assert len(a.timeline) == len(b.timeline)
    for col in a.timeline.columns:
        np.testing.assert_allclose(a.timeline[col].to_numpy(float),
                                   b.timeline[col].to_numpy(float), rtol=1e-9, atol=1e-15,
                                   err_msg=col)
    assert a.itl.count == b.itl.count
    assert abs(int(np.abs(a.itl.counts - b.itl.counts).sum())) <= 2  # a bin edge at 1 ulp
    assert a.itl.total == pytest.approx(b.itl.total, rel=1e-9)
    assert a.meta["sim_time_s"] == pytest.approx(b.meta["sim_time_s"], rel=1e-12)
    for ta, tb in zip(a.meta.get("step_totals", []), b.meta.get("step_totals", []),
                      strict=True):
        assert ta == pytest.approx(tb, rel=1e-9)


def workload(requests, rng, n: int, max_len: int):
    """Bursts and lulls, short and long prompts, a few too long to serve at all."""
    arrivals = np.sort(np.concatenate([rng.uniform(0, 0.05, n // 2),
                                       rng.uniform(0.2, 3.0, n - n // 2)]))
    inputs = rng.integers(1, 300, n)
    outputs = rng.integers(1, 120, n)
    outputs[rng.random(n) < 0.05] = max_len  # exceeds max_model_len: rejected
    return requests(arrivals, inputs, outputs)


CASES = {
    "default": {},
    "kv_pressure": {"num_blocks": 60, "block_size": 4},  # recompute preemption, rejections
    "few_seats": {"max_seqs": 3},
    "small_budget": {"budget": 32},
    "threshold": {"long_prefill_token_threshold": 24},
    "no_chunking": {"enable_chunked_prefill": False, "budget": 400, "max_len": 400},
}


@pytest.mark.parametrize("replicas, router", [(1, "round_robin"), (3, "round_robin"),
                                              (3, "least_outstanding"), (3, "jsq_tokens"),
                                              (3, "kv_aware"), (3, "power_of_two"),
                                              (3, "random"), (3, "prefix_affinity")],
                         ids=["one", "round_robin", "least_outstanding", "jsq_tokens",
                              "kv_aware", "power_of_two", "random",
                              "prefix_affinity_without_ids"])
@pytest.mark.parametrize("timeline", [True, False], ids=["timeline", "totals"])
@pytest.mark.parametrize("case", CASES)
def test_compiled_equals_simpy_engine(tiny_config, requests, case, timeline, replicas, router):
    fields = {"num_blocks": 200, "block_size": 8, "max_seqs": 16, "budget": 256} | CASES[case]
    cfg = tiny_config("vllm", roofline=True, **fields)
    cfg.cluster = replace(cfg.cluster, replicas=replicas, router=router)
    cfg.timeline = timeline
    req = workload(requests, np.random.default_rng(len(case)), 120, cfg.scheduler.max_model_len)
    a, b = both_engines(cfg, req)
    assert_same_records(a, b)
    assert set(a.requests["status"]) <= {"completed", "rejected"}
    if case == "kv_pressure":
        assert a.requests["num_preemptions"].sum() > 0  # the preemption path ran
        assert (a.requests["status"] == "rejected").any()


@pytest.mark.parametrize("think", [0.0, 0.02])
def test_closed_loop_clients_match(tiny_config, requests, think):
    """Clients that send their next request a think time (none: at once) after the previous
    one ends, rejected ones included, and open-loop requests beside them."""
    rng = np.random.default_rng(3)
    n, clients = 150, 6
    client = np.where(np.arange(n) < 130, np.arange(n) % clients, -1)
    first = np.zeros(n, bool)
    first[:clients] = True
    arrivals = np.where(first, rng.uniform(0, 0.02, n), np.nan)
    arrivals[130:] = np.sort(rng.uniform(0, 2.0, 20))  # open loop beside the clients
    outputs = rng.integers(1, 80, n)
    outputs[rng.random(n) < 0.05] = 400  # exceeds max_model_len: rejected, the client goes on
    req = requests(arrivals, rng.integers(1, 200, n), outputs)
    req["client"] = client
    req["think_time_s"] = np.where(client >= 0, think, 0.0)
    cfg = tiny_config("vllm", num_blocks=80, block_size=4, max_seqs=4, budget=128,
                      roofline=True)
    a, b = both_engines(cfg, req)
    assert_same_records(a, b)
    assert (a.requests["status"] == "rejected").any()
    assert a.requests["status"].isin(["completed", "rejected"]).all()


@pytest.mark.parametrize("rejected_first", [True, False])
def test_zero_delay_events_at_one_instant_keep_the_engines_order(tiny_config, requests,
                                                                  rejected_first):
    """At one instant a request wakes the idle replica and a client's request is rejected,
    its follow-up sent at once: the woken replica's batch holds the follow-up only if the
    rejection came first (SimPy runs zero-delay events in the order they were created)."""
    first, rejected = (1, 0) if rejected_first else (0, 1)
    req = requests([np.nan] * 3, [50] * 3, [5] * 3)
    req.loc[[first, rejected], "arrival_time_s"] = 1.0
    req.loc[rejected, "output_tokens"] = 1000  # exceeds max_model_len
    req["client"] = [-1, -1, 0]
    req.loc[rejected, "client"] = 0
    cfg = tiny_config("vllm", roofline=True)
    a, b = both_engines(cfg, req)
    assert_same_records(a, b)
    follow_up = a.requests.loc[2]
    assert follow_up["arrival_s"] == 1.0
    assert (follow_up["first_scheduled_s"] == 1.0) == rejected_first


@pytest.mark.parametrize("router", ["round_robin", "least_outstanding"])
def test_replicas_in_lockstep_keep_the_engines_order(tiny_config, requests, router):
    """Identical requests keep two replicas' steps ending at the same instants; the one that
    started its step first ends it first, which decides where the follow-ups go."""
    n, clients = 80, 8
    req = requests(np.where(np.arange(n) < clients, 0.0, np.nan), np.full(n, 40),
                   np.full(n, 6))
    req["client"] = np.arange(n) % clients
    cfg = tiny_config("vllm", roofline=True, max_seqs=2)
    cfg.cluster = replace(cfg.cluster, replicas=2, router=router)
    a, b = both_engines(cfg, req)
    assert_same_records(a, b)
    tl = a.timeline
    assert tl.duplicated(["time_s"]).sum() > 10  # the replicas did step together


@pytest.mark.parametrize("case", ["follow_ups", "follow_up_and_arrival", "arrival_at_step_end"])
def test_events_due_at_one_time_run_in_creation_order(tiny_config, requests, case):
    """Events due at one float time run in the order they were created, as in SimPy."""
    cfg = tiny_config("vllm", roofline=True, max_seqs=8, budget=16)
    if case == "follow_ups":  # two follow-ups due together, sent in the order of completion
        req = requests([1e-9, 0.0, np.nan, np.nan], [12] * 4, [2, 3, 3, 3])
        req["client"], req["think_time_s"] = [0, 1, 0, 1], 0.5
    elif case == "follow_up_and_arrival":  # the follow-up's event (0.25 s) is the older
        req = requests([0.25, np.nan, 0.5, 1.0], [10] * 4, [1000, 5, 5, 5])
        req["client"], req["think_time_s"] = [0, 0, -1, -1], [0.0, 0.75, 0.0, 0.0]
        cfg.cluster = replace(cfg.cluster, replicas=2)
    else:  # an arrival due when a step ends, its event made before the step began
        cfg.engine = "python"
        tl = simulate(cfg, requests([0.0], [10], [5])).timeline
        req = requests([0.0, tl["time_s"][0] + tl["step_time_s"][0]], [10, 10], [5, 5])
    assert_same_records(*both_engines(cfg, req))


@pytest.mark.parametrize("column, value, row, message", [
    ("arrival_time_s", -1.0, 0, "finite time >= 0"),
    ("arrival_time_s", np.inf, 1, "finite time >= 0"),
    ("think_time_s", -0.1, 1, "finite time >= 0"),
    ("think_time_s", np.nan, 1, "finite time >= 0"),
    ("arrival_time_s", 0.3, 1, "follows its client's previous request"),
    ("arrival_time_s", np.nan, 2, "nothing else releases it"),
])
def test_a_request_table_that_cannot_be_released_is_one_error(tiny_config, requests, column,
                                                               value, row, message):
    req = requests([0.0, np.nan, 0.2], [10] * 3, [5] * 3)
    req["client"] = [0, 0, -1]
    req.loc[row, column] = value
    for engine in ("python", "auto"):
        cfg = tiny_config("vllm", roofline=True)
        cfg.engine = engine
        with pytest.raises(ConfigError, match=message) as err:
            simulate(cfg, req)
        assert err.value.field == f"requests.{column} (row {row})"


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 40), seed=st.integers(0, 2**32 - 1),
       num_blocks=st.integers(30, 300), block_size=st.sampled_from([1, 4, 16]),
       max_seqs=st.integers(1, 12), budget=st.integers(16, 400),
       threshold=st.sampled_from([0, 0, 7, 64]), tp=st.sampled_from([1, 2]),
       clients=st.integers(0, 4), think=st.sampled_from([0.0, 0.01]),
       replicas=st.sampled_from([1, 1, 2, 3]),
       router=st.sampled_from(["round_robin", "least_outstanding", "jsq_tokens",
                               "kv_aware"]),
       scheduler=st.sampled_from(["vllm", "sarathi", "trtllm", "trtllm_max_utilization",
                                  "sglang", "orca", "vllm_priority", "edf"]),
       chunk=st.integers(1, 400), overlap=st.booleans())
def test_compiled_equals_simpy_engine_on_random_runs(tiny_config, requests, n, seed,
                                                     num_blocks, block_size, max_seqs,
                                                     budget, threshold, tp, clients, think,
                                                     replicas, router, scheduler, chunk,
                                                     overlap):
    own = {"vllm": {"long_prefill_token_threshold": threshold},
           "sarathi": {"chunk_size": min(chunk, budget)}, "trtllm": {},
           "sglang": {"chunk_size": chunk}, "orca": {},
           "trtllm_max_utilization": {"capacity_scheduler_policy": "MAX_UTILIZATION"},
           "vllm_priority": {"policy": "priority", "long_prefill_token_threshold": threshold},
           "edf": {"long_prefill_token_threshold": threshold},
           }[scheduler]
    if router in ("jsq_tokens", "kv_aware") and scheduler in ("vllm_priority", "edf"):
        router = "least_outstanding"  # (they run keyed orders on the SimPy engine only)
    cfg = tiny_config(scheduler.split("_")[0], num_blocks=num_blocks, block_size=block_size,
                      max_seqs=max_seqs, budget=budget, roofline=True, **own)
    cfg.cluster = replace(cfg.cluster, tensor_parallel_size=tp, replicas=replicas,
                          router=router)
    cfg.backend = replace(cfg.backend, overlap_scheduler=overlap)
    rng = np.random.default_rng(seed)
    arrivals = np.sort(rng.exponential(0.05, n).cumsum())
    client = np.where(np.arange(n) < clients * 3, np.arange(n) % max(clients, 1), -1)
    arrivals[clients:clients * 3] = np.nan  # each client's 2nd and 3rd request: follow-ups
    outputs = rng.integers(1, 60, n)
    outputs[rng.random(n) < 0.1] = 500  # exceeds max_model_len: rejected
    req = requests(arrivals, rng.integers(1, 200, n), outputs)
    req["client"], req["think_time_s"] = client, np.where(client >= 0, think, 0.0)
    req["priority"] = rng.integers(0, 2, n)  # read by the keyed orders only
    req["ttft_slo_ms"] = rng.choice([20.0, 200.0, np.inf], n)
    assert_same_records(*both_engines(cfg, req))


@pytest.mark.parametrize("overrides", [
    [], ["experiment=vidur_synthetic"],
    ["model=qwen3_30b_a3b", "cluster.tensor_parallel_size=2", "timeline=false"],
    ["workload=closed_loop", "workload.concurrency=48"],
    ["workload=closed_loop", "workload.think_time_s=0.5", "workload.think_time_dist=exponential",
     "workload.ramp_up_s=3"],
    ["workload=multi_turn", "workload.rate=6"],
    ["cluster.replicas=4", "workload.rate=25"],
    ["cluster.replicas=3", "cluster.router=least_outstanding", "workload=closed_loop",
     "workload.concurrency=96", "timeline=false"],
    ["scheduler=sarathi"], ["experiment=vidur_synthetic", "scheduler=sarathi"],
    ["scheduler=sarathi", "scheduler.chunk_size=256", "workload=closed_loop",
     "workload.concurrency=64", "cluster.replicas=2"],
    ["scheduler=trtllm"], ["experiment=vidur_synthetic", "scheduler=trtllm"],
    ["scheduler=trtllm", "scheduler.capacity_scheduler_policy=MAX_UTILIZATION",
     "workload=closed_loop", "workload.concurrency=200"],
    ["scheduler=sglang"], ["experiment=vidur_synthetic", "scheduler=sglang"],
    ["scheduler=sglang", "workload=closed_loop", "workload.concurrency=200",
     "cluster.replicas=2", "cluster.router=least_outstanding"],
    ["scheduler=orca"], ["scheduler=orca", "workload=closed_loop", "workload.concurrency=64"],
    ["workload=two_classes", "scheduler.policy=priority", "workload.rate=12"],
    ["workload=two_classes", "scheduler=edf", "workload.rate=12", "cluster.replicas=2",
     "cluster.router=least_outstanding"],
    ["experiment=vidur_synthetic", "scheduler=edf"],
    ["backend=trtllm", "scheduler=trtllm"],
    ["backend=trtllm", "scheduler=trtllm", "workload=closed_loop", "workload.concurrency=64",
     "cluster.replicas=2", "cluster.router=least_outstanding"],
    ["backend=trtllm", "scheduler=trtllm", "backend.frontend.admission=fifo",
     "workload.rate=20"],
    ["backend.overlap_scheduler=true", "workload=closed_loop", "workload.concurrency=16",
     "backend.frontend.per_request_ms=0", "backend.frontend.per_prompt_token_us=0",
     "backend.frontend.per_output_token_us=0", "backend.frontend.latency_ms=0"],
    ["kv_cache=prefix", "workload=multi_turn"],
    ["kv_cache=prefix", "workload=system_prompt", "cluster.replicas=3",
     "cluster.router=prefix_affinity"],
    ["kv_cache=prefix", "workload=two_classes", "scheduler=edf", "workload.rate=12"],
], ids=["default", "vidur", "moe_tp2", "closed_loop", "closed_loop_think", "multi_turn",
        "replicas_round_robin", "replicas_least_outstanding", "sarathi", "vidur_sarathi",
        "sarathi_closed_loop", "trtllm", "vidur_trtllm", "trtllm_max_utilization", "sglang",
        "vidur_sglang", "sglang_closed_loop", "orca", "orca_closed_loop", "priority_classes",
        "edf_classes_replicas", "vidur_edf", "trtllm_overlap", "trtllm_overlap_closed_loop",
        "trtllm_overlap_fifo_frontend", "overlap_no_frontend_closed_loop", "prefix_multi_turn",
        "prefix_system_prompt_affinity", "prefix_edf_classes"])
def test_compiled_equals_simpy_engine_on_shipped_models(compose_cfg, requests_for, overrides):
    cfg = compose_cfg("workload.num_requests=300", *overrides)
    req = requests_for(cfg)
    out = [simulate(compose_cfg("workload.num_requests=300", f"engine={e}", *overrides), req)
           for e in ("python", "auto")]
    assert out[1].meta["engine"] == "compiled"
    assert_same_records(*out)


@pytest.mark.parametrize("overrides, reason", [
    (["engine=python"], "engine=python"),
    (["cluster=autoscaled", "cluster.router=power_of_two"],
     "router power_of_two with an autoscaler"),
    (["cluster=autoscaled", "kv_cache=prefix"], "prefix caching with an autoscaler"),
    (["cluster.replicas=2", "cluster.router=kv_aware", "scheduler.policy=priority"],
     "router kv_aware with a keyed waiting order (priority)"),
    (["cluster=disagg"], "disaggregated prefill and decode"),
    (["scheduler=static"], "scheduler=static (compiled: orca, vllm, sarathi, trtllm, edf, sglang)"),
    (["kv_cache.prefix_caching=true", "scheduler=sglang"],
     "prefix caching with scheduler=sglang (compiled: vllm, sarathi, trtllm, edf)"),
    (["kv_cache.prefix_caching=true", "kv_cache.cpu_offload_gb=1"],
     "swap, a host tier of the prefix cache, or state blocks"),
    (["cost_model=constant"], "the cost model is not the roofline"),
    (["cluster.pipeline_parallel_size=2"], "pipeline parallelism"),
    (["check_invariants=true"], "check_invariants"),
    (["cluster.failure.mtbf_s=100"], "faults"),
], ids=lambda v: v if isinstance(v, str) else "-".join(v))
def test_other_configurations_run_on_the_simpy_engine(compose_cfg, requests_for, overrides,
                                                       reason):
    cfg = compose_cfg("workload.num_requests=20", *overrides)
    rec = simulate(cfg, requests_for(cfg))
    assert rec.meta["engine"] == f"python ({reason})"


def test_raw_itl_samples_run_on_the_simpy_engine(compose_cfg, requests_for):
    cfg = compose_cfg("workload.num_requests=20")
    rec = simulate(cfg, requests_for(cfg), keep_itl_samples=True)
    assert rec.meta["engine"] == "python (keep_itl_samples)"


def test_an_unknown_engine_is_one_config_error(compose_cfg, requests_for):
    cfg = compose_cfg("workload.num_requests=5", "engine=numba")
    with pytest.raises(ConfigError, match="engine"):
        simulate(cfg, requests_for(cfg))


def test_ctrl_c_keeps_what_was_simulated(compose_cfg, requests_for):
    """A KeyboardInterrupt from the progress bar ends the run between two chunks with
    consistent partial records."""
    cfg = compose_cfg("workload.num_requests=5000", *(  # the engine's clock alone
        f"backend.frontend.{k}=0" for k in ("per_request_ms", "per_prompt_token_us",
                                            "per_output_token_us", "latency_ms")))

    class Interrupting:
        def update(self, n):
            raise KeyboardInterrupt

    rec = simulate(cfg, requests_for(cfg), progress=Interrupting())
    assert rec.meta["engine"] == "compiled" and rec.partial
    r = rec.requests
    done = r["status"] == "completed"
    assert 0 < done.sum() < len(r)
    assert r.loc[done, "completion_s"].max() <= rec.meta["interrupted_at_sim_s"]
    assert r.loc[~done, "completion_s"].isna().all()
    # the steps run so far, each once: the first rows of the whole run's timeline (those
    # still waiting for a full chunk are handed over too)
    tl, whole = rec.timeline, simulate(cfg, requests_for(cfg)).timeline
    assert 0 < len(tl) < len(whole)
    assert tl["time_s"].max() <= rec.meta["interrupted_at_sim_s"]
    pd.testing.assert_frame_equal(tl, whole.iloc[: len(tl)])
