"""The API server in front of each replica (``sim.engine.frontend``): admissions (one by one, or
one instant's arrivals together) and streamed steps whose time adds to what clients see, not to
engine time."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim import simulate
from sim.builders import build_frontend_costs, check_config
from sim.engine.frontend import FrontendCosts, FrontendServer
from sim.errors import ConfigError


def md1_mean_sojourn(service_s: float, rho: float) -> float:
    """Mean time in an M/D/1 system: S + ρS / (2(1 − ρ))."""
    return service_s + rho * service_s / (2 * (1 - rho))


def test_frontend_alone_is_an_md1_queue(compose_cfg, requests_for):
    """Poisson requests, a fixed admission time D and an engine that takes no time to speak
    of: the time from send to engine is an M/D/1 sojourn."""
    cfg = compose_cfg("cost_model=constant", "cost_model.step_time_ms=0.001",
                      "workload=poisson", "workload.rate=70", "workload.num_requests=60000",
                      "workload.input_tokens=100", "workload.output_tokens=1", "seed=2",
                      "backend.frontend.per_request_ms=10")
    r = simulate(cfg, requests_for(cfg, 2)).requests
    in_frontend = (r["engine_arrival_s"] - r["arrival_s"]).mean()
    assert in_frontend == pytest.approx(md1_mean_sojourn(0.010, 0.7), rel=0.03)


def test_one_request_through_the_frontend_by_hand(compose_cfg):
    """3 ms to admit, 2 ms to the engine, 10 ms steps, 1 ms to stream each token."""
    cfg = compose_cfg("cost_model=constant", "cost_model.step_time_ms=10",
                      "backend.frontend.per_request_ms=3", "backend.frontend.latency_ms=2",
                      "backend.frontend.per_output_token_us=1000")
    req = pd.DataFrame({"arrival_time_s": [0.0], "input_tokens": [50], "output_tokens": [5],
                        "client": [-1], "think_time_s": [0.0]})
    r = simulate(cfg, req).requests.iloc[0]
    assert r["engine_arrival_s"] == pytest.approx(0.005)
    assert r["first_scheduled_s"] == pytest.approx(0.005)
    assert r["first_token_s"] == pytest.approx(0.016)  # prefill step ends at 15 ms, + 1 ms
    assert r["completion_s"] == pytest.approx(0.056)  # four more 10 ms steps


def test_streaming_delays_admissions_behind_it():
    """One server: an admission sent while a step's tokens stream waits for them."""
    costs = FrontendCosts.from_units(per_request_ms=1, per_output_token_us=100)
    server = FrontendServer(costs, costs.service_times(np.array([10, 10])), np.zeros(2))
    assert server.stream(1.0, 50) == pytest.approx(1.005)
    assert server.admit(0, 1.001) == pytest.approx(1.006)  # behind the 5 ms of streaming
    assert server.stream(2.0, 0) == 2.0  # a step that sampled nothing streams nothing


def test_a_streaming_process_of_its_own_neither_delays_nor_waits_for_admissions():
    """SGLang's detokenizer runs in its own process: an admission sent while a step's tokens
    stream is not delayed, a step's tokens do not wait behind a burst's admissions, and
    the streamed steps queue among themselves."""
    costs = FrontendCosts.from_units(per_request_ms=1, per_output_token_us=100,
                                     streaming="own_process")
    server = FrontendServer(costs, costs.service_times(np.full(50, 10)), np.zeros(50))
    assert server.stream(1.0, 50) == pytest.approx(1.005)
    assert server.admit(0, 1.001) == pytest.approx(1.002)  # not behind the streaming
    for rid in range(1, 50):  # a burst of 49: the server admits until 1.051
        server.admit(rid, 1.002)
    assert server.stream(1.003, 10) == pytest.approx(1.006)  # behind the first stream only
    assert server.busy_until == pytest.approx(1.051)
    shared = FrontendCosts.from_units(per_request_ms=1, per_output_token_us=100)
    one = FrontendServer(shared, shared.service_times(np.full(50, 10)), np.zeros(50))
    for rid in range(50):
        one.admit(rid, 1.0)
    assert one.stream(1.003, 10) == pytest.approx(1.051)  # one server: behind the burst


def test_frontend_costs_come_from_the_config_or_the_calibrated_file(compose_cfg):
    cfg = compose_cfg("backend.frontend.per_request_ms=4")
    costs = build_frontend_costs(cfg)
    assert costs.per_request_s == pytest.approx(0.004)
    constant = build_frontend_costs(compose_cfg("cost_model=constant"))
    assert constant.is_wire  # queueing-theory runs: only what the config sets
    assert not constant.interleaved
    assert costs.interleaved  # the calibrated file's admission
    assert not build_frontend_costs(compose_cfg("backend.frontend.admission=fifo")).interleaved
    assert not costs.own_stream_process  # vLLM's API server streams
    assert build_frontend_costs(compose_cfg("backend=sglang")).own_stream_process
    assert not build_frontend_costs(compose_cfg("backend=sglang",
                                                "backend.frontend.streaming=shared")
                                    ).own_stream_process


@pytest.mark.parametrize("admission", ["fifo", "interleaved"])
@pytest.mark.parametrize("rate", ["20", "inf"])
def test_replica_failures_keep_every_request_through_the_frontend(compose_cfg, requests_for,
                                                                   admission, rate):
    """Requests still in a failed replica's frontend (one by one, or a burst's group not yet
    admitted) go back to the router: every request ends completed, rejected or failed, the
    invariants hold after every step, and no request reaches an engine after it ended."""
    cfg = compose_cfg("workload.num_requests=300", f"workload.rate={rate}",
                      "cluster.replicas=3", "cluster.failure.mtbf_s=4",
                      "cluster.failure.mttr_s=1", "backend.frontend.per_request_ms=20",
                      f"backend.frontend.admission={admission}", "check_invariants=true")
    r = simulate(cfg, requests_for(cfg, 0)).requests
    assert r["status"].isin(["completed", "rejected", "failed"]).all()
    assert r["num_retries"].sum() > 0
    done = r[r["status"] == "completed"]
    assert (done["engine_arrival_s"] < done["completion_s"]).all()
    once = done[done["num_retries"] == 0]
    assert (once["engine_arrival_s"] <= once["first_scheduled_s"] + 1e-12).all()


@pytest.mark.parametrize("seed", [0, 1])
def test_a_retry_streams_after_the_tokens_its_failed_replica_still_streams(compose_cfg,
                                                                            requests_for, seed):
    """A request retried while the failed replica's API server still streams its earlier
    tokens (a streaming backlog of 2 ms a token): the client sees its next tokens after them,
    so no request's first token comes after its last (the invariants check it after every
    step: these seeds broke it before) and none ends before its first token."""
    cfg = compose_cfg("workload.num_requests=300", "workload.rate=20", "cluster.replicas=3",
                      "cluster.failure.mtbf_s=4", "cluster.failure.mttr_s=1",
                      "backend.frontend.per_output_token_us=2000", "check_invariants=true",
                      f"seed={seed}")
    r = simulate(cfg, requests_for(cfg, seed)).requests
    assert (r["status"] == "completed").all() and r["num_retries"].sum() > 0
    assert (r["first_token_s"] <= r["completion_s"]).all()


@pytest.mark.parametrize("admission", ["fifo", "interleaved"])
def test_a_request_taken_back_by_a_failure_is_handed_over_once(compose_cfg, admission):
    """A replica that fails often while requests sit in its frontend (50 ms of latency): a
    request taken back and sent to it again after the repair reaches the scheduler through
    its new admission only, never through the hand-over the failure voided (the invariant
    checker refuses a request in a scheduler before its engine arrival)."""
    cfg = compose_cfg("cost_model=constant", "cost_model.step_time_ms=5",
                      "cluster.failure.mtbf_s=0.2", "cluster.failure.mttr_s=0.01",
                      "backend.frontend.per_request_ms=1", "backend.frontend.latency_ms=50",
                      f"backend.frontend.admission={admission}", "check_invariants=true")
    rng = np.random.default_rng(4)
    req = pd.DataFrame({"arrival_time_s": np.sort(rng.uniform(0, 2, 200)),
                        "input_tokens": 50, "output_tokens": 4, "client": -1,
                        "think_time_s": 0.0})
    r = simulate(cfg, req).requests
    assert r["num_retries"].sum() > 0
    assert r["status"].isin(["completed", "failed"]).all()


@pytest.mark.parametrize("key", ["per_request_ms", "per_prompt_token_us",
                                 "per_output_token_us", "latency_ms"])
def test_a_negative_frontend_cost_is_one_error(compose_cfg, key):
    cfg = compose_cfg(f"backend.frontend.{key}=-1")
    with pytest.raises(ConfigError, match=f"backend.frontend.{key}"):
        check_config(cfg)


def test_disaggregated_requests_pass_one_frontend(compose_cfg, requests_for):
    """The prefill side admits a request, the decode side streams its tokens; the KV
    transfer lands on the decode replica without a second admission."""
    over = ("cluster=disagg", "cluster.prefill_replicas=1", "cluster.decode_replicas=1",
            "workload.num_requests=40", "backend.frontend.per_request_ms=50",
            "backend.frontend.latency_ms=0", "backend.frontend.per_prompt_token_us=0",
            "backend.frontend.per_output_token_us=0")
    cfg = compose_cfg(*over)
    r = simulate(cfg, requests_for(cfg, 0)).requests
    first = r.iloc[0]
    assert first["engine_arrival_s"] == pytest.approx(first["arrival_s"] + 0.05)
    # one admission of 50 ms before the prefill, none after the transfer
    assert (r["first_token_s"] - r["kv_transfer_end_s"]).max() < 0.05


def test_interleaved_admission_takes_one_instants_arrivals_together():
    """Three requests at once, behind 2 ms of streaming: all three reach the engine when the
    server has done the three admissions; a later one is admitted after them."""
    costs = FrontendCosts.from_units(per_request_ms=1, per_prompt_token_us=100,
                                     per_output_token_us=100, latency_ms=3,
                                     admission="interleaved")
    arrival = np.zeros(4)
    server = FrontendServer(costs, costs.service_times(np.array([10, 20, 30, 10])), arrival)
    assert server.stream(1.0, 20) == pytest.approx(1.002)
    assert [server.join(r) for r in (0, 1, 2)] == [True, False, False]
    members, at = server.admit_group(1.0)
    assert members == [0, 1, 2]
    assert at == pytest.approx(1.002 + 3e-3 + 6e-3 + 3e-3)  # 3 x 1 ms + 60 x 0.1 ms + 3 ms
    assert arrival[:3] == pytest.approx([at] * 3)
    assert server.join(3)  # a new instant's group
    assert server.admit_group(1.0105)[1] == pytest.approx(1.011 + 2e-3 + 3e-3)


def test_a_burst_reaches_the_engine_together_when_admission_is_interleaved(compose_cfg):
    """100 requests at t=0, 2 ms each: FIFO hands the first to the engine after 2 ms and the
    last after 200 ms; interleaved hands all of them over at 200 ms."""
    req = pd.DataFrame({"arrival_time_s": np.zeros(100), "input_tokens": 50,
                        "output_tokens": 2, "client": -1, "think_time_s": 0.0})
    at = {}
    for admission in ("fifo", "interleaved"):
        cfg = compose_cfg("cost_model=constant", "cost_model.step_time_ms=1",
                          "backend.frontend.per_request_ms=2",
                          f"backend.frontend.admission={admission}")
        at[admission] = np.sort(simulate(cfg, req).requests["engine_arrival_s"].to_numpy())
    assert at["fifo"] == pytest.approx(0.002 * np.arange(1, 101))
    assert at["interleaved"] == pytest.approx(np.full(100, 0.2))


def test_a_lagging_streaming_process_keeps_the_invariants(compose_cfg):
    """A burst whose streaming (its own process) runs far behind the engine while admissions
    are done: the tokens clients see are stamped up to the streaming process's free time, which
    the invariants allow (a check against the admitting server's time alone fails)."""
    req = pd.DataFrame({"arrival_time_s": np.zeros(60), "input_tokens": 50,
                        "output_tokens": 20, "client": -1, "think_time_s": 0.0})
    cfg = compose_cfg("cost_model=constant", "cost_model.step_time_ms=1",
                      "backend.frontend.per_request_ms=0.1",
                      "backend.frontend.per_output_token_us=2000",
                      "backend.frontend.streaming=own_process", "check_invariants=true")
    r = simulate(cfg, req).requests
    assert (r["status"] == "completed").all()
    # the engine is done after ~80 ms; the 1,200 tokens take 2.4 s to stream
    assert r["completion_s"].max() == pytest.approx(60 * 20 * 0.002, rel=0.05)
    assert r["engine_arrival_s"].max() == pytest.approx(0.006)  # not behind the streaming


def test_interleaved_admission_of_poisson_arrivals_is_fifo(compose_cfg, requests_for):
    """Requests that arrive one at a time are groups of one: the same M/D/1 queue."""
    runs = {}
    for admission in ("fifo", "interleaved"):
        cfg = compose_cfg("cost_model=constant", "cost_model.step_time_ms=0.001",
                          "workload=poisson", "workload.rate=70", "workload.num_requests=3000",
                          "workload.input_tokens=100", "workload.output_tokens=1", "seed=2",
                          "backend.frontend.per_request_ms=10",
                          f"backend.frontend.admission={admission}")
        runs[admission] = simulate(cfg, requests_for(cfg, 2)).requests["engine_arrival_s"]
    np.testing.assert_array_equal(runs["fifo"].to_numpy(), runs["interleaved"].to_numpy())


def test_an_unknown_admission_is_one_error(compose_cfg):
    with pytest.raises(ConfigError, match="backend.frontend.admission"):
        check_config(compose_cfg("backend.frontend.admission=lifo"))


FAST_FORWARD_CASES = {
    # one server admits and streams, one request after another; streaming lags the engine
    "shared_fifo": ("backend.frontend.admission=fifo", "backend.frontend.per_request_ms=3",
                    "backend.frontend.per_output_token_us=900", "workload.rate=4"),
    # vLLM's: one instant's arrivals admitted together, by the server that streams
    "shared_interleaved": ("backend.frontend.per_request_ms=1",
                           "backend.frontend.per_output_token_us=400", "workload.rate=5"),
    # a burst admitted together, then streamed
    "burst": ("backend.frontend.per_output_token_us=400", "workload.rate=inf"),
    # SGLang's: a streaming process of its own, under the overlap scheduler
    "own_process_overlap": ("backend=sglang", "scheduler=sglang",
                            "backend.frontend.per_output_token_us=700", "workload.rate=5"),
    # closed-loop clients send their next request when they see the last one end
    "closed_loop": ("workload=closed_loop", "workload.concurrency=12", "workload.think_time_s=0",
                    "backend.frontend.per_output_token_us=600"),
    # failures take windows and frontends' requests back mid-way
    "failures": ("cluster.replicas=3", "cluster.failure.mtbf_s=3", "cluster.failure.mttr_s=1",
                 "backend.frontend.per_output_token_us=1500", "workload.rate=12"),
}


def _same_runs(a, b) -> None:
    """Every request column, ITL sample (or, where one run kept none, their count and sum)
    and timeline row equal (floats to 1e-12)."""
    ra, rb = a.requests, b.requests
    for col in ra.columns:
        if ra[col].dtype.kind == "f":
            np.testing.assert_allclose(ra[col], rb[col], rtol=1e-12, atol=1e-12, err_msg=col)
        else:
            assert (ra[col] == rb[col]).all(), col
    if a.itl._samples is not None and b.itl._samples is not None:
        np.testing.assert_allclose(np.sort(a.itl.samples()), np.sort(b.itl.samples()),
                                   rtol=1e-12, atol=1e-12)
    assert a.itl.count == b.itl.count and a.itl.total == pytest.approx(b.itl.total, rel=1e-12)
    assert list(a.timeline.columns) == list(b.timeline.columns)
    for col in a.timeline.columns:
        np.testing.assert_allclose(a.timeline[col].to_numpy(float),
                                   b.timeline[col].to_numpy(float), rtol=1e-12, atol=1e-15,
                                   err_msg=col)


@pytest.fixture
def decode_windows(monkeypatch):
    """How many fast-forwarded decode windows the SimPy engine runs."""
    from sim.engine.replica import Replica

    count = [0]
    run = Replica._decode_window

    def counted(self, batch, k):
        count[0] += 1
        return (yield from run(self, batch, k))

    monkeypatch.setattr(Replica, "_decode_window", counted)
    return count


@pytest.mark.parametrize("case", FAST_FORWARD_CASES)
def test_fast_forward_through_a_frontend_equals_stepping(compose_cfg, requests_for, case,
                                                         decode_windows):
    """Decode windows stream each step's tokens through the frontend in time order with the
    server's admissions (``Replica._stream_window``): every timestamp, status, retry, ITL
    sample and timeline row equals step-by-step simulation's, on the SimPy engine (the
    compiled loop steps)."""
    over = ("engine=python", "workload.num_requests=250", "check_invariants=true",
            *FAST_FORWARD_CASES[case])
    req = requests_for(compose_cfg(*over), 0)
    windowed = simulate(compose_cfg(*over), req, keep_itl_samples=True)
    windows = decode_windows[0]
    stepped = simulate(compose_cfg(*over, "fast_forward=false"), req, keep_itl_samples=True)
    assert windows > 100 and decode_windows[0] == windows  # windows ran, and only there
    _same_runs(windowed, stepped)
    if case == "failures":
        assert windowed.requests["num_retries"].sum() > 0


def test_an_admission_at_a_step_end_is_served_before_the_step_streams(compose_cfg,
                                                                      decode_windows):
    """A request sent at the very instant a decode step ends, to a server that admits and
    streams: SimPy runs the send first (its event was scheduled before the step began), then
    the step's tokens stream, in a decode window as step by step and in the compiled loop."""
    over = ("backend.frontend.admission=fifo", "backend.frontend.per_request_ms=3",
            "backend.frontend.per_output_token_us=900", "backend.frontend.latency_ms=0",
            "backend.frontend.per_prompt_token_us=0")

    def requests(arrivals, outputs):
        return pd.DataFrame({"arrival_time_s": arrivals, "input_tokens": 100,
                             "output_tokens": outputs, "client": -1, "think_time_s": 0.0})

    steps = simulate(compose_cfg(*over, "engine=python", "fast_forward=false"),
                     requests([0.0], [40])).timeline
    tie = float((steps["time_s"] + steps["step_time_s"]).to_numpy()[10])
    req = requests([0.0, tie], [40, 10])
    runs = [simulate(compose_cfg(*over, *extra), req, keep_itl_samples=bool(extra))
            for extra in (("engine=python",), ("engine=python", "fast_forward=false"), ())]
    assert decode_windows[0] > 0 and runs[2].meta["engine"] == "compiled"
    for other in runs[1:]:
        _same_runs(runs[0], other)
