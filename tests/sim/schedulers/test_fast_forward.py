"""Every policy gives the same results with fast-forwarded decode windows as step by step."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim import simulate
from sim.schedulers import SCHEDULERS

POLICY_FIELDS = {
    "vllm": {"policy": "priority"},
    "dynamic": {"max_queue_delay_ms": 20.0},
    "sarathi": {"chunk_size": 64},
    "trtllm": {"capacity_scheduler_policy": "MAX_UTILIZATION"},
}
CASES = [(n, POLICY_FIELDS.get(n, {})) for n in SCHEDULERS] + [
    ("vllm", {}), ("trtllm", {})]


@pytest.mark.parametrize("roofline", [False, True], ids=["constant", "roofline"])
@pytest.mark.parametrize("name, fields", CASES, ids=lambda c: str(c) if isinstance(c, str)
                         else "-".join(f"{v}" for v in c.values()) or "default")
def test_fast_forward_equals_stepping(tiny_config, requests, name, fields, roofline):
    rng = np.random.default_rng(5)
    n = 60
    urgent = rng.random(n) < 0.4
    # bursts and lulls, under memory pressure, with request classes
    arrivals = np.sort(np.concatenate([rng.uniform(0, 0.05, n // 2), rng.uniform(0.4, 2.0,
                                                                                  n - n // 2)]))
    req = requests(arrivals, rng.integers(5, 150, n), rng.integers(1, 90, n),
                   priority=np.where(urgent, 0, 1), ttft_slo_ms=np.where(urgent, 20.0, 900.0))
    runs = []
    for ff in (True, False):
        cfg = tiny_config(name, num_blocks=80, block_size=4, max_seqs=8, budget=256,
                          roofline=roofline, fast_forward=ff, **fields)
        runs.append(simulate(cfg, req, keep_itl_samples=True))
    a, b = runs
    cols = ["first_scheduled_s", "first_token_s", "completion_s"]
    np.testing.assert_allclose(a.requests[cols].to_numpy(), b.requests[cols].to_numpy(),
                               rtol=1e-12, atol=1e-12)
    assert (a.requests["status"] == "completed").all()
    assert (a.requests["num_preemptions"] == b.requests["num_preemptions"]).all()
    np.testing.assert_allclose(np.sort(a.itl.samples()), np.sort(b.itl.samples()),
                               rtol=1e-9, atol=1e-12)
    assert len(a.timeline) == len(b.timeline)


def test_prefix_hits_with_state_blocks_do_not_fast_forward(compose_cfg):
    """gpt-oss (sliding-window layers: state blocks) with prefix caching under a burst of
    32k-token prompts, preempting: windowed and stepped records equal (this workload broke
    windows once: 46 preemptions windowed against 38 stepped)."""
    over = ("model=gpt_oss_120b", "scheduler.max_model_len=32768",
            "kv_cache.prefix_caching=true", "engine=python")
    req = pd.DataFrame({"arrival_time_s": np.zeros(100), "input_tokens": 32000,
                        "output_tokens": 99, "client": -1, "think_time_s": 0.0})
    a, b = (simulate(compose_cfg(*over, f"fast_forward={ff}"), req).requests
            for ff in (True, False))
    assert b["num_preemptions"].sum() > 0
    for col in a.columns:
        if a[col].dtype.kind == "f":
            np.testing.assert_allclose(a[col], b[col], rtol=1e-12, atol=1e-12, err_msg=col)
        else:
            assert (a[col] == b[col]).all(), col


# Small prefix-caching workloads under KV pressure on which decode windows once differed from
# stepping (an adversarial search, minimised): blocks a window's requests fill twice are
# freed (stepping reuses them at once instead of evicting cached blocks); a running request's
# new block lengthens a waiting request's hit (TensorRT-LLM's reservation then admits it);
# a waiting gpt-oss request's failed admissions take and return its state blocks, evicting.
PREFIX_EDGES = {
    "vllm": (["scheduler=vllm", "kv_cache.block_size=8", "cluster.prefix_block_tokens=16",
              "scheduler.max_num_seqs=6", "scheduler.max_num_batched_tokens=512",
              "kv_cache.num_gpu_blocks=34"],
             [0.0, 0.0133, 0.0149, 0.0241, 0.0251, 0.0702, 0.0964, 0.272],
             [42, 75, 23, 38, 42, 151, 15, 148], [180, 96, 32, 12, 180, 6, 183, 50],
             [(1, 2, 3), (1, 2, 3, 4, 5, 6, 7, 8, 9), None, (1, 2, 3, 4, 5), (1, 2, 3),
              (1, 2, 90, 91, 92, 93, 94, 95, 96), (1, 2, 3, 80, 81),
              (1, 2, 3, 4, 5, 6, 7, 8)]),
    "sarathi": (["scheduler=sarathi", "kv_cache.block_size=16",
                 "cluster.prefix_block_tokens=16", "scheduler.max_num_seqs=3",
                 "scheduler.chunk_size=32", "scheduler.max_num_batched_tokens=32",
                 "kv_cache.num_gpu_blocks=23"],
                [0.0, 0.0, 0.0, 0.0125, 0.0363], [102, 25, 37, 37, 84], [45, 90, 99, 99, 166],
                [(20, 21, 22, 90, 91, 92), (30, 31, 32), (1, 2, 3), (1, 2, 3),
                 (20, 21, 22, 23, 24, 93, 94)]),
    "trtllm-max-utilization": (
        ["scheduler=trtllm", "kv_cache.block_size=8", "cluster.prefix_block_tokens=16",
         "scheduler.max_num_seqs=3", "scheduler.max_num_batched_tokens=64",
         "scheduler.capacity_scheduler_policy=MAX_UTILIZATION", "kv_cache.num_gpu_blocks=30"],
        [0.0, 0.0092, 0.0259, 0.0779, 0.2989], [15, 15, 117, 168, 34], [59, 59, 2, 6, 59],
        [(40, 41, 42, 43), (40, 41, 42, 43), (1, 2, 3, 90, 91, 92), None,
         (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 93)]),
    "trtllm-hit-grows": (["scheduler=trtllm", "kv_cache.block_size=16",
                          "cluster.prefix_block_tokens=16", "kv_cache.num_gpu_blocks=11"],
                         [0.0, 0.05], [32, 96], [60, 10], [(1, 2, 3, 4, 5, 6)] * 2),
    "vllm-gpt-oss": (["scheduler=vllm", "model=gpt_oss_120b", "kv_cache.block_size=16",
                      "cluster.prefix_block_tokens=16", "scheduler.max_num_seqs=64",
                      "scheduler.max_num_batched_tokens=64", "kv_cache.num_gpu_blocks=37"],
                     [0.0, 0.0, 0.0, 0.0067], [41, 201, 178, 41], [4, 41, 53, 24],
                     [(1, 2, 3), (20, 21, 90, 91, 92, 93, 94, 95, 96, 97),
                      (80, 81, 82, 83, 84, 85, 86, 87, 88), (1, 2, 3, 4, 5)]),
}


@pytest.mark.parametrize("case", list(PREFIX_EDGES))
def test_fast_forward_is_exact_under_prefix_caching_at_the_edges(compose_cfg, case):
    over, arrivals, prompts, outputs, ids = PREFIX_EDGES[case]
    req = pd.DataFrame({"arrival_time_s": arrivals, "input_tokens": prompts,
                        "output_tokens": outputs, "client": -1, "think_time_s": 0.0})
    req["hash_ids"] = pd.Series(ids, dtype=object)
    a, b = (simulate(compose_cfg(*over, "cost_model=constant", "engine=python",
                                 "kv_cache.prefix_caching=true", f"fast_forward={ff}"),
                     req).requests for ff in (True, False))
    for col in a.columns:
        if a[col].dtype.kind == "f":
            np.testing.assert_allclose(a[col], b[col], rtol=1e-12, atol=1e-12, err_msg=col)
        else:
            assert (a[col] == b[col]).all(), col


def test_a_load_aware_router_sees_the_requests_an_overlapping_engine_held_in_a_window(
        compose_cfg):
    """Replica 1 runs a decode window that request 4, waiting for a seat, keeps uncuttable;
    its overlapping engine holds request 5, which stepping hands to the scheduler at the next
    step boundary. kv_aware must count it there when it routes request 6 (it once saw only
    the scheduler's queue: request 6 went to replica 1 and started 1.5 s late)."""
    over = ("cost_model=constant", "engine=python", "scheduler.max_num_seqs=2",
            "cluster.replicas=2", "cluster.router=kv_aware", "backend.overlap_scheduler=true")
    req = pd.DataFrame({"arrival_time_s": [0.0, 0.0, 0.005, 0.0202, 0.1049, 0.1383, 0.2754],
                        "input_tokens": [24, 22, 24, 6, 9, 18, 26],
                        "output_tokens": [32, 185, 85, 137, 38, 3, 7],
                        "client": -1, "think_time_s": 0.0})
    a, b = (simulate(compose_cfg(*over, f"fast_forward={ff}"), req).requests
            for ff in (True, False))
    assert b["replica"][6] == 0
    for col in a.columns:
        if a[col].dtype.kind == "f":
            np.testing.assert_allclose(a[col], b[col], rtol=1e-12, atol=1e-12, err_msg=col)
        else:
            assert (a[col] == b[col]).all(), col
