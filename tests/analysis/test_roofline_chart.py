"""The roofline chart: one marker per operator at its (intensity, achieved FLOP/s), the roofs
per dtype, operators without FLOPs listed aside, and a valid PNG on disk."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.roofline_chart import (
    OPERATOR_GID,
    ROOF_GID,
    roofline_figure,
    write_roofline_chart,
)

PEAKS = {"bf16": 989.4e12, "fp8": 1978.9e12}
BW = 3.35e12


def ops() -> pd.DataFrame:
    """A hand-made step: two GEMMs, an attention kernel, and three operators without FLOPs."""
    return pd.DataFrame({
        "operator": ["qkv_proj", "gate_up_proj", "attn_decode", "norm", "tp_allreduce", "host"],
        "flops": [1.0e12, 8.0e12, 2.0e9, 0.0, 0.0, 0.0],
        "bytes": [2.0e9, 4.0e9, 5.0e8, 1.0e8, 3.0e7, 0.0],
        "time_s": [2.0e-3, 1.0e-2, 2.0e-4, 5.0e-5, 4.0e-5, 6.0e-4],
        "bound": ["memory", "compute", "memory", "memory", "comm", "host"],
    })


def markers(fig) -> dict[str, tuple[float, float]]:
    ax = fig.axes[0]
    return {ln.get_gid().removeprefix(OPERATOR_GID): (ln.get_xdata()[0], ln.get_ydata()[0])
            for ln in ax.get_lines() if (ln.get_gid() or "").startswith(OPERATOR_GID)}


def test_one_marker_per_operator_with_flops_at_its_place():
    t = ops()
    fig = roofline_figure(t, PEAKS, BW, "test step")
    got = markers(fig)
    assert list(got) == ["qkv_proj", "gate_up_proj", "attn_decode"]
    for _, r in t.iloc[:3].iterrows():
        x, y = got[r["operator"]]
        assert x == pytest.approx(r["flops"] / r["bytes"])
        assert y == pytest.approx(r["flops"] / r["time_s"])
    labels = {a.get_text() for a in fig.axes[0].texts}
    assert {"qkv_proj", "gate_up_proj", "attn_decode"} <= labels
    aside = " ".join(t.get_text() for t in fig.texts)
    for name in ("norm", "tp_allreduce", "host"):
        assert name in aside


def test_roofs_meet_at_each_balance_point():
    fig = roofline_figure(ops(), PEAKS, BW)
    roofs = {ln.get_gid().removeprefix(ROOF_GID): ln for ln in fig.axes[0].get_lines()
             if (ln.get_gid() or "").startswith(ROOF_GID)}
    assert set(roofs) == {"memory", "bf16", "fp8"}
    mem = roofs["memory"]
    x, y = np.asarray(mem.get_xdata()), np.asarray(mem.get_ydata())
    below = x < 989.4e12 / BW
    assert y[below] == pytest.approx(BW * x[below])
    assert y.max() == pytest.approx(max(PEAKS.values()))
    for dtype, peak in PEAKS.items():
        xs = np.asarray(roofs[dtype].get_xdata())
        assert np.allclose(roofs[dtype].get_ydata(), peak)
        assert xs.min() >= peak / BW and xs.min() < 1.1 * peak / BW


def test_png_is_written(tmp_path):
    path = tmp_path / "roofline.png"
    write_roofline_chart(ops(), {"bf16": 362.05e12}, 864e9, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_step_without_flops_still_draws_the_roofs(tmp_path):
    t = ops().iloc[3:]
    fig = write_roofline_chart(t, PEAKS, BW, tmp_path / "r.png")
    assert markers(fig) == {}
    assert (tmp_path / "r.png").stat().st_size > 0
