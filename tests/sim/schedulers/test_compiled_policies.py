"""The compiled Sarathi-Serve, TensorRT-LLM, SGLang and Orca policies and vLLM's keyed orders
(``policy=priority``, ``scheduler=edf``; ``sim.compiled``) give the SimPy engine's records to
float rounding; random runs and shipped workloads of every compiled policy are in
``test_compiled_core.py``."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tests.sim.schedulers.test_compiled_core import assert_same_records, both_engines, workload

POLICY_CASES = {  # the other compiled policies: (scheduler, its settings)
    "sarathi": ("sarathi", {}),
    "sarathi_kv_pressure": ("sarathi", {"num_blocks": 60, "block_size": 4}),
    "sarathi_few_seats": ("sarathi", {"max_seqs": 3}),
    "sarathi_small_chunk": ("sarathi", {"chunk_size": 24}),  # < the decodes at times
    "trtllm": ("trtllm", {}),
    "trtllm_no_evict_tight": ("trtllm", {"num_blocks": 90, "block_size": 4}),
    "trtllm_max_utilization": ("trtllm", {"num_blocks": 60, "block_size": 4,
                                          "capacity_scheduler_policy": "MAX_UTILIZATION"}),
    "trtllm_small_budget": ("trtllm", {"budget": 30, "max_seqs": 6}),
    "trtllm_no_chunking": ("trtllm", {"enable_chunked_prefill": False, "budget": 400}),
    "sglang": ("sglang", {}),
    "sglang_kv_pressure": ("sglang", {"num_blocks": 60, "block_size": 4}),  # retraction
    "sglang_small_chunk": ("sglang", {"chunk_size": 40, "budget": 64}),  # chunked prompts
    "sglang_few_seats": ("sglang", {"max_seqs": 3}),
    "orca": ("orca", {}),
    "orca_reservations": ("orca", {"num_blocks": 90, "block_size": 4}),  # full-length KV
    "orca_few_seats": ("orca", {"max_seqs": 3}),
    # many decodes take their token out of the budget the whole prompts fit in
    "orca_budget": ("orca", {"max_len": 320, "max_seqs": 64, "num_blocks": 3000}),
    # keyed waiting orders: by (priority, arrival) and by (arrival + TTFT SLO, arrival)
    "priority": ("vllm", {"policy": "priority"}),
    "priority_kv_pressure": ("vllm", {"policy": "priority", "num_blocks": 60, "block_size": 4}),
    "priority_ties": ("vllm", {"policy": "priority", "num_blocks": 60, "block_size": 4}),
    "priority_threshold": ("vllm", {"policy": "priority", "long_prefill_token_threshold": 24}),
    "edf": ("edf", {}),
    "edf_kv_pressure": ("edf", {"num_blocks": 60, "block_size": 4}),
    "edf_ties": ("edf", {"num_blocks": 60, "block_size": 4}),
    "edf_few_seats": ("edf", {"max_seqs": 3}),
}


def with_classes(req, rng, ties: bool):
    """``req`` with a priority and a TTFT SLO per request (some without one: inf); ``ties``:
    arrivals in bursts of one instant, so keys tie on both terms and the id decides."""
    n = len(req)
    req["priority"] = rng.integers(0, 3, n)
    req["ttft_slo_ms"] = rng.choice([50.0, 400.0, 400.0, np.inf], n)
    if ties:
        req["arrival_time_s"] = np.round(req["arrival_time_s"].to_numpy(), 1)
    return req


@pytest.mark.parametrize("replicas, router", [(1, "round_robin"), (3, "least_outstanding")],
                         ids=["one", "least_outstanding"])
@pytest.mark.parametrize("case", POLICY_CASES)
def test_compiled_policies_equal_simpy_engine(tiny_config, requests, case, replicas, router):
    name, own = POLICY_CASES[case]
    fields = {"num_blocks": 200, "block_size": 8, "max_seqs": 16, "budget": 256} | (
        {"chunk_size": 128} if name in ("sarathi", "sglang") else {}) | own
    cfg = tiny_config(name, roofline=True, **fields)
    cfg.cluster = replace(cfg.cluster, replicas=replicas, router=router)
    cfg.timeline = True
    rng = np.random.default_rng(len(case))
    req = workload(requests, rng, 120, cfg.scheduler.max_model_len)
    if name == "edf" or own.get("policy") == "priority":
        req = with_classes(req, rng, ties="ties" in case)
    a, b = both_engines(cfg, req)
    assert_same_records(a, b)
    if "kv_pressure" in case or "max_utilization" in case:
        assert a.requests["num_preemptions"].sum() > 0  # the preemption path ran
    assert (a.requests["status"] == "rejected").any()
