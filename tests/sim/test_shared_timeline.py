"""Every replica's timeline rows in one buffer (``sim.records.SharedTimeline``)."""

from __future__ import annotations

import numpy as np

from sim.records import SharedTimeline


def test_rows_come_out_by_time_then_replica_each_replica_in_its_own_order():
    tl = SharedTimeline({"time_s": "f8", "batch_size": "i4"})
    a, b, c = tl.rows_of(2), tl.rows_of(0), tl.rows_of(1)
    a.append(0.0, 1)
    b.extend(3, np.array([0.5, 0.5, 1.0]), np.array([7, 8, 9]))  # a window, recorded late
    c.append(0.5, 3)
    a.append(0.5, 2)
    tl.extend(2, np.array([1, 0]), np.array([0.2, 1.0]), 5)  # a compiled chunk
    out = tl.to_frame()
    assert out["time_s"].tolist() == [0.0, 0.2, 0.5, 0.5, 0.5, 0.5, 1.0, 1.0]
    assert out["replica"].tolist() == [2, 1, 0, 0, 1, 2, 0, 0]
    assert out["batch_size"].tolist() == [1, 5, 7, 8, 3, 2, 9, 5]
    assert out["replica"].dtype == np.int32


def test_one_replica_keeps_its_rows_as_added_without_copying():
    tl = SharedTimeline({"time_s": "f8"})
    rows = tl.rows_of(0)
    for t in (0.0, 0.1, 0.3):
        rows.append(t)
    out = tl.to_frame()
    assert out["time_s"].tolist() == [0.0, 0.1, 0.3]
    held = tl.buffer.to_frame(copy=False)["time_s"].to_numpy()
    assert np.shares_memory(out["time_s"].to_numpy(), held)
