"""Each family's fit recovers a known efficiency from timings generated through the same time
function the simulator evaluates (``conftest.TRUTH``)."""

from __future__ import annotations

import numpy as np
import pytest

from calibration.families import Settings, attention, comm, elementwise, gemm, moe
from sim.cost.operators import attention_time, comm_time, gemm_time

FAST = Settings(max_train_rows=3000)


def test_gemm_recovers_efficiency_and_launch(hw, synthetic):
    TRUTH = synthetic.TRUTH
    rows = synthetic.gemm_rows()
    rows = rows[rows.dtype == "bfloat16"].reset_index(drop=True)
    e, err = gemm.fit_dtype(rows, hw, "bfloat16", FAST)
    assert err["held_out"]["rows"] > 0
    assert err["held_out"]["median_ape_pct"] < 1.0 and err["held_out"]["p90_ape_pct"] < 3.0
    truth = TRUTH.gemm["bfloat16"]
    for m, n, k in ((4096, 4096, 4096), (8, 8192, 8192)):  # compute-bound, memory-bound
        fitted = gemm_time(e, m, n, k, hw.bf16_flops, hw.hbm_bandwidth, 2.0)[0]
        true = gemm_time(truth, m, n, k, hw.bf16_flops, hw.hbm_bandwidth, 2.0)[0]
        assert fitted == pytest.approx(true, rel=0.03)
    assert e.compute_eta(8192, 8192, 8192) == pytest.approx(0.8, rel=0.05)
    assert e.launch_s == pytest.approx(4e-6, rel=0.2)


@pytest.mark.parametrize("family", ["attention_prefill", "attention_decode"])
def test_attention_recovers_roofline_and_fixed_costs(hw, family, synthetic):
    rows = synthetic.attention_rows(family)
    e, err = attention.fit_family(rows, hw, family, FAST)
    assert err["held_out"]["median_ape_pct"] < 1.5 and err["held_out"]["p90_ape_pct"] < 5.0
    truth = getattr(synthetic.TRUTH, family)
    assert e.launch_s == pytest.approx(truth.launch_s, rel=0.25)
    assert e.unit_s == pytest.approx(truth.unit_s, rel=0.25)
    q = 4096.0 if family == "attention_prefill" else 1.0
    f, b = 4 * 32 * 128 * q * q / 2 * 4, 2 * 8 * 128 * 2 * 4 * max(q, 8192)
    args = (f, b, q, 4, hw.bf16_flops, hw.hbm_bandwidth, 128.0, 8.0)
    assert attention_time(e, *args)[0] == pytest.approx(attention_time(truth, *args)[0], rel=0.05)


def test_comm_recovers_both_regimes(hw, synthetic):
    rows = synthetic.comm_rows()
    rows = rows[rows.kind == "allreduce"].reset_index(drop=True)
    e, err = comm.fit_kind(rows, "allreduce", hw.nvlink_bandwidth, Settings())
    assert err["held_out"]["median_ape_pct"] < 2.0
    t = synthetic.TRUTH.comm["allreduce"]
    for nbytes, gpus in ((2048, 8), (1 << 20, 4), (1 << 28, 2)):
        assert float(comm_time(e, "allreduce", nbytes, gpus, hw.nvlink_bandwidth)) == (
            pytest.approx(float(comm_time(t, "allreduce", nbytes, gpus, hw.nvlink_bandwidth)),
                          rel=0.05))
    assert e.eta_small == pytest.approx(t.eta_small, rel=0.15)


def test_moe_recovers_expert_costs(hw, synthetic):
    e, err = moe.fit_dtype(synthetic.moe_rows(), hw, "bfloat16", FAST)
    assert err["held_out"]["rows"] > 0 and err["held_out"]["median_ape_pct"] < 2.0
    assert e.per_expert_s == pytest.approx(2e-7, rel=0.3)


def test_elementwise_recovers_bandwidth_and_launch(hw):
    import pandas as pd

    nb = np.geomspace(1e4, 1e9, 40)
    rows = pd.DataFrame({"op": "x", "nbytes": nb, "kernels": 1,
                         "latency_s": nb / (hw.hbm_bandwidth * 0.8) + 3e-6,
                         "source": [f"m{i % 8}" for i in range(40)]})
    r = elementwise.fit(rows, hw, Settings())
    assert r.params["elementwise_eta_memory"] == pytest.approx(0.8, rel=1e-3)
    assert r.params["elementwise_launch_s"] == pytest.approx(3e-6, rel=1e-2)


def test_held_out_shapes_are_whole_and_stable(synthetic):
    from calibration.fitting import held_out_mask

    rows = synthetic.gemm_rows(40)
    hold = held_out_mask(rows, ["n", "k"], 0.2, 0)
    per_shape = rows.assign(h=hold).groupby(["n", "k"])["h"].agg(["min", "max"])
    assert (per_shape["min"] == per_shape["max"]).all()  # never part of a shape
    assert 0.05 < per_shape["min"].mean() < 0.4
    sub = rows.iloc[::3].reset_index(drop=True)  # the same shapes in any table
    assert (held_out_mask(sub, ["n", "k"], 0.2, 0) == hold[::3]).all()
    assert not (held_out_mask(rows, ["n", "k"], 0.2, 1) == hold).all()
