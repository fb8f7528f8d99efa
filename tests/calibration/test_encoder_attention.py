"""Non-causal (encoder, DiT) attention: the reader, the fit, ``Pricer.encoder_attention`` and its
fallback, ``check``'s report, ``fit keep_rest=true`` and the extrapolation to head dim 128 and
118,800 tokens."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from calibration.check import predict_all, summarize, table
from calibration.data import Measured
from calibration.families import Settings
from calibration.families import encoder_attention as enc
from calibration.readers import aiconfigurator
from sim.cost.calibration_file import load_calibration
from sim.cost.operators import (
    AttentionEfficiency,
    Efficiency,
    Eta,
    Term,
    attention_time,
)
from sim.cost.pricing import Pricer

REPO = Path(__file__).resolve().parents[2]
AIC_H100 = REPO.parent / "shared" / "data" / "aiconfigurator" / "h100_sxm"
FAST = Settings(max_train_rows=3000)
BACKENDS = ["vllm", "sglang", "trtllm"]
DIT_SEQ = 118_800  # HunyuanVideo 720p × 129 frames: the longest DiT sequence we price
EXTRAPOLATION_FACTOR = 1.15  # non-causal vs causal (prefill) η at long sequences, head dim 128


def ramp(axis: str, lo: float, hi: float, at_lo: float) -> Term:
    """A factor rising log-linearly from ``at_lo`` at 2^lo to 1 at 2^hi."""
    return Term((axis,), (np.array([lo, hi]),), np.log(np.array([at_lo, 1.0])))


TRUE_ENCODER = AttentionEfficiency(
    Eta(0.55, (ramp("q", 3, 12, 0.05), Term(("d",), (np.array([6.0, np.log2(80)]),),
                                             np.log(np.array([1.0, 0.8]))))),
    Eta(0.6), 7e-6, 3e-7)


def encoder_rows(e: AttentionEfficiency, hw) -> pd.DataFrame:
    """A grid of encoder-attention shapes timed by ``e`` through the simulator's function."""
    grid = [(b, s, h, d) for b in (1, 2, 8) for s in 2 ** np.arange(0, 16, 1)
            for h in (1, 2, 4, 8, 12, 16, 24, 32) for d in (64, 72, 80) if b * s <= 2**16]
    rows = pd.DataFrame(grid, columns=["batch_size", "seq", "num_heads", "head_dim"])
    rows = rows.assign(dtype="bfloat16", source="synthetic")
    return rows.assign(latency_s=enc.predict_family(e, rows, hw))


def test_reader_renames_and_converts_units(tmp_path):
    folder = tmp_path / "encoder_attention" / "vllm" / "0.24.0"
    folder.mkdir(parents=True)
    pd.DataFrame({"framework": "VLLM", "op_name": "encoder_attention", "batch_size": [1, 2],
                  "isl": [4096, 16], "num_heads": [16, 8], "head_dim": [64, 80],
                  "attn_dtype": "bfloat16", "latency": [1.5, 0.0]}).to_parquet(
        folder / "encoder_attention_perf.parquet")
    frames, used = aiconfigurator.read(tmp_path, "vllm")
    rows = frames["encoder_attention"]
    assert list(rows.columns) == ["batch_size", "seq", "num_heads", "head_dim", "dtype",
                                  "latency_s", "source"]
    assert rows["seq"].tolist() == [4096]  # the zero-latency row is dropped
    assert rows["latency_s"].tolist() == pytest.approx([1.5e-3])
    assert used["encoder_attention"].version == "0.24.0"


def test_fit_recovers_a_known_roofline(hw):
    rows = encoder_rows(TRUE_ENCODER, hw)
    e, err = enc.fit_rows(rows, hw, FAST, prefill=None)
    assert err["held_out"]["rows"] > 0
    assert err["held_out"]["median_ape_pct"] < 1.5 and err["held_out"]["p90_ape_pct"] < 5.0
    assert e.launch_s == pytest.approx(TRUE_ENCODER.launch_s, rel=0.25)
    for b, s, h, d in ((1, 32768, 24, 64), (2, 8192, 3, 80), (1, 4096, 12, 72)):
        f, n = 4.0 * b * s * s * h * d, 8.0 * b * s * h * d
        args = (f, n, s, b, hw.bf16_flops, hw.hbm_bandwidth, d, h, hw.num_sms)
        assert attention_time(e, *args)[0] == pytest.approx(
            attention_time(TRUE_ENCODER, *args)[0], rel=0.03)


def test_head_dim_128_follows_the_prefill_kernels_ratio(hw):
    rows = encoder_rows(TRUE_ENCODER, hw)
    prefill = AttentionEfficiency(Eta(0.6, (ramp("d", 6, 7, 0.7),)), Eta(0.7), 1e-5)
    e, _ = enc.fit_rows(rows, hw, FAST, prefill)
    assert enc.prefill_head_dim_ratio(prefill, 128.0) == pytest.approx(1 / 0.7, rel=1e-6)
    at = {"q": 65536.0, "u": 24.0}
    ratio = float(e.compute(**at, d=128.0) / e.compute(**at, d=64.0))
    assert ratio == pytest.approx(1 / 0.7, rel=1e-3)


@pytest.fixture
def with_encoder(synthetic):
    """The synthetic calibration's efficiencies with a given (or no) encoder block."""
    return lambda encoder: replace(synthetic.TRUTH, attention_encoder=encoder)


def test_pricer_work_and_fallback(hw, with_encoder, synthetic):
    b, sq, skv, h, d = 2, 1024, 4096, 3, 64
    flops = 4 * b * sq * skv * h * d  # QKᵀ and PV: 2 FLOPs per multiply-add each
    nbytes = 2 * (b * sq * h * d + 2 * b * skv * h * d + b * sq * h * d)  # Q, K, V, O bf16
    args = (flops, nbytes, sq, b, hw.bf16_flops, hw.hbm_bandwidth, d, h, hw.num_sms)
    fallback = Pricer(hw, with_encoder(None)).encoder_attention("attn", b, sq, skv, h, d)
    assert (fallback.flops, fallback.bytes, fallback.count) == (flops, nbytes, 1)
    assert fallback.dtype == "bfloat16" and fallback.bound in ("compute", "memory")
    prefill = synthetic.TRUTH.attention_prefill
    assert fallback.time_s == pytest.approx(attention_time(prefill, *args)[0])
    p = Pricer(hw, with_encoder(TRUE_ENCODER))
    op = p.encoder_attention("attn", b, sq, skv, h, d)
    assert op.time_s == pytest.approx(attention_time(TRUE_ENCODER, *args)[0])
    assert op.time_s != pytest.approx(fallback.time_s)
    assert p.encoder_attention("attn", b, sq, skv, h, d) is op  # memoized


def test_efficiency_round_trips_with_and_without_the_block(with_encoder):
    old = with_encoder(None).to_dict()
    assert "attention_encoder" not in old and Efficiency.from_dict(old).attention_encoder is None
    new = Efficiency.from_dict(with_encoder(TRUE_ENCODER).to_dict())
    assert new.attention_encoder.to_dict() == TRUE_ENCODER.to_dict()


def test_check_reports_the_family(hw, with_encoder):
    rows = encoder_rows(TRUE_ENCODER, hw)
    measured = Measured("aiconfigurator", {"encoder_attention": rows})
    fitted = summarize(predict_all(with_encoder(TRUE_ENCODER), measured, hw, FAST))
    assert fitted["encoder_attention"]["n"] == len(rows)
    assert fitted["encoder_attention"]["median_abs_pct_error"] < 1e-6
    assert 0 < fitted["encoder_attention"]["held_out_n"] < len(rows)
    assert "encoder_attention" in table(fitted)
    fallback = summarize(predict_all(with_encoder(None), measured, hw, FAST))
    assert set(fallback) == {"encoder_attention_fallback"}
    assert fallback["encoder_attention_fallback"]["median_abs_pct_error"] > 1.0


def test_fit_keep_rest_adds_the_block_and_keeps_the_file(tmp_path, hw):
    data = tmp_path / "aic"
    folder = data / "encoder_attention" / "vllm" / "0.24.0"
    folder.mkdir(parents=True)
    (data / "gemm").mkdir()  # marks the aiconfigurator layout
    rows = encoder_rows(TRUE_ENCODER, hw)
    rows.rename(columns={"seq": "isl", "dtype": "attn_dtype"}).assign(
        latency=rows["latency_s"] * 1e3).drop(columns=["latency_s", "source"]).to_parquet(
        folder / "encoder_attention_perf.parquet")
    original = REPO / "sim" / "cost" / "calibrated" / "h100_sxm" / "vllm.yaml"
    old = yaml.safe_load(original.read_text())
    old["data"]["dir"] = str(data)
    old["data"]["tables"] = {}  # its tables are not in this folder
    old["parameters"].pop("attention_encoder", None)
    old["errors"].pop("encoder_attention", None)
    old["held_out"] = old["held_out"].replace("; encoder_attention: num_heads, head_dim", "")
    old["assumptions"] = [n for n in old["assumptions"]
                          if not n.startswith(("attention_encoder", "encoder_attention"))]
    out = tmp_path / "vllm.yaml"
    out.write_text(yaml.safe_dump(old, sort_keys=False))
    # a process of its own, as test_commands runs fit: once cli.app has registered its config
    # groups (other test modules import it), an in-process compose takes hardware= as a group
    env = dict(os.environ, OMP_NUM_THREADS="1")
    fit = subprocess.run([sys.executable, "-m", "calibration", "fit", f"data_dir={data}",
                          "hardware=h100_sxm", "backend=vllm", "families=[encoder_attention]",
                          "keep_rest=true", "max_train_rows=3000", f"out={out}",
                          f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert fit.returncode == 0, fit.stderr
    new = yaml.safe_load(out.read_text())
    assert {k: v for k, v in new["parameters"].items() if k != "attention_encoder"} == \
        old["parameters"]
    assert new["errors"]["encoder_attention"]["held_out"]["median_ape_pct"] < 1.5
    assert {k: v for k, v in new["errors"].items() if k != "encoder_attention"} == old["errors"]
    assert new["command"] == old["command"] and new["host"] == old["host"]
    assert list(new["data"]["tables"]) == ["encoder_attention"]
    assert new["data"]["sha256"] == Measured("aiconfigurator", {}, {}, [
        folder / "encoder_attention_perf.parquet"], data).sha256()
    assert "encoder_attention: num_heads, head_dim" in new["held_out"]
    assert new["assumptions"][:len(old["assumptions"])] == old["assumptions"]
    assert Efficiency.from_dict(new["parameters"]).attention_encoder is not None


@pytest.mark.parametrize("backend", BACKENDS)
def test_dit_shapes_extrapolate_like_causal_attention(backend, hw):
    """At head dim 128 and 118,800 tokens (beyond both tables) the encoder block's time is
    within ``EXTRAPOLATION_FACTOR`` of the prefill efficiency's on the same work: the causal
    kernel's η is what a non-causal one reaches at long sequences (equal at head dim 64)."""
    eff, _ = load_calibration("h100_sxm", backend)
    assert eff.attention_encoder is not None
    fitted, prefill = Pricer(hw, eff), Pricer(hw, replace(eff, attention_encoder=None))
    for heads, d in ((24, 128), (3, 128), (24, 64), (3, 64)):
        a = fitted.encoder_attention("attn", 1, DIT_SEQ, DIT_SEQ, heads, d)
        b = prefill.encoder_attention("attn", 1, DIT_SEQ, DIT_SEQ, heads, d)
        assert a.flops == b.flops and a.bound == "compute"
        ratio = a.time_s / b.time_s
        assert 1 / EXTRAPOLATION_FACTOR < ratio < EXTRAPOLATION_FACTOR, (heads, d, ratio)
        eta = a.flops / a.time_s / hw.bf16_flops
        assert 0.3 < eta < 0.8, (heads, d, eta)
    # head dim 128 runs at a higher η than 64, as the causal kernels measured do
    assert (fitted.encoder_attention("attn", 1, DIT_SEQ, DIT_SEQ, 24, 128).time_s / 2
            < fitted.encoder_attention("attn", 1, DIT_SEQ, DIT_SEQ, 24, 64).time_s)


@pytest.mark.skipif(not AIC_H100.is_dir(), reason=f"shared aiconfigurator tables not found at "
                    f"{AIC_H100}")
@pytest.mark.parametrize("backend", BACKENDS)
def test_committed_block_predicts_the_shared_tables(backend, hw):
    """The committed block on the measured rows, and at head dim 128 against the causal
    kernel's measured η at the longest prompt of the prefill table."""
    eff, doc = load_calibration("h100_sxm", backend)
    frames, used = aiconfigurator.read(AIC_H100, backend)
    assert doc["data"]["tables"]["encoder_attention"]["file"] == str(
        used["encoder_attention"].path.relative_to(AIC_H100))
    rows = frames["encoder_attention"]
    _, pred = enc.predict(eff, rows, hw)
    ape = np.abs(pred / rows["latency_s"].to_numpy() - 1)
    assert np.median(ape) < 0.06 and np.percentile(ape, 90) < 0.16
    pre = frames["attention_prefill"]
    pre = pre[(pre.head_dim == 128) & (pre.window == 0) & (pre.kv_dtype == "bfloat16")
              & (pre.q == pre.q.max())]
    flops = 4.0 * pre.batch_size * pre.num_heads * 128 * pre.q * (pre.q + 1) / 2
    causal_eta = float((flops / pre.latency_s).max() / hw.bf16_flops)
    op = Pricer(hw, eff).encoder_attention("attn", 1, DIT_SEQ, DIT_SEQ, 24, 128)
    ratio = op.flops / op.time_s / hw.bf16_flops / causal_eta
    assert 1 / EXTRAPOLATION_FACTOR < ratio < EXTRAPOLATION_FACTOR, ratio


def test_old_files_without_the_block_still_load():
    doc = yaml.safe_load((REPO / "sim" / "cost" / "calibrated" / "h100_sxm" /
                          "vllm.yaml").read_text())
    doc["parameters"].pop("attention_encoder")
    assert Efficiency.from_dict(doc["parameters"]).attention_encoder is None
