"""An engine that schedules each step while the one before it runs (TensorRT-LLM's overlap
scheduler, SGLang's overlap schedule, vLLM's async scheduling; ``sim.engine.replica``): a
request that arrives mid-step joins the step after next; an idle engine takes it at once."""

from __future__ import annotations

import pandas as pd
import pytest

from sim import simulate
from sim.config.backend import overlaps


def _requests(arrivals, output_tokens):
    return pd.DataFrame({"arrival_time_s": arrivals, "input_tokens": 50,
                         "output_tokens": output_tokens, "client": -1, "think_time_s": 0.0})


@pytest.mark.parametrize("overlap, joins_at", [("false", 0.020), ("true", 0.030)])
def test_a_request_arriving_mid_step_joins_the_step_after_next(compose_cfg, overlap, joins_at):
    """10 ms steps from t=0; B arrives at 15 ms, during the second step. Without overlap it
    joins the third step (20 ms); with it, the third step was scheduled when the second
    started, so B joins the fourth (30 ms). C reaches an idle engine and starts at once."""
    cfg = compose_cfg("cost_model=constant", "cost_model.step_time_ms=10",
                      f"backend.overlap_scheduler={overlap}")
    r = simulate(cfg, _requests([0.0, 0.015, 1.0], [10, 3, 3])).requests
    assert r["first_scheduled_s"].tolist() == pytest.approx([0.0, joins_at, 1.0])


def test_a_request_arriving_as_a_step_starts_has_missed_the_next(compose_cfg):
    """B arrives at 10 ms, the instant the second step starts (the first step's next was
    scheduled as it started): it joins the third step after that one, at 30 ms, as a closed-loop
    client's next request does when its last one ends with a step."""
    cfg = compose_cfg("cost_model=constant", "cost_model.step_time_ms=10",
                      "backend.overlap_scheduler=true")
    r = simulate(cfg, _requests([0.0, 0.010], [10, 3])).requests
    assert r["first_scheduled_s"].tolist() == pytest.approx([0.0, 0.030])


def test_which_engines_overlap_by_default(compose_cfg):
    """TensorRT-LLM and SGLang overlap by default, vLLM with --async-scheduling; none with
    pipeline parallelism; the option overrides."""
    def overlap(*overrides):
        cfg = compose_cfg(*overrides)
        return overlaps(cfg.backend, cfg.cluster.pipeline_parallel_size)

    assert overlap("backend=trtllm") and overlap("backend=sglang")
    assert not overlap("backend=vllm")
    assert overlap("backend=vllm", "backend.async_scheduling=true")
    assert not overlap("backend=sglang", "cluster.pipeline_parallel_size=2")
    assert not overlap("backend=trtllm", "backend.overlap_scheduler=false")
    assert overlap("backend=vllm", "backend.overlap_scheduler=true")


NO_FRONTEND = ["backend.frontend.per_request_ms=0", "backend.frontend.per_prompt_token_us=0",
               "backend.frontend.per_output_token_us=0", "backend.frontend.latency_ms=0"]


@pytest.mark.parametrize("frontend", [["backend.frontend.admission=fifo"],
                                      ["backend.frontend.admission=interleaved"], NO_FRONTEND],
                         ids=["fifo", "interleaved", "none"])
def test_failures_give_back_the_requests_an_overlapping_engine_held(compose_cfg, requests_for,
                                                                    frontend):
    """Requests held for the engine's next scheduling pass go back to the router when their
    replica fails: every request ends completed, rejected or failed, and the invariants
    (each request in one place) hold after every step."""
    cfg = compose_cfg("workload.num_requests=300", "workload.rate=20", "cluster.replicas=3",
                      "cluster.failure.mtbf_s=4", "cluster.failure.mttr_s=1",
                      "backend.overlap_scheduler=true", "check_invariants=true", *frontend)
    r = simulate(cfg, requests_for(cfg, 0)).requests
    assert r["status"].isin(["completed", "rejected", "failed"]).all()
    assert r["num_retries"].sum() > 0
    once = r[(r["status"] == "completed") & (r["num_retries"] == 0)]
    assert (once["engine_arrival_s"] <= once["first_scheduled_s"] + 1e-12).all()


def test_disaggregated_requests_come_straight_into_an_overlapping_decode_side(compose_cfg,
                                                                               requests_for):
    """A request whose KV cache lands on the decode side is not held (its pick-up lag is not
    modelled): the invariants hold with failures, and every request completes."""
    cfg = compose_cfg("cluster=disagg", "workload.num_requests=200", "workload.rate=20",
                      "backend.overlap_scheduler=true", "check_invariants=true",
                      "cluster.failure.mtbf_s=4", "cluster.failure.mttr_s=1")
    r = simulate(cfg, requests_for(cfg, 0)).requests
    assert (r["status"] == "completed").all()
