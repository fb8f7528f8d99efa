"""The committed calibrated files load through ``load_calibration``, say where they came from
and report held-out errors; with the shared data present, they still describe it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from calibration.data import Measured
from calibration.families import attention, gemm
from calibration.readers import aiconfigurator
from sim.cost.calibration_file import load_calibration

REPO = Path(__file__).resolve().parents[2]
CALIBRATED = REPO / "sim" / "cost" / "calibrated"
FILES = sorted(CALIBRATED.glob("*/*.yaml"))
AIC = REPO.parent / "shared" / "data" / "aiconfigurator"
H100 = {"bf16_flops": 989.4e12, "fp8_flops": 1978.9e12, "hbm_bandwidth": 3.35e12,
        "nvlink_bandwidth": 450e9, "num_sms": 132}


def test_every_backend_of_h100_is_calibrated():
    assert {p.stem for p in (CALIBRATED / "h100_sxm").glob("*.yaml")} >= {"vllm", "sglang",
                                                                          "trtllm"}


@pytest.mark.parametrize("path", FILES, ids=[f"{p.parent.name}/{p.stem}" for p in FILES])
def test_file_loads_and_reports_held_out_error(path):
    eff, doc = load_calibration(path.parent.name, path.stem)
    assert doc["command"].startswith("python -m calibration fit ")
    assert len(doc["data"]["sha256"]) == 64 and doc["data"]["tables"]
    assert "held out" in doc["held_out"]
    for name, err in doc["errors"].items():
        assert err["held_out"]["rows"] > 0, name
        assert np.isfinite(err["held_out"]["median_ape_pct"]), name
    assert {"overhead_ms", "per_seq_us", "fitted"} <= set(doc["host"])
    assert "bfloat16" in eff.gemm and set(eff.comm) >= {"allreduce", "allgather", "alltoall",
                                                        "p2p"}


@pytest.mark.skipif(not AIC.is_dir(), reason=f"shared aiconfigurator data not found at {AIC}")
@pytest.mark.parametrize("backend", ["vllm", "sglang", "trtllm"])
def test_h100_files_match_the_shared_tables(backend):
    from omegaconf import OmegaConf

    eff, doc = load_calibration("h100_sxm", backend)
    root = AIC / "h100_sxm"
    files = [root / t["file"] for t in doc["data"]["tables"].values()]
    assert Measured("aiconfigurator", {}, {}, files, root).sha256() == doc["data"]["sha256"]
    hw = OmegaConf.create(H100)
    frames, _ = aiconfigurator.read(root, backend)
    rng = np.random.default_rng(0)
    g = frames["gemm"]
    g = g[g.dtype == "bfloat16"].iloc[rng.choice(int((frames["gemm"].dtype == "bfloat16").sum()),
                                                 3000, replace=False)]
    _, pred = gemm.predict(eff, g, hw)
    assert np.median(np.abs(pred / g.latency_s - 1)) < 0.06
    for fam in ("attention_prefill", "attention_decode"):
        rows = frames[fam]
        rows = rows[attention.labels(rows, fam) == fam]
        rows = rows.iloc[rng.choice(len(rows), 2000, replace=False)]
        _, pred = attention.predict(eff, fam, rows, hw)
        assert np.median(np.abs(pred / rows.latency_s - 1)) < 0.08, fam
