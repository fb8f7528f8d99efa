"""The GPU profiler: shape plans, timing statistics and the tables it writes.

Everything here runs without torch, on fake kernels and a fake timer (its command line and the
CPU smoke test of the real kernels are in ``test_profile_cli.py``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from calibration.aiconfigurator import load_table
from calibration.profile.args import DEFAULT_FULL_BUDGET_S
from calibration.profile.env import parse_smi
from calibration.profile.runner import comm_tables, profile_kernels
from calibration.profile.shapes import (
    ALL_OPS,
    TABLES,
    AttentionShape,
    GemmShape,
    MoeShape,
    calls_per_sample,
    estimate_seconds,
    full_plan,
    make_plan,
    model_gemm_shapes,
    operand_copies,
    tiny_plan,
)
from calibration.profile.timing import Measurement, TimingConfig, WallClockTimer
from calibration.profile.writer import TableResult, collection_meta, save_table

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "data" / "aiconfigurator" / "h100_sxm"
# The columns calibration's fits select from each table (calibration/fit_roofline.py), by kind.
FIT_COLUMNS = {
    "gemm_perf": {"gemm_dtype": "O", "m": "i", "n": "i", "k": "i"},
    "context_attention_perf": {"batch_size": "i", "isl": "i", "num_heads": "i",
                               "num_key_value_heads": "i", "head_dim": "i",
                               "kv_cache_dtype": "O", "window_size": "i"},
    "generation_attention_perf": {"batch_size": "i", "step": "i", "num_heads": "i",
                                  "num_key_value_heads": "i", "head_dim": "i",
                                  "kv_cache_dtype": "O", "window_size": "i"},
    "moe_perf": {"moe_dtype": "O", "num_tokens": "i", "hidden_size": "i", "inter_size": "i",
                 "topk": "i", "num_experts": "i", "moe_tp_size": "i", "moe_ep_size": "i"},
    "nccl_perf": {"op_name": "O", "message_size": "i", "num_gpus": "i"},
}
H200_BF16_FLOPS, H200_HBM_BW = 989e12, 4.8e12


# --- shape plans ---------------------------------------------------------------------------

def test_tiny_plan_covers_every_op_with_distinct_shapes():
    plan = tiny_plan()
    assert set(plan.shapes) == set(TABLES) and plan.comm_sizes
    for shapes in plan.shapes.values():
        assert shapes and len(set(shapes)) == len(shapes)
    assert {s.dtype for s in plan.shapes["gemm"]} == {"bfloat16", "fp8"}
    assert all(s.ctx == 0 for s in plan.shapes["attention_prefill"])
    assert all(s.isl == 1 and s.ctx > 0 for s in plan.shapes["attention_decode"])


def test_full_plan_fits_eight_minutes_on_an_h200_and_covers_the_fit():
    plan = full_plan()
    est = estimate_seconds(plan, H200_BF16_FLOPS, H200_HBM_BW)
    assert 60 < est < DEFAULT_FULL_BUDGET_S
    gemm = plan.shapes["gemm"]
    # held-out splits need many distinct weight shapes and head layouts, small M included
    assert len({(s.n, s.k) for s in gemm}) >= 50
    assert {1, 2, 4, 8, 16}.issubset({s.m for s in gemm})
    assert (6144, 4096) in model_gemm_shapes()  # Llama-3.1-8B QKV at TP1: (32+2·8)·128
    assert (4096, 14336 // 8) in model_gemm_shapes()  # its down projection at TP8
    for op in ("attention_prefill", "attention_decode"):
        layouts = {(s.heads, s.kv_heads, s.head_dim) for s in plan.shapes[op]}
        assert len(layouts) >= 10
    assert max(s.batch * s.isl for s in plan.shapes["attention_prefill"]) <= 32768
    assert len({(s.hidden, s.num_experts) for s in plan.shapes["moe"]}) == 5


def test_make_plan_selects_ops_in_a_seeded_order():
    a, b = make_plan("full", ("gemm", "moe"), seed=1), make_plan("full", ("gemm", "moe"), seed=1)
    assert list(a.shapes) == ["gemm", "moe"] and not a.comm_sizes
    assert a.shapes["gemm"] == b.shapes["gemm"]
    assert sorted(map(repr, a.shapes["gemm"])) == sorted(map(repr, full_plan().shapes["gemm"]))
    assert a.shapes["gemm"] != full_plan().shapes["gemm"]
    assert make_plan("tiny", ALL_OPS).comm_sizes


def test_work_formulas():
    assert GemmShape(2, 3, 4).work() == (48.0, (2 * 4 + 3 * 4) * 2 + 2 * 2 * 3)
    assert GemmShape(2, 3, 4, "fp8").work()[1] == (2 * 4 + 3 * 4) + 2 * 2 * 3
    prefill = AttentionShape(1, 8, 0, 4, 2, 16)
    assert prefill.op == "attention_prefill" and prefill.work()[0] == 2 * 4 * 8 * 8 * 16
    decode = AttentionShape(2, 1, 100, 4, 2, 16)
    assert decode.op == "attention_decode" and decode.work()[0] == 4 * 2 * 4 * 100 * 16
    assert decode.columns()["step"] == 100 and decode.columns()["isl"] == 1
    assert MoeShape(1, 8, 4, 2, 16).touched_experts() == 2
    assert MoeShape(100, 8, 4, 2, 16).touched_experts() == 16


def test_calls_per_sample_and_operand_copies():
    assert calls_per_sample(1e-2) == 1
    assert calls_per_sample(1e-5) == 50
    assert calls_per_sample(1e-9) == 100 and calls_per_sample(0.0) == 100
    assert operand_copies(1e6, 0.0) == 1
    assert operand_copies(200e6, 120e6) == 1
    assert operand_copies(10e6, 120e6) == 12
    assert operand_copies(1e3, 120e6) == 32


# --- timing --------------------------------------------------------------------------------

def test_measurement_stats_in_milliseconds():
    stats = Measurement(np.array([1e-3, 2e-3, 3e-3, 6e-3]), "perf_counter", 4).stats()
    assert stats["latency"] == pytest.approx(3.0)
    assert stats["latency_median"] == pytest.approx(2.5)
    assert stats["latency_min"] == pytest.approx(1.0)
    assert stats["latency_std"] == pytest.approx(np.std([1, 2, 3, 6], ddof=1))
    assert (stats["num_samples"], stats["calls_per_sample"]) == (4, 4)
    for bad in ([], [1e-3, 0.0], [np.nan]):
        with pytest.raises(ValueError):
            Measurement(np.array(bad), "x", 1).stats()


class FakeClock:
    """A clock that only moves when a fake kernel runs."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_wall_clock_timer_counts_calls_and_divides():
    clock, calls = FakeClock(), []

    def kernel(i: int) -> None:
        calls.append(i)
        clock.now += 1e-4

    m = WallClockTimer(clock).measure(kernel, TimingConfig(warmup=2, repeats=3))
    assert m.calls == 5  # 0.5 ms / 0.1 ms per call
    np.testing.assert_allclose(m.samples_s, 1e-4)
    assert len(calls) == 2 + 1 + 3 * 5 and calls[-5:] == [0, 1, 2, 3, 4]
    fixed = WallClockTimer(clock).measure(kernel, TimingConfig(1, 2, fixed_calls=7))
    assert fixed.calls == 7


# --- the pipeline on fake kernels ----------------------------------------------------------

class FakeKernels:
    """Kernels that fail for fp8 (as on a GPU without fp8) and otherwise do nothing."""

    def __init__(self) -> None:
        self.released = 0

    def build(self, shape):
        if getattr(shape, "dtype", "") == "fp8":
            raise NotImplementedError("no fp8 here\nsecond line")

        class Built:
            fn = staticmethod(lambda i: None)
            source = f"fake.{shape.op}"

        Built.shape = shape
        return Built

    def release(self) -> None:
        self.released += 1


class RooflineTimer:
    """Times a fake kernel as its roofline at 1 TFLOP/s and 1 TB/s, advancing a fake clock."""

    def __init__(self, clock: FakeClock, step_s: float = 0.0) -> None:
        self.clock, self.step_s = clock, step_s

    def measure(self, fn, cfg):
        shape = self.current
        flops, nbytes = shape.work()
        t = max(flops / 1e12, nbytes / 1e12) + 1e-6
        self.clock.now += self.step_s
        return Measurement(np.array([t, 1.1 * t, 0.9 * t]), "fake", 1)


def _run_fake(plan, budget_s=None, step_s=0.0):
    clock, kernels = FakeClock(), FakeKernels()
    timer = RooflineTimer(clock, step_s)
    build = kernels.build

    def tracking_build(shape):
        timer.current = shape
        return build(shape)

    kernels.build = tracking_build
    results = dict(profile_kernels(plan, kernels, timer, TimingConfig(1, 3), budget_s,
                                   clock=clock, log=lambda s: None))
    return results, kernels


META = collection_meta({"gpu": "Fake GPU", "torch": "9.9.9"}, "python -m calibration profile",
                       ["out_dir=x"], {"name": "tiny"}, "2026-01-01T00:00:00+00:00", "fake")


def test_fake_pipeline_writes_tables_the_calibration_reads(tmp_path):
    results, kernels = _run_fake(tiny_plan())
    assert kernels.released == tiny_plan().count()
    for op, res in results.items():
        fam, table, op_name = TABLES[op]
        save_table(tmp_path, (fam, "torch", "9.9.9", table), op_name, res, "Fake GPU", META)
    for fam, table, op_name in TABLES.values():
        df, path = load_table(tmp_path, fam, "torch", table)
        assert path == tmp_path / fam / "torch" / "9.9.9" / f"{table}.parquet"
        for col, kind in FIT_COLUMNS[table].items():
            assert df[col].dtype.kind in ("O", "U", "T") if kind == "O" \
                else df[col].dtype.kind == kind, (table, col)
        assert (df["framework"] == "torch").all() and (df["version"] == "9.9.9").all()
        assert (df["device"] == "Fake GPU").all() and (df["op_name"] == op_name).all()
        assert (df["latency"] > 0).all() and (df["latency_s"] == df["latency"] * 1e-3).all()
        assert list(df.columns[:5]) == ["framework", "version", "device", "op_name",
                                        "kernel_source"]
    gemm, _ = load_table(tmp_path, "gemm", "torch", "gemm_perf")
    assert set(gemm["gemm_dtype"]) == {"bfloat16"}  # fp8 failed on the fake device
    big = gemm.loc[gemm["m"] * gemm["n"] * gemm["k"] == (16 * 128 * 256)].iloc[0]
    assert big["latency"] == pytest.approx((2 * 16 * 128 * 256 / 1e12 + 1e-6) * 1e3)
    meta = yaml.safe_load((tmp_path / "gemm" / "torch" / "9.9.9" / "collection_meta.yaml")
                          .read_text())
    entry = meta["tables"]["gemm_perf"]
    assert entry["status"] == "partial" and entry["failed_shapes"] == 4
    assert entry["failures"] == {"NotImplementedError: no fp8 here":
                                 {"count": 4, "first": entry["failures"][
                                     "NotImplementedError: no fp8 here"]["first"]}}
    assert meta["environment"]["gpu"] == "Fake GPU" and meta["command"].startswith("python")
    att = yaml.safe_load((tmp_path / "attention" / "torch" / "9.9.9" / "collection_meta.yaml")
                         .read_text())
    assert set(att["tables"]) == {"context_attention_perf", "generation_attention_perf"}
    assert att["tables"]["context_attention_perf"]["status"] == "complete"


def test_budget_stops_each_op_and_says_so():
    plan = tiny_plan()
    results, _ = _run_fake(plan, budget_s=10.0, step_s=1.0)
    measured = sum(len(r.rows) + sum(map(len, r.failures.values())) for r in results.values())
    assert measured <= 10 + len(results)  # each op may finish the shape it started
    assert all(r.not_measured > 0 for r in results.values())
    assert all(r.status()["status"] == "partial" for r in results.values())
    for r in results.values():
        assert len(r.rows) + sum(map(len, r.failures.values())) + r.not_measured == r.planned


def test_comm_tables_in_the_nccl_layout(tmp_path):
    stats = Measurement(np.array([1e-5, 2e-5]), "cuda_events", 20).stats()
    results = [{"backend": "nccl", "version": "2.21.5", "failures": [
        {"op_name": "alltoall", "message_size": 128, "num_gpus": 2, "error": "RuntimeError: x"}],
        "rows": [{"op_name": op, "message_size": n, "num_gpus": 2, **stats}
                 for op in ("all_reduce", "all_gather") for n in (128, 256)]},
        {"backend": "nccl", "version": "2.21.5", "failures": [],
         "rows": [{"op_name": "all_reduce", "message_size": 128, "num_gpus": 4, **stats}]}]
    tables = comm_tables(results)
    assert set(tables) == {("comm", "nccl", "2.21.5", "nccl_perf")}
    for key, res in tables.items():
        save_table(tmp_path, key, "all_reduce", res, "Fake GPU", META)
    nccl, _ = load_table(tmp_path, "comm", "nccl", "nccl_perf")
    assert len(nccl) == 5 and set(nccl["num_gpus"]) == {2, 4}
    assert set(nccl["op_name"]) == {"all_reduce", "all_gather"}
    assert (nccl["version"] == "2.21.5").all() and (nccl["nccl_dtype"] == "bfloat16").all()
    for col, kind in FIT_COLUMNS["nccl_perf"].items():
        assert nccl[col].dtype.kind == kind or kind == "O", col
    assert (nccl["latency"] > 0).all()
    meta = yaml.safe_load((tmp_path / "comm" / "nccl" / "2.21.5" / "collection_meta.yaml")
                          .read_text())
    assert meta["tables"]["nccl_perf"]["failed_shapes"] == 1


def test_all_failed_table_writes_meta_but_no_parquet(tmp_path):
    res = TableResult(planned=1)
    res.fail({"m": 1}, RuntimeError("CUDA out of memory"))
    path = save_table(tmp_path, ("gemm", "torch", "1", "gemm_perf"), "gemm", res, "X", META)
    assert not path.exists()
    meta = yaml.safe_load((path.parent / "collection_meta.yaml").read_text())
    assert meta["tables"]["gemm_perf"]["rows"] == 0


def test_parse_smi():
    line = "NVIDIA H200, 580.159.04, Enabled, 1980 MHz, 1980 MHz, 3201 MHz, 700.00 W, 35\n"
    smi = parse_smi(line)
    assert smi["smi_name"] == "NVIDIA H200" and smi["smi_driver_version"] == "580.159.04"
    assert smi["smi_clocks_max_sm"] == "1980 MHz"
    assert parse_smi("") == {} and parse_smi("a, b") == {}


def _kind(t: pa.DataType) -> str:
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    return "string" if pa.types.is_string(t) or pa.types.is_large_string(t) else str(t)


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"measured op tables not found at {SHARED}")
def test_our_columns_mirror_the_aiconfigurator_tables(tmp_path):
    results, _ = _run_fake(tiny_plan())
    for op, res in results.items():
        fam, table, op_name = TABLES[op]
        save_table(tmp_path, (fam, "torch", "1", table), op_name, res, "X", META)
    stats = Measurement(np.array([1e-5, 2e-5]), "cuda_events", 20).stats()
    for key, res in comm_tables([{"backend": "nccl", "version": "2", "failures": [], "rows": [
            {"op_name": "all_reduce", "message_size": 128, "num_gpus": 2, **stats}]}]).items():
        save_table(tmp_path, key, "all_reduce", res, "X", META)
    real = {"gemm_perf": "gemm/vllm/0.24.0", "context_attention_perf": "attention/vllm/0.24.0",
            "generation_attention_perf": "attention/vllm/0.24.0", "moe_perf": "moe/vllm/0.24.0",
            "nccl_perf": "comm/nccl/2.29.2"}
    ours = {p.stem: p for p in tmp_path.rglob("*.parquet")}
    assert set(ours) == set(real)
    for table, folder in real.items():
        theirs = pq.read_schema(SHARED / folder / f"{table}.parquet")
        mine = pq.read_schema(ours[table])
        for name in theirs.names:
            assert name in mine.names, (table, name)
            assert _kind(mine.field(name).type) == _kind(theirs.field(name).type), (table, name)


def test_summary_reports_rows_and_rates_below_the_fake_peak(tmp_path):
    from calibration.profile.summary import summarize

    results, _ = _run_fake(tiny_plan())
    for op, res in results.items():
        fam, table, op_name = TABLES[op]
        save_table(tmp_path, (fam, "torch", "1", table), op_name, res, "X", META)
    s = summarize(tmp_path).set_index("table")
    assert s.loc["gemm/torch/1/gemm_perf", "rows"] == 4  # the fp8 half failed
    assert s.loc["moe/torch/1/moe_perf", "rows"] == 3
    # the fake timer runs at 1 TFLOP/s and 1 TB/s plus 1 µs per call
    assert ((s["best_TFLOP/s"] > 0) & (s["best_TFLOP/s"] < 1.0)).all()
    assert ((s["best_TB/s"] > 0) & (s["best_TB/s"] < 1.0)).all()
