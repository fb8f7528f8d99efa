"""Prefill/decode disaggregation: the KV transfer in TTFT, pools, and their config errors."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.metrics import summarize
from sim import simulate
from sim.errors import ConfigError
from sim.kv.budget import kv_bytes_per_token

STEP_S = 0.010


def one_request(prompt=1000, output=5, arrival=0.0):
    return pd.DataFrame({"arrival_time_s": [arrival], "input_tokens": [prompt],
                         "output_tokens": [output], "client": [-1], "think_time_s": [0.0]})


def test_ttft_includes_the_kv_transfer_as_computed_by_hand(compose_cfg):
    cfg = compose_cfg("cluster=disagg", "cost_model=constant", f"cost_model.step_time_ms="
                      f"{STEP_S * 1e3}", "cluster.kv_transfer_bandwidth=1e9",
                      "cluster.kv_transfer_latency_us=100")
    rec = simulate(cfg, one_request(prompt=1000, output=5, arrival=0.5))
    r = rec.requests.iloc[0]
    # Llama-3-8B, bf16 KV: 2 (K, V) × 32 layers × 8 KV heads × 128 dims × 2 bytes per token
    assert kv_bytes_per_token(cfg.model, cfg.kv_cache, 1) == 2 * 32 * 8 * 128 * 2
    transfer = 100e-6 + 1000 * 131072 / 1e9
    # prefill step, transfer, then the decode replica's step over the last prompt token
    assert r["first_token_s"] - r["arrival_s"] == pytest.approx(STEP_S + transfer + STEP_S,
                                                                 rel=1e-12)
    assert r["kv_transfer_start_s"] == pytest.approx(0.5 + STEP_S, rel=1e-12)
    assert r["kv_transfer_end_s"] - r["kv_transfer_start_s"] == pytest.approx(transfer)
    assert r["completion_s"] - r["first_token_s"] == pytest.approx(4 * STEP_S)
    assert (r["prefill_replica"], r["replica"]) == (0, 1)
    tl = rec.timeline
    moved = tl[tl["kind"] == 1]
    assert len(moved) == 1 and moved["replica"].item() == 1
    assert moved["step_time_s"].item() == pytest.approx(transfer)
    assert moved["scheduled_tokens"].item() == 1000
    assert summarize(rec)["mean_kv_transfer_ms"] == pytest.approx(transfer * 1e3)


def test_a_slower_link_adds_exactly_its_transfer_time_to_ttft(compose_cfg):
    """With the roofline cost model and one request, only the link changes TTFT."""
    ttft = {}
    for bw in (450e9, 25e9):
        cfg = compose_cfg("cluster=disagg", f"cluster.kv_transfer_bandwidth={bw}")
        rec = simulate(cfg, one_request(prompt=4000, output=3))
        ttft[bw] = (rec.requests["first_token_s"] - rec.requests["arrival_s"]).item()
    per_token = kv_bytes_per_token(cfg.model, cfg.kv_cache, 1)
    assert ttft[25e9] - ttft[450e9] == pytest.approx(4000 * per_token * (1 / 25e9 - 1 / 450e9),
                                                     rel=1e-9)


def test_pools_have_their_own_size_and_tensor_parallelism(compose_cfg, requests_for):
    cfg = compose_cfg("cluster=disagg", "model=llama3_70b", "cluster.prefill_replicas=2",
                      "cluster.decode_replicas=3", "cluster.prefill_tensor_parallel_size=8",
                      "cluster.decode_tensor_parallel_size=4", "workload.num_requests=150",
                      "workload.rate=4", "cost_model=constant")
    rec = simulate(cfg, requests_for(cfg))
    req = rec.requests
    assert (req["status"] == "completed").all()
    assert set(req["prefill_replica"]) == {0, 1} and set(req["replica"]) == {2, 3, 4}
    meta = rec.meta
    assert meta["replica_pools"] == ["prefill"] * 2 + ["decode"] * 3
    assert meta["pools"]["prefill"]["tensor_parallel_size"] == 8
    assert meta["pools"]["decode"]["tensor_parallel_size"] == 4
    blocks = meta["replica_num_gpu_blocks"]
    assert blocks[0] > blocks[2]  # 8 GPUs hold more of the cache than 4
    # the decode side's larger shard per GPU sets the transfer time
    per_gpu = kv_bytes_per_token(cfg.model, cfg.kv_cache, 4)
    moved = (req["kv_transfer_end_s"] - req["kv_transfer_start_s"]).to_numpy()
    np.testing.assert_allclose(moved, 10e-6 + req["input_tokens"] * per_gpu / 450e9, rtol=1e-9)
    # every transfer is a timeline row of its decode replica; KV usage per replica's capacity
    tl = rec.timeline
    assert (tl["kind"] == 1).sum() == len(req)
    s = summarize(rec)
    steps = tl[tl["kind"] == 0]
    usage = steps["kv_blocks_used"] / np.asarray(blocks)[steps["replica"]]
    assert s["mean_kv_usage"] == pytest.approx(np.average(usage, weights=steps["step_time_s"]))
    prefill_steps = steps[steps["replica"] < 2]
    assert (prefill_steps["decode_tokens"] == 0).all()  # prefill replicas never decode


@pytest.mark.parametrize("override, field", [
    ("cluster.decode_replicas=0", "cluster.decode_replicas"),
    ("cluster.prefill_replicas=0", "cluster.prefill_replicas"),
    ("cluster.decode_tensor_parallel_size=3", "cluster.decode_tensor_parallel_size"),
    ("cluster.prefill_tensor_parallel_size=16", "cluster.prefill_tensor_parallel_size"),
    ("cluster.kv_transfer_bandwidth=0", "cluster.kv_transfer_bandwidth"),
    ("cluster.kv_transfer_latency_us=-1", "cluster.kv_transfer_latency_us"),
])
def test_bad_disaggregation_settings_name_their_field(compose_cfg, override, field):
    cfg = compose_cfg("cluster=disagg", override)
    with pytest.raises(ConfigError) as e:
        simulate(cfg, one_request())
    assert e.value.field == field
    assert "\n" not in str(e.value)


def test_requests_too_big_for_either_pool_are_rejected(compose_cfg):
    cfg = compose_cfg("cluster=disagg", "cost_model=constant", "scheduler.max_model_len=2000")
    req = pd.concat([one_request(prompt=1500, output=100), one_request(prompt=1990,
                                                                       output=20)])
    rec = simulate(cfg, req.reset_index(drop=True))
    assert rec.requests["status"].tolist() == ["completed", "rejected"]
    assert rec.requests["reject_reason"].iloc[1] == "exceeds_max_model_len"


def test_a_transfer_cut_by_its_decode_replicas_failure_is_sent_again(compose_cfg):
    """The KV cache of a 1000-token prompt is on its way (50 s on a slow link) when the only
    decode replica fails; it waits for the repair, then moves again in full. The invariants
    are checked throughout (a request is on the link or parked, never both)."""
    import simpy

    from sim.engine.cluster import Cluster
    from sim.records import LogHistogram
    from sim.state import FINISHED, RequestTable

    cfg = compose_cfg("cluster=disagg", "cost_model=constant",
                      f"cost_model.step_time_ms={STEP_S * 1e3}",
                      "cluster.kv_transfer_bandwidth=2621440", "cluster.kv_transfer_latency_us=0")
    table = RequestTable(np.zeros(1), np.array([1000]), np.array([3]))
    env = simpy.Environment()
    cluster = Cluster(env, cfg, table, LogHistogram(), check_invariants=True)
    decode = cluster.pools[1]
    transfer = 1000 * 131072 / 2621440
    assert cluster.disagg.transfer_time(1000) == pytest.approx(transfer) == 50.0

    def script():
        cluster.submit(0)
        yield env.timeout(STEP_S + 1.0)  # prefilled at 10 ms, the transfer under way
        assert cluster.disagg.in_flight == {0: 0}
        cluster.fail(decode, 0)
        assert cluster.disagg.parked == [0] and not cluster.disagg.in_flight
        yield env.timeout(2.0)
        cluster.repair(decode, 0)

    env.process(script())
    env.run()
    assert table.status[0] == FINISHED and table.retries[0] == 1
    assert cluster.disagg.start_s[0] == pytest.approx(STEP_S + 3.0)
    assert table.completion[0] == pytest.approx(STEP_S + 3.0 + transfer + 3 * STEP_S)


@pytest.mark.parametrize("backend, window_tokens", [("vllm", 128), ("sglang", 0)])
def test_the_transfer_moves_the_window_of_sliding_layers(compose_cfg, backend, window_tokens):
    """gpt-oss-20b: 12 full and 12 sliding layers, 2 × 8 KV heads × 64 dims × 2 bytes a layer
    and token. vLLM keeps the sliding layers' window: a 1,000-token prompt sends 1,000 tokens
    of 12 layers and the last 128 of the other 12; SGLang keeps every token of all 24."""
    cfg = compose_cfg("model=gpt_oss_20b", "cluster=disagg", f"backend={backend}",
                      "cost_model=constant", "cluster.kv_transfer_bandwidth=1e9",
                      "cluster.kv_transfer_latency_us=100")
    rec = simulate(cfg, one_request(prompt=1000, output=5))
    r = rec.requests.iloc[0]
    layer = 2 * 8 * 64 * 2
    sent = 1000 * 12 * layer + window_tokens * 12 * layer if window_tokens else \
        1000 * 24 * layer
    assert r["kv_transfer_end_s"] - r["kv_transfer_start_s"] == pytest.approx(
        100e-6 + sent / 1e9)
