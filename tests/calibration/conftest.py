"""Synthetic measurements for the calibration tests: a known efficiency, tables generated from
it through the simulator's time functions, written in the aiconfigurator and Vidur layouts."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from sim.cost.operators import Efficiency, Eta, GemmEfficiency, Term

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "data"
AIC_H100 = SHARED / "aiconfigurator" / "h100_sxm"
VIDUR = SHARED / "vidur"
H100 = OmegaConf.create({"name": "h100_sxm", "bf16_flops": 989.4e12, "fp8_flops": 1978.9e12,
                         "hbm_bandwidth": 3.35e12, "nvlink_bandwidth": 450e9, "num_sms": 132,
                         "calibration": "h100_sxm"})


def ramp(axis: str, lo: float, hi: float, at_lo: float) -> Term:
    """A factor over one axis rising from ``at_lo`` at 2^lo to 1 at 2^hi (log-linear)."""
    return Term((axis,), (np.array([lo, hi]),), np.log(np.array([at_lo, 1.0])))


TRUE_GEMM = GemmEfficiency(Eta(0.8, (ramp("m", 0, 10, 0.3),)), Eta(0.85, (ramp("n", 5, 14, 0.5),)),
                           4e-6)
TRUTH = Efficiency.from_dict({
    "gemm": {"bfloat16": TRUE_GEMM.to_dict(), "fp8": TRUE_GEMM.to_dict()},
    "moe": {"bfloat16": {**TRUE_GEMM.to_dict(), "per_expert_s": 2e-7}},
    "attention_prefill": {"compute": {"scale": 0.6, "terms": [ramp("q", 4, 12, 0.2).to_dict()]},
                          "memory": 0.7, "launch_s": 1e-5, "unit_s": 2e-6},
    "attention_decode": {"compute": 0.3, "memory": {"scale": 0.8,
                                                    "terms": [ramp("c", 6, 16, 0.3).to_dict()]},
                         "launch_s": 8e-6, "unit_s": 1e-6},
    "comm": {k: {"eta_link": 0.7, "latency_s": 5e-6, "eta_small": 0.4 if k == "allreduce" else 0,
                 "latency_small_s": 3e-6} for k in ("allreduce", "allgather", "alltoall")},
    "elementwise_eta_memory": 0.8, "elementwise_launch_s": 3e-6,
})


@pytest.fixture
def hw():
    """H100 peaks as the calibration reads them."""
    return H100


def gemm_rows(n_shapes: int = 12, seed: int = 0) -> pd.DataFrame:
    """GEMM rows (bf16 and fp8) over m = 1…16384 for random weight shapes, latency = TRUTH."""
    from sim.cost.operators import gemm_time

    rng = np.random.default_rng(seed)
    nk = rng.choice(2 ** np.arange(7, 15), size=(n_shapes, 2))
    ms = 2 ** np.arange(0, 15)
    rows = pd.DataFrame([(d, m, n, k) for d in ("bfloat16", "fp8") for (n, k) in nk for m in ms],
                        columns=["dtype", "m", "n", "k"])
    for d, idx in rows.groupby("dtype").indices.items():
        peak, b = (H100.bf16_flops, 2.0) if d == "bfloat16" else (H100.fp8_flops, 1.0)
        r = rows.iloc[idx]
        rows.loc[rows.index[idx], "latency_s"] = gemm_time(
            TRUTH.gemm[d], r.m.to_numpy(float), r.n.to_numpy(float), r.k.to_numpy(float), peak,
            H100.hbm_bandwidth, b)[0]
    return rows.assign(source="synthetic")


def attention_rows(family: str) -> pd.DataFrame:
    """Attention rows over batch × length × head layouts, latency = TRUTH."""
    from calibration.families import attention

    heads = [(8, 1, 128), (16, 2, 128), (32, 8, 128), (32, 4, 64), (64, 8, 128), (12, 4, 64),
             (24, 8, 128), (40, 8, 128), (48, 8, 64), (16, 16, 64), (28, 4, 128), (8, 8, 256)]
    lengths = 2 ** np.arange(0, 14, 1) if family == "attention_prefill" else 2 ** np.arange(0, 17)
    rows = pd.DataFrame([(b, L, h, kv, d) for (h, kv, d) in heads for b in 2 ** np.arange(0, 9)
                         for L in lengths], columns=["batch_size", "L", "num_heads",
                                                     "num_kv_heads", "head_dim"])
    rows = rows.assign(q=rows.L if family == "attention_prefill" else 1,
                       ctx=0 if family == "attention_prefill" else rows.L,
                       kv_dtype="bfloat16", window=0, source="synthetic").drop(columns="L")
    e = TRUTH.attention_prefill if family == "attention_prefill" else TRUTH.attention_decode
    return rows.assign(latency_s=attention.predict_family(e, rows, H100, family))


def comm_rows() -> pd.DataFrame:
    """Custom all-reduce (graph) and NCCL all-gather rows, latency = TRUTH."""
    from sim.cost.operators import comm_time

    out = []
    for kind, impl, variant in (("allreduce", "custom", "graph"), ("allgather", "nccl", "nccl")):
        for p, s in itertools.product((2, 4, 8), 2.0 ** np.arange(8, 31)):
            t = float(comm_time(TRUTH.comm[kind], kind, s, p, H100.nvlink_bandwidth))
            out.append((kind, impl, variant, p, s, "bfloat16", t, "synthetic"))
    return pd.DataFrame(out, columns=["kind", "impl", "variant", "num_gpus", "nbytes", "dtype",
                                      "latency_s", "source"])


def moe_rows() -> pd.DataFrame:
    """Balanced-routing MoE rows without EP, latency = TRUTH."""
    from calibration.families import moe

    geoms = [(2048, 768, 8, 128), (4096, 1536, 8, 128), (7168, 2048, 8, 256), (4096, 14336, 2, 8),
             (6144, 2560, 8, 160), (2048, 512, 8, 256), (3072, 1024, 8, 256), (5120, 8192, 1, 16),
             (2816, 704, 8, 128), (6144, 3072, 4, 128)]
    rows = pd.DataFrame([("bfloat16", T, h, i, k, E, tp, 1, "balanced")
                         for (h, i, k, E) in geoms for tp in (1, 2, 4)
                         for T in 2 ** np.arange(0, 15)],
                        columns=["dtype", "num_tokens", "hidden", "inter", "topk", "num_experts",
                                 "tp", "ep", "distribution"])
    return rows.assign(latency_s=moe.predict_dtype(TRUTH.moe["bfloat16"], rows, H100,
                                                   "bfloat16"), source="synthetic")


def write_aiconfigurator(root: Path, framework: str = "vllm", version: str = "0.24.0") -> Path:
    """A tiny aiconfigurator-layout folder of TRUTH timings (latency in ms, native columns)."""
    def put(op: str, fw: str, table: str, df: pd.DataFrame, ver: str = version):
        folder = root / op / fw / ver
        folder.mkdir(parents=True, exist_ok=True)
        df.assign(latency=df.pop("latency_s") * 1e3).drop(columns="source").to_parquet(
            folder / f"{table}.parquet")

    g = gemm_rows(16).sample(frac=0.5, random_state=0)
    put("gemm", framework, "gemm_perf", g.rename(columns={"dtype": "gemm_dtype"}))
    for fam, table in (("attention_prefill", "context_attention_perf"),
                       ("attention_decode", "generation_attention_perf")):
        a = attention_rows(fam).sample(n=600, random_state=0)
        a = a.rename(columns={"num_kv_heads": "num_key_value_heads",
                              "kv_dtype": "kv_cache_dtype", "window": "window_size"})
        a = a.assign(isl=a.pop("q"), step=0) if fam == "attention_prefill" else a.assign(
            isl=1, step=a.pop("ctx")).drop(columns="q")
        put("attention", framework, table, a.drop(columns="ctx", errors="ignore"))
    c = comm_rows()
    ar = c[c.kind == "allreduce"]
    put("comm", framework, "custom_allreduce_perf", pd.DataFrame(
        {"allreduce_dtype": "bfloat16", "num_gpus": ar.num_gpus, "kernel_source": "custom_graph",
         "message_size": ar.nbytes / 2, "latency_s": ar.latency_s, "source": ar.source}))
    ag = c[c.kind == "allgather"]
    put("comm", "nccl", "nccl_perf", pd.DataFrame(
        {"op_name": "all_gather", "nccl_dtype": "half", "num_gpus": ag.num_gpus,
         "message_size": ag.nbytes / 2, "latency_s": ag.latency_s, "source": ag.source}),
        "2.29.2")
    m = moe_rows().sample(n=300, random_state=0)
    put("moe", framework, "moe_perf", m.rename(columns={
        "dtype": "moe_dtype", "hidden": "hidden_size", "inter": "inter_size", "tp": "moe_tp_size",
        "ep": "moe_ep_size"}))
    return root


@pytest.fixture
def synthetic():
    """This module: TRUTH and the generators of synthetic rows and folders."""
    import sys

    return sys.modules[__name__]
