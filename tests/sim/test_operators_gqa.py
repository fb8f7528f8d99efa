"""Efficiency tables over the GQA ratio and the GEMM quantization axes, as the simulator
evaluates them: ``Eta.fix`` folds a fixed variable into the other axes exactly, the cost model
fixes a model's query heads per KV head once, and the GEMM axes are the same for scalars and
arrays."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from sim.config import HardwareConfig, ModelConfig, check_model
from sim.cost.calibration_file import load_calibration
from sim.cost.gemm import GemmEfficiency, gemm_axes, gemm_time
from sim.cost.operators import AttentionEfficiency, Eta, Term, attention_time
from sim.cost.roofline import RooflineCostModel

H100 = HardwareConfig(name="h100_sxm", bf16_flops=989.4e12, fp8_flops=1978.9e12,
                      hbm_bandwidth=3.35e12, hbm_bytes=80e9, nvlink_bandwidth=450e9,
                      pcie_bandwidth=64e9)
RNG = np.random.default_rng(0)
GU = Term(("g", "u"), (np.arange(0.0, 8.0, 0.5), np.arange(0.0, 17.0)), RNG.normal(size=(16, 17)))
G = Term(("g",), (np.array([4.0, 7.0]),), np.log(np.array([1.0, 0.2])))
UC = Term(("u", "c"), (np.arange(0.0, 17.0), np.arange(0.0, 19.0)), RNG.normal(size=(17, 19)))
CG = Term(("c", "g"), (np.arange(0.0, 19.0), np.arange(0.0, 8.0)), RNG.normal(size=(19, 8)))


@pytest.mark.parametrize("g", [1.0, 1.5, 4.0, 48.0, 1000.0])
def test_fix_folds_a_variable_into_the_other_axes(g):
    e = Eta(0.7, (GU, G, UC, CG))
    fixed = e.fix(g=g)
    assert all("g" not in t.axes for t in fixed.terms) and len(fixed.terms) == 3
    u, c = 2.0 ** RNG.uniform(-2, 18, 200), 2.0 ** RNG.uniform(-2, 20, 200)
    np.testing.assert_allclose(fixed(u=u, c=c), e.reference(g=g, u=u, c=c), rtol=1e-12)
    assert fixed(u=3.0, c=70.0) == pytest.approx(e.reference(g=g, u=3.0, c=70.0), rel=1e-12)
    assert e.fix(d=64.0) is e  # no term over d: the same object


def _model(heads: int, kv_heads: int) -> ModelConfig:
    m = ModelConfig(name="tiny", num_hidden_layers=1, hidden_size=512,
                    num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=64,
                    intermediate_size=256, vocab_size=128, max_position_embeddings=1 << 20)
    check_model(m)
    return m


@pytest.mark.parametrize(("heads", "kv_heads"), [(8, 8), (32, 8), (64, 1)])
def test_cost_model_prices_decode_at_its_group(heads, kv_heads):
    """Decode attention of a model with H query and Hkv KV heads costs what ``attention_time``
    gives with heads = H, through a table that varies steeply with the group."""
    eff = load_calibration("h100_sxm", "vllm")[0]
    dec = eff.attention_decode
    dec = replace(dec, memory=Eta(dec.memory.scale, dec.memory.terms + (G,)))
    eff = replace(eff, attention_decode=dec)
    model = RooflineCostModel(_model(heads, kv_heads), H100, 1, 2, eff)
    ctx = np.array([1000, 3000, 50])
    for op in model.breakdown(np.ones(3, int), ctx):
        if op.name == "attn_decode":
            break
    t, _ = attention_time(dec, op.flops, op.bytes, 1.0, 3, H100.bf16_flops, H100.hbm_bandwidth,
                          64.0, float(kv_heads), H100.num_sms, heads=float(heads))
    assert op.time_s == pytest.approx(float(t), rel=1e-12)
    if heads // kv_heads > 16:  # the group term binds: slower than at g = 1
        assert op.time_s > 1.5 * float(attention_time(
            dec, op.flops, op.bytes, 1.0, 3, H100.bf16_flops, H100.hbm_bandwidth, 64.0,
            float(kv_heads), H100.num_sms)[0])


def test_gemm_axes_scalar_and_array_agree():
    m = np.array([1, 16, 17, 129, 256, 257, 4097, 16384], dtype=float)
    n, k = np.full(8, 5120.0), np.full(8, 8192.0)
    arr = gemm_axes(m, n, k)
    for i in range(len(m)):
        one = gemm_axes(int(m[i]), 5120, 8192)
        for axis, v in one.items():
            assert v == pytest.approx(float(np.broadcast_to(arr[axis], m.shape)[i])), axis
    assert list(arr["a"]) == [1, 1, 2, 2, 1, 2, 2, 1]
    assert arr["f"][3] == pytest.approx(129 / 256) and arr["f"][4] == 1.0
    assert arr["f"][0] == 1 / 128 and arr["nk"][0] == 5120 * 8192


def test_partial_k_block_cost_applies_to_partial_blocks_only():
    e = GemmEfficiency(Eta(0.8), Eta(0.8), 2e-6, partial_block_s=1e-4)
    t = [float(gemm_time(e, 8, 4096, k, 1e15, 3e12, 1.0)[0]) for k in (64, 128, 192)]
    assert t[0] - 1e-4 < t[1] < t[0] and t[2] > t[1] + 9e-5
    arr = gemm_time(e, 8.0, 4096.0, np.array([64.0, 128.0, 192.0]), 1e15, 3e12, 1.0)[0]
    np.testing.assert_allclose(arr, t, rtol=1e-12)


def test_attention_efficiency_without_group_terms_is_kept():
    e = AttentionEfficiency(Eta(0.5), Eta(0.8, (UC,)), 1e-6)
    assert e.for_group(4.0) is e
