"""The roofline cost model against hand computations."""

from __future__ import annotations

import numpy as np
import pytest
from omegaconf import OmegaConf

from sim.builders import build_cost_model, plain
from sim.cost.calibration_file import load_calibration
from sim.cost.operators import attention_time, gemm_time

H100_BF16, H100_BW = 989.4e12, 3.35e12


@pytest.fixture
def llama8b(compose_cfg):
    return build_cost_model(plain(compose_cfg()))


@pytest.fixture
def eff():
    return load_calibration("h100_sxm", "vllm")[0]


def by_name(ops):
    return {op.name: op for op in ops}


def test_qkv_projection_decode_by_hand(llama8b, eff):
    """One decode token through Llama-3.1-8B's QKV GEMM: 1×4096 · 4096×6144, bf16."""
    op = by_name(llama8b.breakdown(np.array([1]), np.array([100])))["qkv_proj"]
    flops = 2 * 1 * 6144 * 4096                       # 50,331,648
    nbytes = 2 * (1 * 4096 + 4096 * 6144) + 2 * 1 * 6144  # 50,352,128
    t, cb = gemm_time(eff.gemm["bfloat16"], 1, 6144, 4096, H100_BF16, H100_BW, 2.0,
                      num_sms=132)
    assert op.count == 32
    assert op.flops == pytest.approx(32 * flops)
    assert op.bytes == pytest.approx(32 * nbytes)
    assert op.intensity == pytest.approx(flops / nbytes)  # ≈ 1 FLOP/B, far below the ridge
    assert op.bound == "memory" and not cb
    assert op.time_s == pytest.approx(32 * float(t), rel=1e-12)
    # 50 MB can take no less than 15 µs at 3.35 TB/s; a calibrated GEMM gets within 2×
    assert nbytes / H100_BW < op.time_s / 32 < 2 * nbytes / H100_BW


def test_decode_attention_by_hand(llama8b, eff):
    """10 sequences with 1000 cached tokens each: read K and V of 10×1001 tokens per layer."""
    op = by_name(llama8b.breakdown(np.ones(10, int), np.full(10, 1000)))["attn_decode"]
    keys = 10 * 1001
    nbytes = keys * 2 * 8 * 128 * 2 + 2 * 10 * 32 * 128 * 2
    flops = 4 * 32 * 128 * keys
    t, _ = attention_time(eff.attention_decode, flops, nbytes, 1.0, 10, H100_BF16, H100_BW,
                          head_dim=128, kv_heads=8, num_sms=132, heads=32)
    assert op.bytes == pytest.approx(32 * nbytes)
    assert op.flops == pytest.approx(32 * flops)
    assert op.bound == "memory"
    assert op.time_s == pytest.approx(32 * float(t), rel=1e-12)
    assert op.time_s / 32 > nbytes / H100_BW


def test_prefill_attention_is_causal(llama8b):
    """A 4096-token prompt does 4096·4097/2 query-key pairs per head, not 4096²."""
    op = by_name(llama8b.breakdown(np.array([4096]), np.array([0])))["attn_prefill"]
    assert op.flops == pytest.approx(32 * 4 * 32 * 128 * 4096 * 4097 / 2)


def test_ridge_point_decides_the_roof(llama8b):
    """GEMMs are memory-bound at decode batch sizes and compute-bound for long prefills."""
    ridge = H100_BF16 / H100_BW  # ≈ 295 FLOP/B
    small = by_name(llama8b.breakdown(np.ones(8, int), np.full(8, 500)))["gate_up_proj"]
    large = by_name(llama8b.breakdown(np.array([8192]), np.array([0])))["gate_up_proj"]
    assert small.intensity < ridge and small.bound == "memory"
    assert large.intensity > ridge and large.bound == "compute"


def test_step_cost_is_the_sum_of_the_breakdown(llama8b):
    n = np.array([1, 1, 1, 700, 64])
    c = np.array([300, 2000, 15, 0, 1024])
    cost = llama8b.step_cost(n, c)
    ops = llama8b.breakdown(n, c)
    assert cost.time_s == pytest.approx(sum(op.time_s for op in ops), rel=1e-12)
    assert cost.host_s == pytest.approx(by_name(ops)["host_overhead"].time_s)
    assert cost.compute_s + cost.memory_s + cost.comm_s + cost.host_s == pytest.approx(cost.time_s)


def test_decode_window_matches_single_steps(llama8b):
    ctx = np.array([10, 500, 3000, 77])
    times = llama8b.decode_window(ctx, 50)[0]
    for j in (0, 1, 17, 49):
        assert times[j] == llama8b.step_cost(np.ones(4, int), ctx + j).time_s


def test_tensor_parallel_splits_weights_and_adds_allreduce(compose_cfg):
    tp1 = build_cost_model(plain(compose_cfg("model=llama3_70b", "cluster.tensor_parallel_size=2")))
    tp4 = build_cost_model(plain(compose_cfg("model=llama3_70b", "cluster.tensor_parallel_size=4")))
    n, c = np.ones(16, int), np.full(16, 1000)
    o1, o4 = by_name(tp1.breakdown(n, c)), by_name(tp4.breakdown(n, c))
    assert o4["gate_up_proj"].bytes == pytest.approx(o1["gate_up_proj"].bytes / 2, rel=0.01)
    assert o4["tp_allreduce"].count == 2 * 80 + 1 and o4["tp_allreduce"].bound == "comm"
    assert tp4.step_cost(n, c).time_s < tp1.step_cost(n, c).time_s


def test_calibrated_file_reports_held_out_error():
    _, doc = load_calibration("h100_sxm", "vllm")
    for name, err in doc["errors"].items():
        assert err["held_out"]["rows"] > 0, name
        assert np.isfinite(err["held_out"]["median_ape_pct"])
    assert OmegaConf.create(doc)["command"].startswith("python -m calibration")


def test_fp8_weights_speed_up_layer_gemms_only(compose_cfg):
    """FP8 checkpoints: layer GEMMs at the FP8 roof; LM head and attention stay bf16."""
    bf16 = build_cost_model(plain(compose_cfg()))
    fp8 = build_cost_model(plain(compose_cfg("model.dtype=fp8")))
    n, c = np.array([4096]), np.array([0])
    ob, of = by_name(bf16.breakdown(n, c)), by_name(fp8.breakdown(n, c))
    assert of["attn_prefill"].time_s == ob["attn_prefill"].time_s
    assert of["lm_head"].time_s == ob["lm_head"].time_s
    assert of["gate_up_proj"].time_s < 0.7 * ob["gate_up_proj"].time_s
