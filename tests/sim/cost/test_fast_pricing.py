"""The fast step pricing against its reference, bit for bit.

The simulator prices steps through ``sim.cost.eta.evaluate`` (table plans, memos), one chunk
or one step of attention on Python floats, scalar GEMM alignment without numpy, and memos of
operator prices and of token-count parts. Each is exact by construction: the same
floating-point operations in the same order as the reference. These tests hold them to it:
every calibrated efficiency against ``Eta.reference`` at scalars, 0-d, short and long arrays
(with values whose log2 differs between numpy and ``math``); and whole cost models (dense, MoE,
MLA, sliding window, linear attention; TP, PP, EP; three backends, two GPUs) with warm caches
against a fresh model priced through verbatim copies of the functions as they were before the
fast path, on prefill, decode, mixed steps and decode windows.
"""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_module

import sim.cost.pricing as pricing
from sim.builders import build_cost_model, plain
from sim.cost.attention import AttentionOps
from sim.cost.calibration_file import load_calibration
from sim.cost.eta import _SCALARS, Eta, Term, evaluate
from sim.cost.memo import Memo
from sim.cost.operators import gemm_work, moe_axes, roofline, wave_quantization

CALIBRATED = sorted((Path(pricing.__file__).parent / "calibrated").glob("*/*.yaml"))


def _etas(eff):
    """Every efficiency table of a calibration, by a readable name."""
    out = {"attention_decode": eff.attention_decode, "attention_prefill": eff.attention_prefill}
    out.update({f"gemm_{k}": v for k, v in eff.gemm.items()})
    out.update({f"moe_{k}": v for k, v in eff.moe.items()})
    pairs = {k: (v.compute, v.memory) for k, v in out.items()}
    pairs.update({f"comm_{k}": (v.eta_link,) for k, v in eff.comm.items()})
    return pairs


def _same(a, b) -> bool:
    """Equal bit for bit, of the same type and shape."""
    return (type(a) is type(b) and np.shape(a) == np.shape(b)
            and np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True))


@cache
def _log2_sensitive() -> np.ndarray:
    """Values whose log2 differs in the last bit between numpy and ``math`` (a few in 10⁵):
    the fast path must use each where the reference does. Where this machine's numpy log2
    agrees with ``math`` everywhere (its SIMD kernels vary by build and CPU), ordinary
    values stand in."""
    x = np.exp2(np.random.default_rng(0).uniform(1, 20, 400_000))
    sensitive = x[np.log2(x) != np.array([math.log2(v) for v in x.tolist()])]
    return sensitive if sensitive.size else x[:1000]


def _shapes(axes, rng, n_shapes: int = 40):
    """Shape variables of every kind the callers pass: Python and numpy scalars, 0-d arrays,
    one-element, short and long arrays; inside, below and above the tables, exact knots."""
    sensitive = _log2_sensitive()
    for trial in range(n_shapes):
        n = int(rng.choice([1, 2, 3, 5, 8, 17, 300]))
        shape = {}
        for r, a in enumerate(axes):
            v = np.exp2(rng.uniform(-3, 36, n))
            if trial % 4 == 0:
                v = np.round(v)
            if trial % 7 == 0:
                v[0] = 2.0 ** int(rng.integers(0, 12))  # on a knot (knots are log2 integers)
            if trial % 3 == 1:
                v[:] = rng.choice(sensitive, n)
            kind = (trial + r) % 5
            shape[a] = [float(v[0]), int(max(round(v[0]), 1)), np.float64(v[0]),
                        np.asarray(v[0]), v][kind]
        yield shape


@pytest.mark.parametrize("path", CALIBRATED, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_calibrated_table_equals_its_reference(path):
    eff = load_calibration(path.parent.name, path.stem)[0]
    rng = np.random.default_rng(0)
    for name, etas in _etas(eff).items():
        axes = sorted({a for e in etas for t in e.terms for a in t.axes})
        for shape in _shapes(axes, rng):
            got = evaluate(etas, shape)
            for e, g in zip(etas, got, strict=True):
                assert _same(g, e.reference(**shape)), (name, shape)
                assert _same(e(**shape), e.reference(**shape)), (name, shape)


def test_one_point_semantics_equal_one_element_arrays():
    """``points``: floats standing for one-element arrays give the reference's values of
    one-element arrays (numpy's log2 and exp, not math's)."""
    eff = load_calibration("h100_sxm", "vllm")[0]
    rng = np.random.default_rng(1)
    arrays = frozenset(("kv", "c", "i"))
    for att in (eff.attention_decode, eff.attention_prefill):
        etas = (att.compute, att.memory)
        for _ in range(300):
            shape = {a: float(np.exp2(rng.uniform(-2, 34))) for a in ("q", "s", "u", "d",
                                                                      "kv", "c", "i", "g")}
            shape[str(rng.choice(list(arrays)))] = float(rng.choice(_log2_sensitive()))
            one = {a: np.array([x]) if a in arrays else x for a, x in shape.items()}
            got = evaluate(etas, shape, arrays)
            for e, g in zip(etas, got, strict=True):
                assert g == e.reference(**one)[0]
                assert type(g) is float


def test_unusual_tables_fall_back_or_match():
    """One-axis terms, a single knot, and arrays that broadcast against each other."""
    one_axis = Term.from_dict({"axes": ["m"], "log2_knots": [[0, 3, 7]], "factor": [1, 2, 3]})
    one_knot = Term.from_dict({"axes": ["n", "m"], "log2_knots": [[4], [1, 5]],
                               "factor": [[0.5, 0.9]]})
    two = Term.from_dict({"axes": ["m", "n"], "log2_knots": [[0, 8], [2, 4, 9]],
                          "factor": [[1, 2, 3], [4, 5, 6]]})
    etas = (Eta(0.7, (one_axis, one_knot, two)), Eta(1.3, (two,)), Eta(0.5))
    rng = np.random.default_rng(2)
    cases = [{"m": rng.uniform(0, 600, n), "n": x} for n in (1, 4, 30)
             for x in (3.0, np.asarray(40.0), rng.uniform(0, 900, n))]
    cases += [{"m": rng.uniform(1, 600, (3, 1)), "n": rng.uniform(1, 600, (1, 4))},
              {"m": 0.0, "n": np.array([0.0, 1.0])}, {"m": 5, "n": 7},
              {"m": rng.uniform(1, 600, 9000), "n": 3.0}]  # more points than a plan takes
    for shape in cases:
        for e, g in zip(etas, evaluate(etas, shape), strict=True):
            assert _same(g, e.reference(**shape)), shape


# ---- whole cost models -----------------------------------------------------------------------

MODELS = {
    "llama3_8b": ["model=llama3_8b"],
    "llama70_tp4_pp2": ["model=llama3_70b", "cluster.tensor_parallel_size=4",
                        "cluster.pipeline_parallel_size=2"],
    "qwen3_moe_tp2_ep2": ["model=qwen3_30b_a3b", "cluster.tensor_parallel_size=2",
                          "cluster.expert_parallel_size=2"],
    "deepseek_v3_mla_tp8": ["model=deepseek_v3", "hardware=h200_sxm",
                            "cluster.tensor_parallel_size=8"],
    "gpt_oss_sliding_tp2_pp2": ["model=gpt_oss_120b", "cluster.tensor_parallel_size=2",
                                "cluster.pipeline_parallel_size=2", "backend=sglang"],
    "qwen3_next_linear_tp4": ["model=qwen3_next_80b_a3b", "cluster.tensor_parallel_size=4",
                              "backend=trtllm"],
    "llama3_8b_a100": ["model=llama3_8b", "hardware=a100_80g_sxm"],
}


@cache
def _config(name: str):
    with initialize_config_module("conf", version_base=None):
        return plain(compose("config", overrides=MODELS[name]))


def _batches(rng):
    """(new tokens, cached tokens) of prefill, decode and mixed steps; the same token count
    recurs with different sequence counts (the token-part memo must tell them apart where
    the sequence count matters)."""
    ctx = rng.integers(1, 6000, 64)
    yield np.array([512]), np.array([0])
    yield np.array([300, 700]), np.array([0, 128])
    yield np.array([4000]), np.array([100])  # a chunk over a short cache, sliding windows
    for s in (1, 7, 64):
        yield np.ones(s, int), ctx[:s]
    yield np.ones(5, int), np.array([1, 2, 126, 127, 130])  # around gpt-oss's window of 128
    yield np.r_[np.ones(20, int), 80], np.r_[ctx[:20], 0]  # T = 100, S = 21
    yield np.r_[np.ones(50, int), 50], np.r_[ctx[:50], 3]  # T = 100, S = 51
    yield np.r_[np.ones(3, int), 97], np.r_[ctx[:3], 0]  # T = 100, S = 4


def _price(model, batches) -> list:
    out = []
    for n, c in batches:
        step = model.step_cost(n, c)
        out.append((step.time_s, step.compute_s, step.memory_s, step.comm_s, step.host_s))
        out.append([(o.name, o.count, o.flops, o.bytes, o.time_s, o.bound)
                    for o in model.breakdown(n, c)])
        if (n == 1).all():
            windows = [np.stack(model.decode_window(c, k)) for k in (1, 3, 12, 400)]
            for w in windows:  # stepping ≡ fast-forward, exactly: floats, numpy, long arrays
                np.testing.assert_array_equal(w[:, 0], out[-2])
            out += windows
    return out


# ---- the reference: the pricing functions as they were before the fast path, verbatim, with
# every efficiency evaluated term by term (``Eta.reference``) and numpy arrays throughout


def _ref_attention_axes(flops, nbytes, q_per_seq, num_seqs, head_dim=128.0, kv_heads=8.0):
    if all(isinstance(v, _SCALARS) for v in (flops, nbytes, q_per_seq, num_seqs, head_dim,
                                               kv_heads)):
        s, kvh = max(float(num_seqs), 1.0), max(float(kv_heads), 1.0)
        kv = max(nbytes / s, 1.0)
        return {"q": max(float(q_per_seq), 1.0), "s": s, "u": s * kvh, "d": float(head_dim),
                "kv": kv, "c": max(kv / (kvh * head_dim), 1.0),
                "i": max(flops / max(nbytes, 1.0), 1e-3)}
    s = np.maximum(np.asarray(num_seqs, dtype=np.float64), 1.0)
    kvh = np.maximum(kv_heads, 1.0)
    kv = np.maximum(nbytes / s, 1.0)
    return {"q": np.maximum(q_per_seq, 1.0), "s": s, "u": s * kvh, "d": head_dim, "kv": kv,
            "c": np.maximum(kv / (kvh * head_dim), 1.0),
            "i": np.maximum(flops / np.maximum(nbytes, 1.0), 1e-3)}


def _ref_attention_time(e, flops, nbytes, q_per_seq, num_seqs, peak_flops, peak_bw,
                        head_dim=128.0, kv_heads=8.0, num_sms=132):
    x = _ref_attention_axes(flops, nbytes, q_per_seq, num_seqs, head_dim, kv_heads)
    t, cb = roofline(flops, nbytes, peak_flops, peak_bw, e.compute.reference(**x),
                     e.memory.reference(**x), e.launch_s)
    if e.unit_s:
        units = x["u"] * np.ceil(x["q"] / e.block_q)
        t = t + e.unit_s * units / num_sms
    return t, cb


def _ref_unaligned(e, m, factor):
    if factor == 1.0:
        return 1.0
    m = np.asarray(m, dtype=np.float64)
    return np.where((m > e.align_m) & (np.mod(m, e.align_m) != 0), factor, 1.0)


def _ref_gemm_axes(m, n, k, align_m):
    if all(isinstance(v, _SCALARS) for v in (m, n, k)):
        m, n, k = float(m), float(n), float(k)
        return {"m": m, "n": n, "k": k, "a": 2.0 if m > align_m and m % align_m else 1.0,
                "f": m / (math.ceil(m / 128) * 128), "nk": n * k}
    m, n, k = (np.asarray(v, dtype=np.float64) for v in (m, n, k))
    return {"m": m, "n": n, "k": k,
            "a": np.where((m > align_m) & (np.mod(m, align_m) != 0), 2.0, 1.0),
            "f": m / (np.ceil(m / 128) * 128), "nk": n * k}


def _ref_gemm_time(e, m, n, k, peak_flops, peak_bw, in_bytes, out_bytes=2.0, num_sms=132):
    f, b = gemm_work(m, n, k, in_bytes, out_bytes)
    if e.tile_m and e.tile_n:
        f = f * wave_quantization(m, n, e.tile_m, e.tile_n, num_sms)
    x = _ref_gemm_axes(m, n, k, e.align_m)
    eta_c = e.compute.reference(**x) * _ref_unaligned(e, m, e.unaligned_compute)
    eta_m = e.memory.reference(**x) * _ref_unaligned(e, m, e.unaligned_memory)
    t, cb = roofline(f, b, peak_flops, peak_bw, eta_c, eta_m, e.launch_s)
    if e.partial_block_s:
        t = t + np.where(np.mod(k, e.block_k) != 0, e.partial_block_s, 0.0)
    return t, cb


def _ref_moe_time(e, num_tokens, hidden, inter, num_experts, topk, distinct_experts,
                  peak_flops, peak_bw, w_bytes, num_sms=132):
    pairs = np.asarray(num_tokens, dtype=np.float64) * topk
    flops = 2.0 * pairs * hidden * 3 * inter
    weights = distinct_experts * 3.0 * hidden * inter * w_bytes
    acts = pairs * (hidden * 2 + 2 * inter * 2 + inter * 2 + hidden * 2)
    x = moe_axes(num_tokens, inter, hidden, topk, distinct_experts)
    t, cb = roofline(flops, weights + acts, peak_flops, peak_bw, e.compute.reference(**x),
                     e.memory.reference(**x), e.launch_s)
    return t + e.per_expert_s * np.asarray(distinct_experts, dtype=np.float64), cb


def _ref_point(e, flops, nbytes, q, s, peak_flops, peak_bw, head_dim, kv_heads, num_sms):
    """One step's attention as one-element arrays, as the pricing did before."""
    t, cb = _ref_attention_time(e, np.array([flops]), np.array([nbytes]), q, s, peak_flops,
                                peak_bw, head_dim, kv_heads, num_sms)
    return float(t[0]), bool(cb[0])


@pytest.fixture
def reference_pricing(monkeypatch):
    """Price through the reference: the functions above in place of the fast ones, the
    one-chunk and one-step float paths of ``AttentionOps`` off, collectives' efficiency term
    by term, and no memo remembering anything."""
    monkeypatch.setattr(pricing, "attention_time", _ref_attention_time)
    monkeypatch.setattr(pricing, "gemm_time", _ref_gemm_time)
    monkeypatch.setattr(pricing, "moe_time", _ref_moe_time)
    monkeypatch.setattr(pricing, "attention_point_time", _ref_point)
    monkeypatch.setattr(AttentionOps, "_one_chunk", lambda *a: None)
    monkeypatch.setattr(AttentionOps, "_one_step", lambda *a: None)
    monkeypatch.setattr(Eta, "__call__", Eta.reference)
    monkeypatch.setattr(Memo, "get_or", lambda self, key, compute: compute())
    monkeypatch.setattr(Term, "scalar", lambda self, xs: self._scalar(xs))


def _assert_same(fast: list, slow: list) -> None:
    assert len(fast) == len(slow)
    for a, b in zip(fast, slow, strict=True):
        if isinstance(a, list):
            assert a == b
        else:
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("name", MODELS)
def test_cost_model_equals_reference_pricing(name, request):
    cfg = _config(name)
    fast_model = build_cost_model(cfg)
    batches = list(_batches(np.random.default_rng(3)))
    fast = _price(fast_model, batches)
    again = _price(fast_model, batches)  # now from warm memos
    request.getfixturevalue("reference_pricing")
    slow = [x for b in batches for x in _price(build_cost_model(cfg), [b])]
    _assert_same(fast, slow)
    _assert_same(again, slow)


# ---- token counts priced a block at a time -----------------------------------------------

BLOCK_MODELS = ["llama3_8b", "llama70_tp4_pp2", "qwen3_moe_tp2_ep2", "gpt_oss_sliding_tp2_pp2"]
COUNTS = [1, 2, 255, 256, 257, 511, 1000, 4096, 8191, 8192, 12345]


@pytest.mark.parametrize("name", BLOCK_MODELS)
def test_token_blocks_equal_pricing_each_count_alone(name):
    """A block's row of each count is what the operators priced at that count alone give
    (at its CUDA-graph size; to rounding: numpy's and ``math``'s log2 may differ in the last
    bit), per stage and bound; and equal on every model built from the same config whatever
    order it met the counts in (a count's block is fixed)."""
    cfg = _config(name)
    model = build_cost_model(cfg)
    for T in COUNTS:
        P = model.graphs.padded(T, False)  # the size the step runs at
        alone = np.array(model._token_stage_parts(P, P))
        np.testing.assert_allclose(model._stage_token_parts(T, T), alone, rtol=1e-12,
                                   atol=0, err_msg=f"{name} T={T}")
    other = build_cost_model(cfg)
    for T in reversed(COUNTS):
        assert _same(other._stage_token_parts(T, T), model._stage_token_parts(T, T)), T


def test_bound_parts_of_operators_priced_at_many_counts():
    """Operators priced over an array of counts sum, per count and roof, to what the same
    operators priced at each count give (a GEMM's roof flips from memory to compute as its
    token count grows; the collectives and elementwise kernels keep theirs)."""
    from sim.cost.layers import layer_token_ops
    from sim.cost.roofline import bound_parts

    model = build_cost_model(_config("qwen3_moe_tp2_ep2"))
    counts = np.array([1, 3, 64, 700, 9000])
    many = layer_token_ops(model.p, model.g, model.hw, counts, counts)
    roofs = set()
    for kind, ops in many.items():
        got = bound_parts(ops)
        assert got.shape == (3, len(counts))
        for j, T in enumerate(counts.tolist()):
            one = layer_token_ops(model.p, model.g, model.hw, T, T)[kind]
            roofs |= {op.bound for op in one}
            np.testing.assert_allclose(got[:, j], bound_parts(one), rtol=1e-12, atol=0,
                                       err_msg=f"{kind} T={T}")
    assert roofs == {"compute", "memory", "comm"}


def test_compiled_prices_fill_a_block_of_counts():
    """``Prices.fill_tokens`` fills every count of the asked one's block (not beyond the
    table), each row as the cost model prices that count."""
    from sim.compiled.pricing import DISPATCH_DECODE, DISPATCH_PREFILL, Prices
    from sim.cost.layers import head_token_ops
    from sim.cost.roofline import TOKEN_BLOCK, bound_parts

    model = build_cost_model(_config("llama3_8b"))
    prices = Prices(model, 600, 8)
    prices.fill_tokens(300)
    filled = np.flatnonzero(~np.isnan(prices.tok[:, 0]))
    assert filled.tolist() == list(range(TOKEN_BLOCK, min(2 * TOKEN_BLOCK, 601)))
    prices.fill_tokens(590)  # the last block stops at the table's end
    assert np.isnan(prices.tok[1:TOKEN_BLOCK, 0]).all()
    assert not np.isnan(prices.tok[TOKEN_BLOCK:]).any()
    for T in (256, 300, 511, 512, 600):
        np.testing.assert_array_equal(prices.tok[T, :3], model._stage_token_parts(T, T)[0])
        assert prices.tok[T, DISPATCH_DECODE] == model.graphs.dispatches(T, True)
        assert prices.tok[T, DISPATCH_PREFILL] == model.graphs.dispatches(T, False)
        np.testing.assert_allclose(prices.head_tok[T],
                                   bound_parts(head_token_ops(model.p, model.g, model.hw, T)),
                                   rtol=1e-12, atol=0)
