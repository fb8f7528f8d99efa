"""Behaviour that holds for the real designs, through ``sim.engine.run.simulate`` (issue 4)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim import simulate


def _ttft(rec) -> pd.Series:
    r = rec.requests[rec.requests["status"] == "completed"]
    return r["first_token_s"] - r["arrival_s"]


def _tpot(rec) -> pd.Series:
    r = rec.requests[(rec.requests["status"] == "completed") & (rec.requests["output_tokens"] > 1)]
    return (r["completion_s"] - r["first_token_s"]) / (r["generated_tokens"] - 1)


def _h100(compose_cfg, scheduler: str, *overrides: str):
    return compose_cfg(f"scheduler={scheduler}", "model=llama3_8b", "hardware=h100_sxm",
                       "cost_model=roofline", *overrides)


def test_vllm_has_lower_mean_ttft_than_static_at_moderate_load(compose_cfg, requests):
    rng = np.random.default_rng(1)
    n = 120
    req = requests(np.cumsum(rng.exponential(1 / 3.0, n)), rng.integers(100, 2000, n),
                   rng.integers(20, 300, n))
    vllm = simulate(_h100(compose_cfg, "vllm"), req)
    static = simulate(_h100(compose_cfg, "static"), req)
    assert (vllm.requests["status"] == "completed").all()
    assert (static.requests["status"] == "completed").all()
    assert _ttft(vllm).mean() < 0.5 * _ttft(static).mean()


def test_sarathi_has_lower_p99_tpot_than_orca_with_long_prompts_among_decodes(
        compose_cfg, requests):
    # chat turns (short outputs) decoding while 8000-token documents arrive now and then
    rng = np.random.default_rng(0)
    short, long = 120, 8
    chat = np.cumsum(rng.exponential(1 / 40.0, short))
    arrivals = np.concatenate([chat, np.linspace(0.3, chat[-1] - 0.3, long)])
    inputs = np.concatenate([rng.integers(50, 200, short), np.full(long, 8000)])
    outputs = np.concatenate([rng.integers(8, 64, short), np.full(long, 8)])
    order = np.argsort(arrivals, kind="stable")
    req = requests(arrivals[order], inputs[order], outputs[order])
    orca = simulate(_h100(compose_cfg, "orca"), req)
    sarathi = simulate(_h100(compose_cfg, "sarathi"), req)
    p99 = {name: np.percentile(_tpot(rec), 99) for name, rec in
           (("orca", orca), ("sarathi", sarathi))}
    assert p99["sarathi"] < 0.8 * p99["orca"], p99
    # the cause: Orca prefills each document in one step that stalls every decode, Sarathi
    # never runs more than its chunk
    assert orca.timeline["prefill_tokens"].max() >= 8000
    assert sarathi.timeline["scheduled_tokens"].max() <= 512
    assert sarathi.itl.quantile(0.99) < 0.5 * orca.itl.quantile(0.99)


def _pressure(n: int, requests):
    rng = np.random.default_rng(3)
    return requests(np.cumsum(rng.exponential(0.005, n)), rng.integers(20, 120, n),
                    rng.integers(20, 120, n))


def test_trtllm_guaranteed_no_evict_never_preempts_under_memory_pressure(tiny_config, requests):
    req = _pressure(80, requests)
    recs = {}
    for name, extra in (("vllm", {}), ("trtllm", {}),
                        ("trtllm_max_util", {"capacity_scheduler_policy": "MAX_UTILIZATION"})):
        cfg = tiny_config(name.split("_")[0], num_blocks=60, block_size=4, max_seqs=16,
                          budget=512, **extra)
        recs[name] = simulate(cfg, req)
        assert (recs[name].requests["status"] == "completed").all(), name
        assert recs[name].timeline["kv_blocks_used"].max() <= 60
    assert recs["vllm"].requests["num_preemptions"].sum() > 0  # the cache is under pressure
    assert recs["trtllm_max_util"].requests["num_preemptions"].sum() > 0
    assert recs["trtllm"].requests["num_preemptions"].sum() == 0


@pytest.mark.parametrize("name, extra", [("vllm", {"policy": "priority"}), ("edf", {})])
def test_high_priority_class_gets_lower_ttft_under_load(tiny_config, requests, name, extra):
    rng = np.random.default_rng(4)
    n = 300
    urgent = rng.random(n) < 0.3
    req = requests(np.cumsum(rng.exponential(0.004, n)), rng.integers(20, 200, n),
                   rng.integers(10, 60, n),
                   request_class=np.where(urgent, "interactive", "batch"),
                   priority=np.where(urgent, 0, 1),
                   ttft_slo_ms=np.where(urgent, 50.0, 5000.0))
    cfg = tiny_config(name, num_blocks=400, block_size=16, max_seqs=4, budget=256, **extra)
    rec = simulate(cfg, req)
    ttft = _ttft(rec).groupby(rec.requests["request_class"]).mean()
    assert ttft["interactive"] < 0.5 * ttft["batch"], ttft
    fcfs = simulate(tiny_config("vllm", num_blocks=400, block_size=16, max_seqs=4, budget=256),
                    req)
    fcfs_ttft = _ttft(fcfs).groupby(fcfs.requests["request_class"]).mean()
    assert ttft["interactive"] < 0.5 * fcfs_ttft["interactive"]


def test_dynamic_batch_starts_at_the_queue_delay(tiny_config, requests):
    req = requests([0.0, 0.01, 1.0], [10, 10, 10], [3, 3, 3])
    cfg = tiny_config("dynamic", max_seqs=4, budget=400, max_queue_delay_ms=100.0)
    rec = simulate(cfg, req)
    first = rec.requests["first_scheduled_s"].to_numpy()
    np.testing.assert_allclose(first, [0.1, 0.1, 1.1])
    # static: request 1 waits for request 0's batch (3 steps of 7 ms) to finish
    static = simulate(tiny_config("static", max_seqs=4, budget=400), req)
    np.testing.assert_allclose(static.requests["first_scheduled_s"], [0.0, 0.021, 1.0])
