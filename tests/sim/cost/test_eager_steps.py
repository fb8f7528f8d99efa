"""LLM steps that run eager: under ``backend.enforce_eager``, and where the engine replays no
CUDA graph (``sim.cost.cuda_graphs``); the host dispatches every kernel (``sim.cost.eager``)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from sim import simulate
from sim.builders import build_cost_model, plain
from sim.cost.eager import calibrated_eager_costs

EAGER = ("backend.enforce_eager=true",)


def test_a_launch_bound_step_takes_its_launches(compose_cfg):
    """At 1 ms per launch every step is launch-bound: GPU work is hidden behind dispatch."""
    m = build_cost_model(plain(compose_cfg(*EAGER, "backend.eager_launch_us=1000")))
    n, c = np.ones(4, int), np.full(4, 500)
    step = m.step_cost(n, c)
    kernels = m.kernel_launches(False, True)
    assert kernels > m.model.num_hidden_layers  # several kernels per layer
    sched = m.host.time(4, 0, 4)
    assert step.time_s == pytest.approx(sched + kernels * 1e-3)
    ops = m.breakdown(n, c)
    assert sum(op.time_s for op in ops) == pytest.approx(step.time_s)
    assert {op.name for op in ops if op.bound == "host"} == {"eager.host_dispatch",
                                                              "host_overhead"}
    window = m.decode_window(c, 3)
    assert window[0] == pytest.approx(np.full(3, step.time_s))


def test_a_gpu_bound_step_hides_its_launches(compose_cfg):
    graphs = build_cost_model(plain(compose_cfg("cost_model.host_overhead_ms=0.2")))
    eager = build_cost_model(plain(compose_cfg("cost_model.host_overhead_ms=0.2", *EAGER,
                                               "backend.eager_launch_us=0.01")))
    n, c = np.array([4096]), np.array([0])
    assert eager.step_cost(n, c).time_s == pytest.approx(graphs.step_cost(n, c).time_s)


def test_the_launch_time_is_the_calibrated_dispatch_time(compose_cfg):
    m = build_cost_model(plain(compose_cfg(*EAGER)))
    assert m.eager_launch_s == pytest.approx(calibrated_eager_costs("h100_sxm")["launch_us"]
                                             * 1e-6)
    assert build_cost_model(plain(compose_cfg())).eager_launch_s == 0.0


def test_a_calibration_without_eager_costs_warns(compose_cfg):
    cfg = compose_cfg(*EAGER, "hardware=a100_80g_sxm")
    assert not calibrated_eager_costs(cfg.hardware.calibration)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        from sim.cost.eager import warn_uncalibrated
        warn_uncalibrated.cache_clear()
        assert build_cost_model(plain(cfg)).eager_launch_s == 0.0
    assert any("enforce_eager" in str(w.message) for w in seen)


TRTLLM = ("backend=trtllm", "scheduler=trtllm", "backend.eager_launch_us=1000")


def test_trtllm_steps_without_a_graph_pay_their_launches(compose_cfg):
    """At 1 ms per launch: a decode batch of 33 (no captured graph) and a step with a prompt
    take their launches; a batch of 32 replays its graph; a capture list with 33 in it makes
    33 a graph too."""
    m = build_cost_model(plain(compose_cfg(*TRTLLM)))
    decode = m.kernel_launches(False, True) * 1e-3
    assert m.decode_window(np.full(33, 500), 1)[0][0] >= decode
    assert m.decode_window(np.full(32, 500), 1)[0][0] < decode / 10
    assert m.step_cost(np.array([100]), np.array([0])).time_s >= m.kernel_launches(
        True, False) * 1e-3
    assert m.step_cost(np.array([100, 1]), np.array([0, 500])).time_s >= m.kernel_launches(
        True, True) * 1e-3
    listed = build_cost_model(plain(compose_cfg(*TRTLLM,
                                                "backend.cuda_graph_batch_sizes=[32,33]")))
    assert listed.decode_window(np.full(33, 500), 1)[0][0] < decode / 10
    ops = m.breakdown(np.ones(33, int), np.full(33, 500))
    assert sum(op.time_s for op in ops) == pytest.approx(m.decode_window(
        np.full(33, 500), 1)[0][0])


def test_a_gpu_without_eager_costs_prices_trtllm_launches_at_zero_quietly(compose_cfg):
    """Steps the user did not ask to run eager do not warn where no launch time is fitted."""
    cfg = compose_cfg("backend=trtllm", "scheduler=trtllm", "hardware=a100_80g_sxm")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert build_cost_model(plain(cfg)).eager_launch_s == 0.0


@pytest.mark.parametrize("extra", [EAGER, TRTLLM])
def test_eager_steps_are_the_same_in_both_engines(compose_cfg, requests_for, extra):
    cfg = compose_cfg("workload.num_requests=40", *extra)
    compiled = simulate(cfg, requests_for(cfg))
    assert compiled.meta["engine"] == "compiled"
    cfg.engine = "python"
    python = simulate(cfg, requests_for(cfg))
    for col in ("first_token_s", "completion_s"):
        assert np.allclose(compiled.requests[col], python.requests[col], rtol=1e-9, atol=1e-12)


def test_scheduling_and_launches_share_the_host_under_an_overlap_scheduler(compose_cfg):
    """TensorRT-LLM schedules and launches step k+1 on the host while the GPU runs step k: a
    step takes max(GPU, scheduling + launches). Without the overlap it schedules first, then
    launches ahead of the GPU: GPU + scheduling + what the launches outlast the GPU by."""
    trt = ("backend=trtllm", "scheduler=trtllm")
    c = np.full(33, 500)  # no captured graph for 33 sequences
    bare = build_cost_model(plain(compose_cfg(*trt, "backend.eager_launch_us=0",
                                              "cost_model.host_overhead_ms=0")))
    gpu = bare.decode_window(c, 1)[0][0]
    kernels = bare.kernel_launches(False, True)
    timing = (f"backend.eager_launch_us={0.8 * gpu / kernels * 1e6}",
              f"cost_model.host_overhead_ms={0.8 * gpu * 1e3}",
              "cost_model.host_overhead_per_seq_us=0")
    overlapped = build_cost_model(plain(compose_cfg(*trt, *timing)))
    assert overlapped.decode_window(c, 1)[0][0] == pytest.approx(1.6 * gpu)
    serial = build_cost_model(plain(compose_cfg(*trt, *timing,
                                                "backend.overlap_scheduler=false")))
    assert serial.decode_window(c, 1)[0][0] == pytest.approx(1.8 * gpu)
    ops = {op.name: op.time_s for op in overlapped.breakdown(np.ones(33, int), c)}
    assert ops["eager.host_dispatch"] == pytest.approx(0.6 * gpu)  # the launches' share
    assert ops["host_overhead"] == pytest.approx(0.0, abs=1e-12)
