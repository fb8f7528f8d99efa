"""Operators of every architecture against hand computations, on tiny inline models.

Work (FLOPs, bytes, shapes) is computed by hand here; times go through the calibrated time
functions of ``sim.cost.operators`` with those hand-derived arguments, so the tests check
which operators the cost model prices and with what shapes, whatever efficiency form the
calibration settles on.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.config import HardwareConfig, ModelConfig, check_model
from sim.cost.attention import window_decode_keys, window_pairs_and_keys
from sim.cost.calibration_file import load_calibration
from sim.cost.operators import (
    attention_time,
    expected_distinct_experts,
    gemm_time,
    moe_time,
)
from sim.cost.roofline import RooflineCostModel

H100 = HardwareConfig(name="h100_sxm", bf16_flops=989.4e12, fp8_flops=1978.9e12,
                      hbm_bandwidth=3.35e12, hbm_bytes=80e9, nvlink_bandwidth=450e9,
                      pcie_bandwidth=64e9)
EFF = load_calibration("h100_sxm", "vllm")[0]
BASE = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, intermediate_size=96, vocab_size=128, max_position_embeddings=1 << 20)


def tiny(**kw) -> ModelConfig:
    m = ModelConfig(name="tiny", **{**BASE, **kw})
    check_model(m)
    return m


MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
           shared_expert_intermediate_size=16)
MLA = dict(num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16,
           qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8)
SLIDING = dict(layer_types=["sliding_attention", "full_attention"], sliding_window=8)
LINEAR = dict(layer_types=["linear_attention", "full_attention"], linear_num_key_heads=2,
              linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
              linear_conv_kernel_dim=4)
ARCHS = {
    "dense": {},
    "moe": MOE,
    "moe_deepseek": {**MOE, **MLA, "num_hidden_layers": 3, "first_k_dense_replace": 1,
                     "dtype": "fp8"},
    "mla_direct_q": {**MLA, "q_lora_rank": 0},
    "sliding": SLIDING,
    "hybrid_linear": {**LINEAR, **MOE, "attn_output_gate": True},
    "gpt_oss_like": {**SLIDING, **MOE, "shared_expert_intermediate_size": 0,
                     "moe_dtype": "mxfp4"},
}


def cost(m: ModelConfig, tp: int = 1, kv_bytes: int = 2, **kw) -> RooflineCostModel:
    return RooflineCostModel(m, H100, tp, kv_bytes, EFF, **kw)


def ops(model: RooflineCostModel, n, c) -> dict:
    return {op.name: op for op in model.breakdown(np.asarray(n), np.asarray(c))}


def test_one_moe_layer_by_hand():
    """8 experts, top-2, 5 tokens: router, experts over E·(1 − (1 − k/E)^T) distinct experts,
    shared expert as a dense MLP."""
    m = tiny(num_hidden_layers=1, **MOE)
    T, E, k, h, inter = 5, 8, 2, 64, 32
    o = ops(cost(m), np.ones(T, int), np.full(T, 10))
    distinct = 8 * (1 - (1 - 2 / 8) ** 5)  # 6.10 experts
    assert expected_distinct_experts(T, E, k) == pytest.approx(distinct)
    pairs = T * k
    ex = o["experts"]
    assert ex.count == 1 and ex.dtype == "bfloat16"
    assert ex.flops == pytest.approx(2 * pairs * h * 3 * inter)  # 122,880
    weights = distinct * 3 * h * inter * 2  # each touched expert's gate/up/down read once
    assert ex.bytes == pytest.approx(weights + pairs * (4 * h + 6 * inter))
    t, cb = moe_time(EFF.moe["bfloat16"], T, h, inter, E, k, distinct, H100.bf16_flops,
                     H100.hbm_bandwidth, 2.0, H100.num_sms)
    assert ex.time_s == pytest.approx(float(t)) and ex.bound == ("compute" if cb else "memory")
    assert ex.time_s >= max(ex.flops / H100.bf16_flops, ex.bytes / H100.hbm_bandwidth)
    router = o["router"]
    assert router.flops == 2 * T * E * h and router.dtype == "bfloat16"
    assert router.time_s == pytest.approx(float(gemm_time(
        EFF.gemm["bfloat16"], T, E, h, H100.bf16_flops, H100.hbm_bandwidth, 2.0)[0]))
    assert o["shared_gate_up_proj"].flops == 2 * T * 32 * h
    assert o["shared_down_proj"].flops == 2 * T * h * 16
    assert "gate_up_proj" not in o  # no dense MLP in an MoE layer


def test_first_k_dense_layers_keep_a_dense_mlp():
    m = tiny(num_hidden_layers=3, first_k_dense_replace=1, **MOE)
    o = ops(cost(m), [1, 1], [4, 4])
    assert o["gate_up_proj"].count == 1 and o["experts"].count == 2


def test_expected_distinct_experts_matches_monte_carlo():
    """Each token picks top-k of E experts uniformly without replacement."""
    rng = np.random.default_rng(7)
    E, k = 64, 6
    for T in (1, 3, 20, 100):
        picks = np.argsort(rng.random((400, T, E)), axis=2)[:, :, :k].reshape(400, -1)
        counts = [len(np.unique(row)) for row in picks]
        se = np.std(counts) / np.sqrt(len(counts)) + 1e-9
        assert abs(np.mean(counts) - expected_distinct_experts(T, E, k)) < 4 * se + 0.05


def test_mla_decode_step_by_hand():
    """Absorbed MLA decode over the latent cache: r + ρ elements per token shared by heads."""
    m = tiny(num_hidden_layers=1, **MLA)
    H, r, rope, nope, v, h, ql = 4, 16, 4, 8, 8, 64, 32
    ctx = np.array([5, 10, 20])
    S, keys = 3, 35 + 3
    o = ops(cost(m), np.ones(S, int), ctx)
    att = o["attn_decode"]
    flops = 2 * H * keys * (2 * r + rope)  # 10,944
    nbytes = keys * (r + rope) * 2 + S * H * (2 * r + rope) * 2  # 1,520 + 864
    assert att.flops == pytest.approx(flops) and att.bytes == pytest.approx(nbytes)
    # one shared latent "KV head" of r + rope dims
    t, _ = attention_time(EFF.attention_decode, flops, nbytes, 1.0, S, H100.bf16_flops,
                          H100.hbm_bandwidth, head_dim=r + rope, kv_heads=1,
                          num_sms=H100.num_sms)
    assert att.time_s == pytest.approx(float(t))
    shapes = {"q_kv_a_proj": (S, ql + r + rope, h), "q_b_proj": (S, H * (nope + rope), ql),
              "q_absorb": (S, H * r, nope), "v_up": (S, H * v, r), "o_proj": (S, h, H * v)}
    for name, (mm, nn, kk) in shapes.items():
        assert o[name].flops == 2 * mm * nn * kk, name
        dt = "bfloat16"
        t, _ = gemm_time(EFF.gemm[dt], mm, nn, kk, H100.bf16_flops, H100.hbm_bandwidth, 2.0)
        assert o[name].time_s == pytest.approx(float(t)), name
    assert o["kv_cache_write"].bytes == S * (r + rope) * (2 + 2)
    assert "kv_b_proj" not in o  # decode never decompresses the cache


def test_mla_prefill_decompresses_the_latent():
    m = tiny(num_hidden_layers=1, **MLA)
    o = ops(cost(m), [6], [10])
    pairs = 6 * (10 + 7 / 2)
    assert o["kv_b_proj"].flops == 2 * 16 * (4 * (8 + 8)) * 16  # all 16 keys through kv_b
    assert o["attn_prefill"].flops == pytest.approx(2 * 4 * pairs * (8 + 4 + 8))


def test_windowed_pairs_match_brute_force():
    rng = np.random.default_rng(3)
    for _ in range(200):
        q, c, w = rng.integers(1, 40), rng.integers(0, 60), rng.integers(1, 30)
        pos = c + np.arange(q)
        pairs, keys = window_pairs_and_keys(q, c, w)
        assert pairs == np.minimum(pos + 1, w).sum()
        assert keys == len(set(range(max(0, c - w + 1), c + q)))
    ctx = rng.integers(0, 50, 9)
    got = window_decode_keys(ctx, 17, 30)
    want = [np.minimum(ctx + 1 + j, 17).sum() for j in range(30)]
    np.testing.assert_array_equal(got, want)


def test_sliding_window_caps_keys():
    m = tiny(**SLIDING)
    short = ops(cost(m), [1, 1], [3, 5])
    long_ = ops(cost(m), [1, 1], [300, 5000])
    assert short["attn_decode_sliding"].bytes < long_["attn_decode_sliding"].bytes
    # past the window the sliding layer reads 8 keys per sequence, whatever the context
    again = ops(cost(m), [1, 1], [900, 90000])
    assert again["attn_decode_sliding"].bytes == long_["attn_decode_sliding"].bytes
    assert again["attn_decode"].bytes > long_["attn_decode"].bytes  # the full layer grows
    kv = 2 * 2 * 16 * 2  # K and V of one token, 2 KV heads of 16
    assert long_["attn_decode_sliding"].bytes == 2 * 8 * kv + 2 * 2 * 4 * 16 * 2
    assert short["attn_decode_sliding"].count == 1 and short["attn_decode"].count == 1


def test_linear_attention_cost_is_constant_in_context():
    m = tiny(**LINEAR)
    a, b = ops(cost(m), [1] * 4, [10] * 4), ops(cost(m), [1] * 4, [50000] * 4)
    linear = [name for name in a if name.startswith("linear_")]
    assert {"linear_qkvz_proj", "linear_conv", "linear_attn_decode", "linear_out_proj"} <= set(
        linear)
    for name in linear:
        assert a[name].time_s == b[name].time_s and a[name].bytes == b[name].bytes, name
    state = 4 * 8 * 8 * 2  # value heads × key dim × value dim, bf16
    assert a["linear_attn_decode"].flops == 4 * 4 * 7 * 8 * 8
    assert a["linear_attn_decode"].bytes == 4 * (2 * state + (2 * 2 * 8 + 2 * 4 * 8 + 2 * 4) * 2)
    assert a["attn_decode"].bytes < b["attn_decode"].bytes  # the full layer still grows


def test_fp8_experts_and_kv():
    bf16 = cost(tiny(**MOE))
    fp8 = cost(tiny(**MOE, dtype="fp8"))
    n, c = [2048], [0]
    eb, ef = ops(bf16, n, c)["experts"], ops(fp8, n, c)["experts"]
    assert ef.dtype == "fp8" and ef.flops == eb.flops and ef.bytes < eb.bytes
    assert ops(fp8, n, c)["router"].dtype == "bfloat16"
    kv8 = cost(tiny(), kv_bytes=1)
    d2, d1 = ops(cost(tiny()), [1], [999])["attn_decode"], ops(kv8, [1], [999])["attn_decode"]
    # two layers; K and V of 1,000 keys, 2 heads of 16: one byte less per element
    assert d2.bytes - d1.bytes == pytest.approx(2 * 1000 * 2 * 2 * 16)


def test_mxfp4_experts_read_4_25_bits_at_bf16_math():
    m = tiny(**ARCHS["gpt_oss_like"])
    ex = ops(cost(m), [1], [4])["experts"]
    assert ex.dtype == "bfloat16"
    per_layer = 2 * 3 * 64 * 32 * 4.25 / 8 + 2 * (4 * 64 + 6 * 32)  # one token touches k = 2
    assert ex.count == 2 and ex.bytes == pytest.approx(2 * per_layer)
    key = "mxfp4" if "mxfp4" in EFF.moe else "bfloat16"  # an MXFP4 fit where there is one
    t, _ = moe_time(EFF.moe[key], 1, 64, 32, 8, 2, 2.0, H100.bf16_flops, H100.hbm_bandwidth,
                    4.25 / 8, H100.num_sms)
    assert ex.time_s == pytest.approx(2 * float(t))


def test_qwen3_next_output_gate_widens_q():
    plain, gated = tiny(), tiny(attn_output_gate=True)
    # two layers; q is 4 heads of 16 (= 64), K and V 2 heads of 16 each
    assert ops(cost(gated), [1], [4])["qkv_proj"].flops == 2 * 2 * 64 * (2 * 64 + 2 * 32)
    assert ops(cost(plain), [1], [4])["qkv_proj"].flops == 2 * 2 * 64 * (64 + 2 * 32)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_breakdown_adds_up(arch):
    model = cost(tiny(**ARCHS[arch]))
    n, c = np.array([1, 1, 37, 5]), np.array([12, 400, 0, 30])
    step = model.step_cost(n, c)
    total = sum(op.time_s for op in model.breakdown(n, c))
    assert total == pytest.approx(step.time_s, rel=1e-12)
    assert step.compute_s + step.memory_s + step.comm_s + step.host_s == pytest.approx(
        step.time_s)


LAYOUTS = [(arch, 1, 1, 1) for arch in sorted(ARCHS)] + [
    ("moe", 2, 1, 2), ("moe_deepseek", 4, 2, 4), ("hybrid_linear", 2, 2, 1),
    ("gpt_oss_like", 2, 2, 2), ("dense", 2, 2, 1)]


@pytest.mark.parametrize("arch,tp,pp,ep", LAYOUTS)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ctx=st.lists(st.integers(1, 3000), min_size=1, max_size=12), k=st.integers(1, 40))
def test_decode_window_equals_stepping(arch, tp, pp, ep, ctx, k):
    model = cost(tiny(**ARCHS[arch]), tp=tp, pp=pp, ep=ep)
    ctx = np.array(ctx)
    window = model.decode_window(ctx, k)
    ones = np.ones(len(ctx), int)
    for j in {0, k // 2, k - 1}:
        step = model.step_cost(ones, ctx + j)
        for arr, value in zip(window, (step.time_s, step.compute_s, step.memory_s, step.comm_s,
                                       step.host_s), strict=True):
            assert arr[j] == pytest.approx(value, rel=1e-12, abs=1e-18)
