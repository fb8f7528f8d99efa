"""Property tests over random small configurations: conservation, accounting, fast-forward.

Every run here has ``check_invariants`` on, so the simulator also checks KV accounting,
batch limits, timestamps and conservation after each of its steps (``sim.engine.invariants``); the
cluster runs add replica failures with retry limits and permanent losses, stragglers and a
degraded KV link.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim import simulate
from sim.config import (
    BackendConfig,
    ClusterConfig,
    ConstantCostConfig,
    HardwareConfig,
    KVCacheConfig,
    ModelConfig,
    RooflineCostConfig,
    SchedulerConfig,
)
from sim.kv.budget import activation_peak_bytes, kv_bytes_per_token
from sim.model.weights import parameter_count
from sim.schedulers import SCHEDULERS

EXAMPLES = int(os.environ.get("HYPOTHESIS_EXAMPLES", 50))  # raise locally for a deeper search
TINY = ModelConfig(name="tiny", num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, intermediate_size=128, vocab_size=1000,
                   max_position_embeddings=4096)


def tiny_config(num_blocks: int, block_size: int, max_seqs: int, budget: int, max_len: int,
                roofline: bool, fast_forward: bool = True, chunked: bool = True,
                threshold: int = 0, name: str = "vllm", **policy) -> SimpleNamespace:
    """A tiny model on a GPU sized so that exactly ``num_blocks`` KV blocks hold tokens;
    ``policy``: fields of scheduler ``name`` (policy, chunk_size, ...)."""
    if not chunked or SCHEDULERS[name].whole_prompt:
        budget = max(budget, max_len)
    sched = SchedulerConfig(name=name, max_num_seqs=max_seqs, max_num_batched_tokens=budget,
                            max_model_len=max_len, enable_chunked_prefill=chunked,
                            long_prefill_token_threshold=threshold, **policy)
    kv = KVCacheConfig(block_size=block_size, gpu_memory_utilization=1.0, other_memory_gib=0.0)
    need = (parameter_count(TINY) * 2 + activation_peak_bytes(TINY, sched, 1)
            + (num_blocks + 1) * block_size * kv_bytes_per_token(TINY, kv, 1))
    hw = HardwareConfig(name="toy", bf16_flops=1e12, fp8_flops=2e12, hbm_bandwidth=1e11,
                        hbm_bytes=need, nvlink_bandwidth=1e10, pcie_bandwidth=1e10)
    cost = RooflineCostConfig() if roofline else ConstantCostConfig(step_time_ms=7.0)
    return SimpleNamespace(model=TINY, hardware=hw, scheduler=sched, kv_cache=kv,
                           cluster=ClusterConfig(), backend=BackendConfig(), cost_model=cost,
                           fast_forward=fast_forward, check_invariants=True)


@st.composite
def policy(draw, budget: int) -> dict:
    """A scheduler name and the fields only that policy reads."""
    name = draw(st.sampled_from(list(SCHEDULERS)))
    fields = {"name": name}
    if name == "vllm":
        fields["policy"] = draw(st.sampled_from(["fcfs", "priority"]))
    elif name == "dynamic":
        fields["max_queue_delay_ms"] = draw(st.sampled_from([0.0, 5.0, 50.0]))
    elif name == "sarathi":
        fields["chunk_size"] = draw(st.integers(1, budget))
    elif name == "sglang":
        fields["chunk_size"] = draw(st.integers(1, 2 * budget))
    elif name == "trtllm":
        fields["capacity_scheduler_policy"] = draw(
            st.sampled_from(["GUARANTEED_NO_EVICT", "MAX_UTILIZATION"]))
    return fields


@st.composite
def scenario(draw):
    n = draw(st.integers(1, 40))
    block_size = draw(st.sampled_from([1, 4, 16]))
    budget = draw(st.integers(8, 256))
    cfg = tiny_config(num_blocks=draw(st.integers(4, 200)), block_size=block_size,
                      max_seqs=draw(st.integers(1, 8)), budget=budget,
                      max_len=draw(st.integers(16, 400)), roofline=draw(st.booleans()),
                      chunked=draw(st.booleans()),
                      threshold=draw(st.sampled_from([0, 0, 1, 7, 64])),
                      **draw(policy(budget)))
    # swap preemption under every scheduler (sglang ignores it; static, dynamic and orca
    # never preempt)
    cfg.kv_cache.preemption = draw(st.sampled_from(["recompute", "swap"]))
    rate = draw(st.floats(0.5, 500))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    closed = draw(st.booleans())
    if closed:
        conc = draw(st.integers(1, 4))
        client = np.arange(n) % conc
        arrival = np.where(np.arange(n) < conc, 0.0, np.nan)
        think = rng.exponential(0.01, n)
    else:
        client = np.full(n, -1)
        arrival = np.cumsum(rng.exponential(1 / rate, n))
        think = np.zeros(n)
    req = pd.DataFrame({"arrival_time_s": arrival,
                        "input_tokens": rng.integers(1, 300, n),
                        "output_tokens": rng.integers(1, 120, n),
                        "client": client.astype(np.int64), "think_time_s": think})
    if draw(st.booleans()):  # request classes: priorities and TTFT targets
        req["priority"] = rng.integers(0, 3, n)
        req["ttft_slo_ms"] = rng.choice([5.0, 50.0, 500.0, np.inf], n)
    return cfg, req


def check_invariants(cfg, rec):
    req, tl = rec.requests, rec.timeline
    # conservation: every request ends completed, rejected or failed with a reason
    assert set(req["status"]) <= {"completed", "rejected", "failed"}
    rej = req[req["status"] == "rejected"]
    assert (rej["reject_reason"] != "").all()
    failed = req["status"] == "failed"
    assert ((req["fail_reason"] != "") == failed).all()
    assert (req.loc[~failed, "completion_s"].notna()).all()
    done = req[req["status"] == "completed"]
    assert (done["generated_tokens"] == done["output_tokens"]).all()
    # a request is rejected exactly when it can never be served
    max_len = cfg.scheduler.max_model_len
    never = (req["input_tokens"] + req["output_tokens"] > max_len) | (
        -(-(req["input_tokens"] + req["output_tokens"] - 1) // cfg.kv_cache.block_size)
        > rec.meta["num_gpu_blocks"] - 1)  # the null block holds no tokens
    assert (never == (req["status"] == "rejected")).all()
    assert (req.loc[failed, "generated_tokens"] < req.loc[failed, "output_tokens"]).all()
    # timestamps are ordered per request
    assert (done["first_scheduled_s"] >= done["arrival_s"]).all()
    assert (done["first_token_s"] >= done["first_scheduled_s"]).all()
    assert (done["completion_s"] >= done["first_token_s"]).all()
    # KV blocks stay within [0, capacity]; batch and budget limits hold
    if len(tl):
        assert tl["kv_blocks_used"].between(0, rec.meta["num_gpu_blocks"] - 1).all()
        assert (tl["batch_size"] <= cfg.scheduler.max_num_seqs).all()
        cap = cfg.scheduler.max_num_batched_tokens
        if cfg.scheduler.name == "sglang":  # SGLang admits a first prompt over
            cap = max(cap, cfg.scheduler.chunk_size)  # max_prefill_tokens, up to a chunk
        assert (tl["scheduled_tokens"] <= cap).all()
        assert (tl["scheduled_tokens"] >= tl["batch_size"]).all()
        assert (np.diff(tl["time_s"]) >= 0).all()


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario())
def test_conservation_and_accounting(case):
    cfg, req = case
    check_invariants(cfg, simulate(cfg, req))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario())
def test_fast_forward_equals_stepping(case):
    """Fast-forwarded decode gives the same timestamps and ITL samples as single steps."""
    cfg, req = case
    a = simulate(cfg, req, keep_itl_samples=True)
    cfg.fast_forward = False
    b = simulate(cfg, req, keep_itl_samples=True)
    cols = ["first_scheduled_s", "first_token_s", "completion_s"]
    np.testing.assert_allclose(a.requests[cols].to_numpy(), b.requests[cols].to_numpy(),
                               rtol=1e-12, atol=1e-12, equal_nan=True)
    assert (a.requests["num_preemptions"] == b.requests["num_preemptions"]).all()
    np.testing.assert_allclose(np.sort(a.itl.samples()), np.sort(b.itl.samples()),
                               rtol=1e-9, atol=1e-12)
    ta, tb = a.timeline, b.timeline
    assert len(ta) == len(tb)
    np.testing.assert_allclose(ta.drop(columns="bound").to_numpy(float),
                               tb.drop(columns="bound").to_numpy(float), rtol=1e-9, atol=1e-12)


def test_preemption_happens_and_is_counted():
    """A cache far too small for the offered load forces recompute preemptions."""
    cfg = tiny_config(num_blocks=20, block_size=4, max_seqs=8, budget=256, max_len=400,
                      roofline=False)
    n = 12
    req = pd.DataFrame({"arrival_time_s": np.zeros(n), "input_tokens": np.full(n, 20),
                        "output_tokens": np.full(n, 40), "client": np.full(n, -1),
                        "think_time_s": np.zeros(n)})
    rec = simulate(cfg, req)
    check_invariants(cfg, rec)
    assert rec.requests["num_preemptions"].sum() > 0
    assert (rec.requests["status"] == "completed").all()


def test_closed_loop_of_rejections_does_not_recurse():
    """Thousands of back-to-back rejections of one client end cleanly (no recursion)."""
    cfg = tiny_config(num_blocks=50, block_size=4, max_seqs=4, budget=64, max_len=100,
                      roofline=False)
    n = 3000
    req = pd.DataFrame({"arrival_time_s": np.where(np.arange(n) < 2, 0.0, np.nan),
                        "input_tokens": np.full(n, 500), "output_tokens": np.full(n, 5),
                        "client": np.arange(n) % 2, "think_time_s": np.zeros(n)})
    rec = simulate(cfg, req)
    assert (rec.requests["status"] == "rejected").all()


# ---- cluster settings: routers, prefill/decode disaggregation, replica failures ----------
@st.composite
def cluster_scenario(draw):
    """``scenario`` on a cluster: 1–4 replicas behind any router, or prefill and decode
    pools, with or without failures (retry limits, permanent losses), stragglers and a
    degraded KV link, and sometimes shared prefixes (``hash_ids``)."""
    from sim.config.cluster import FailureConfig, LinkDegradationConfig, StragglerConfig
    from sim.routers import ROUTERS

    cfg, req = draw(scenario())
    mtbf = draw(st.sampled_from([None, 0.1, 0.5, 3.0]))
    retries = draw(st.sampled_from([None, 0, 2]))
    if mtbf == 0.1 and retries is None:
        # unlimited retries of requests longer than a 0.1 s uptime can go on for hours of
        # simulated failures: bound them where failures are that frequent
        retries = 2
    disagg = draw(st.booleans())
    replicas, prefill, decode = draw(st.integers(1, 4)), draw(st.integers(1, 2)), \
        draw(st.integers(1, 3))
    total = prefill + decode if disagg else replicas
    slow = draw(st.sampled_from(["none", "fraction", "list"]))
    straggler = StragglerConfig(
        factor=draw(st.sampled_from([1.5, 4.0])),
        fraction=draw(st.sampled_from([0.3, 1.0])) if slow == "fraction" else 0.0,
        replicas=sorted(draw(st.sets(st.integers(0, total - 1), min_size=1)))
        if slow == "list" else None,
        mtbs_s=draw(st.sampled_from([None, 0.05, 0.5])),
        duration_s=draw(st.sampled_from([0.02, 0.3])))
    link = LinkDegradationConfig(
        mtbd_s=draw(st.sampled_from([None, 0.02, 0.3])),
        duration_s=draw(st.sampled_from([0.001, 0.05])),
        bandwidth_factor=draw(st.sampled_from([0.01, 0.5])),
        added_latency_us=draw(st.sampled_from([0.0, 500.0])))
    cfg.cluster = ClusterConfig(
        replicas=replicas, router=draw(st.sampled_from(sorted(ROUTERS))),
        disaggregated=disagg, prefill_replicas=prefill, decode_replicas=decode,
        prefix_block_tokens=4,
        # a slow link keeps KV caches on the way long enough for faults to hit them
        kv_transfer_bandwidth=draw(st.sampled_from([None, 1e6])),
        failure=FailureConfig(mtbf_s=mtbf, mttr_s=draw(st.sampled_from([0.01, 0.3, None])),
                              max_retries=retries),
        straggler=straggler, link_degradation=link)
    cfg.seed = draw(st.integers(0, 1000))
    if draw(st.integers(0, 3)):  # mostly constant steps: routing and failures are the point
        cfg.cost_model = ConstantCostConfig(step_time_ms=7.0)
    if draw(st.booleans()):
        family = np.random.default_rng(cfg.seed).integers(0, 3, len(req))
        req["hash_ids"] = [tuple(range(100 * f, 100 * f + n // 4))
                           for f, n in zip(family, req["input_tokens"], strict=True)]
        cfg.kv_cache.prefix_caching = draw(st.booleans())  # hits under every scheduler
    return cfg, req


def check_cluster_invariants(cfg, rec):
    from sim.records import Records

    tl = rec.timeline
    steps = tl[tl["kind"] == 0]
    check_invariants(cfg, Records(rec.requests, steps, rec.itl, rec.meta))
    req, c = rec.requests, cfg.cluster
    # every replica's KV blocks stay within its own capacity
    caps = np.asarray(rec.meta["replica_num_gpu_blocks"])
    assert (steps["kv_blocks_used"] <= caps[steps["replica"]] - 1).all()
    done = req[req["status"] == "completed"]
    n = c.prefill_replicas + c.decode_replicas if c.disaggregated else c.replicas
    assert len(caps) == n and done["replica"].between(0, n - 1).all()
    if c.disaggregated:  # prefilled on the prefill pool, decoded on the decode pool
        assert done["prefill_replica"].between(0, c.prefill_replicas - 1).all()
        assert (done["replica"] >= c.prefill_replicas).all()
        assert (done["kv_transfer_end_s"] <= done["first_token_s"]).all()
        assert (tl["kind"] == 1).sum() >= len(done)
    if c.failure.mtbf_s is None:
        assert (req["num_retries"] == 0).all() and rec.meta["num_failures"] == 0
        assert (req["status"] != "failed").all()
    # a request fails only for a reason its settings allow
    failed = req[req["status"] == "failed"]
    if c.failure.max_retries is None:
        assert (failed["fail_reason"] != "retries_exhausted").all()
    else:
        spent = failed["fail_reason"] == "retries_exhausted"
        assert (failed.loc[spent, "num_retries"] == c.failure.max_retries + 1).all()
        assert (req.loc[req["status"] == "completed", "num_retries"]
                <= c.failure.max_retries).all()
    if c.failure.mttr_s is not None:
        assert (failed["fail_reason"] != "no_replica_left").all()
    # fault events are counted: whole-run stragglers are one episode each
    slow = rec.meta["faults"]["straggler"]["replicas"]
    assert len(slow) == (len(c.straggler.replicas) if c.straggler.replicas else
                         int(np.ceil(c.straggler.fraction * n - 1e-9)))
    if c.straggler.mtbs_s is None:
        assert rec.meta["num_straggler_episodes"] == len(slow)
    if not (c.disaggregated and c.link_degradation.mtbd_s is not None):
        assert rec.meta["num_link_degradation_episodes"] == 0


@settings(max_examples=max(10, EXAMPLES // 3), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(cluster_scenario())
def test_conservation_and_accounting_on_a_cluster(case):
    cfg, req = case
    check_cluster_invariants(cfg, simulate(cfg, req))


@settings(max_examples=max(10, EXAMPLES // 3), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(cluster_scenario())
def test_fast_forward_equals_stepping_on_a_cluster(case):
    """Routing, KV hand-overs and failures see the same state with and without
    fast-forward, so every timestamp and timeline row agrees."""
    cfg, req = case
    a = simulate(cfg, req, keep_itl_samples=True)
    cfg.fast_forward = False
    b = simulate(cfg, req, keep_itl_samples=True)
    cols = ["replica", "first_scheduled_s", "first_token_s", "completion_s", "num_retries",
            "num_preemptions"]
    np.testing.assert_allclose(a.requests[cols].to_numpy(float), b.requests[cols].to_numpy(float),
                               rtol=1e-12, atol=1e-12, equal_nan=True)
    np.testing.assert_allclose(np.sort(a.itl.samples()), np.sort(b.itl.samples()),
                               rtol=1e-9, atol=1e-12)
    assert len(a.timeline) == len(b.timeline)
    np.testing.assert_allclose(a.timeline.drop(columns="bound").to_numpy(float),
                               b.timeline.drop(columns="bound").to_numpy(float),
                               rtol=1e-9, atol=1e-12)


def test_a_request_failed_while_its_tokens_stream_ends_after_them():
    """A decode replica is lost while its API server still streams a request's last token;
    no replica is left, so the request fails, and the client sees the failure after that
    token, not before it (a case hypothesis found: last_token after completion)."""
    import dataclasses

    from sim.config.cluster import FailureConfig, LinkDegradationConfig, StragglerConfig

    cfg = tiny_config(num_blocks=4, block_size=16, max_seqs=6, budget=144, max_len=184,
                      roofline=True, name="sglang", chunk_size=48)
    cfg.hardware = dataclasses.replace(cfg.hardware, hbm_bytes=801408)
    cfg.kv_cache.preemption = "swap"
    cfg.cluster = ClusterConfig(
        replicas=2, router="jsq_tokens", disaggregated=True, prefill_replicas=1,
        decode_replicas=2, prefix_block_tokens=4,
        failure=FailureConfig(mtbf_s=0.1, mttr_s=None),  # lost for good
        straggler=StragglerConfig(factor=4.0, fraction=0.0, duration_s=0.02),
        link_degradation=LinkDegradationConfig(mtbd_s=0.02, duration_s=0.001,
                                               bandwidth_factor=0.01, added_latency_us=0.0))
    cfg.seed = 20
    n = 15
    req = pd.DataFrame({
        "arrival_time_s": np.where(np.arange(n) < 2, 0.0, np.nan),
        "input_tokens": [168, 94, 32, 161, 72, 201, 144, 151, 85, 26, 155, 9, 81, 233, 179],
        "output_tokens": [101, 96, 103, 85, 89, 38, 44, 58, 41, 100, 83, 79, 41, 70, 109],
        "client": np.arange(n) % 2,
        "think_time_s": [0.021914509524300657, 0.0013395872254565683, 0.001651032139354851,
                         0.01862532039489213, 0.008980596033104976, 0.006375725328309242,
                         0.005299979243661917, 0.012297062454935528, 0.009168684256984132,
                         0.011109314648495447, 0.00270107143518964, 0.012822584454680644,
                         0.00909269719000562, 0.014262357277889442, 0.011148747573049827],
        "priority": [1, 0, 0, 1, 2, 2, 0, 1, 1, 0, 0, 2, 1, 2, 1],
        "ttft_slo_ms": [5.0, 5.0, 5.0, 50.0, 500.0, 50.0, 5.0, 5.0, 5.0, 5.0] + [np.inf] * 5})
    rec = simulate(cfg, req)
    check_cluster_invariants(cfg, rec)
    failed = rec.requests[rec.requests["status"] == "failed"]
    assert len(failed) and (failed["fail_reason"] == "no_replica_left").any()
