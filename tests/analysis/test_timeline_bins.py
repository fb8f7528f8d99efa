"""Time-binned, step-time-weighted means of timeline columns (``analysis.timeline_bins``)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.timeline_bins import binned

BATCH = {"batch": (["batch_size"], lambda b: b["batch_size"])}


def test_a_bins_value_is_the_step_time_weighted_mean_of_its_steps():
    tl = pd.DataFrame({"replica": [0, 1, 0], "time_s": [0.1, 0.2, 0.6],
                       "step_time_s": [0.2, 0.1, 0.2], "batch_size": [2, 6, 4]})
    per_replica = binned(tl, {}, BATCH, points=2, span=(0.0, 1.0))
    assert per_replica[["time_s", "replica"]].values.tolist() == [[0.25, 0], [0.75, 0],
                                                                   [0.25, 1]]
    assert per_replica["batch"].tolist() == pytest.approx([2.0, 4.0, 6.0])
    pooled = binned(tl, {}, BATCH, points=2, span=(0.0, 1.0), by_replica=False)
    assert pooled["batch"].tolist() == pytest.approx([(2 * 0.2 + 6 * 0.1) / 0.3, 4.0])


def test_binning_matches_a_step_by_step_sum():
    """Random steps of five replicas (some of zero time): every bin against a plain loop."""
    rng = np.random.default_rng(5)
    n, points = 400, 7
    tl = pd.DataFrame({"replica": rng.integers(0, 5, n), "time_s": rng.uniform(0, 10, n),
                       "step_time_s": rng.choice([0.0, 0.01, 0.3], n),
                       "batch_size": rng.integers(1, 64, n)})
    got = binned(tl, {}, BATCH, points=points, span=(0.0, 10.0))
    edges = np.linspace(0.0, 10.0, points + 1)
    expected = {}
    for r, t, w, x in tl[["replica", "time_s", "step_time_s", "batch_size"]].itertuples(
            index=False):
        k = (int(r), min(int(np.searchsorted(edges, t, side="right")) - 1, points - 1))
        s, total = expected.get(k, (0.0, 0.0))
        expected[k] = (s + x * w, total + w)
    expected = {k: s / w for k, (s, w) in expected.items() if w > 0}
    keys = {(int(r), int(np.searchsorted(edges, t) - 1)) for r, t in
            zip(got["replica"], got["time_s"], strict=True)}
    assert keys == set(expected)
    for r, t, v in got[["replica", "time_s", "batch"]].itertuples(index=False):
        assert v == pytest.approx(expected[(int(r), int(np.searchsorted(edges, t) - 1))])
