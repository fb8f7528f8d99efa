"""The diffusion plots: readable latency axes (from 0, labels apart) and a node-occupancy
heat map with a colour bar in which a down node differs from an idle one."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg

from analysis.diffusion_plots import (
    DOWN_COLOUR,
    job_latency_figure,
    node_occupancy_figure,
    write_diffusion_plots,
)
from sim.diffusion.records import DiffusionRecords


def records(nodes: int = 10, jobs: int = 200) -> DiffusionRecords:
    """Jobs whose latencies span 0.5 s to 2000 s (a third wait 0 s), on ``nodes`` nodes, node
    3 down from 20 s to 60 s."""
    rng = np.random.default_rng(0)
    arrival = np.sort(rng.uniform(0, 100, jobs))
    queue = np.where(np.arange(jobs) % 3 == 0, 0.0, 10 ** rng.uniform(-2, 3, jobs))
    service = 10 ** rng.uniform(-0.3, 3, jobs)
    table = pd.DataFrame({"job_id": np.arange(jobs), "status": "completed",
                          "arrival_s": arrival, "start_s": arrival + queue,
                          "completion_s": arrival + queue + service, "service_s": service,
                          "step_s": 0.1})
    rows = [(0.0, n, 0, 0, True) for n in range(nodes)]
    rows += [(10.0, n, 8, 1, True) for n in range(nodes)]
    rows += [(20.0, 3, 0, 0, False), (60.0, 3, 0, 0, True), (80.0, 3, 4, 1, True)]
    occupancy = pd.DataFrame(rows, columns=["time_s", "node", "busy_gpus", "running_jobs",
                                            "up"]).sort_values(["time_s", "node"])
    meta = {"num_nodes": nodes, "gpus_per_node": 8, "sim_time_s": 100.0,
            "node_failures": [{"node": 3, "down_s": 20.0, "up_s": 60.0}]}
    return DiffusionRecords(table, occupancy.reset_index(drop=True), meta)


def _overlap(boxes) -> bool:
    return any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])


def test_latency_axes_start_at_zero_with_labels_apart():
    fig = job_latency_figure(records())
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    for ax in fig.axes:
        lo, hi = ax.get_xlim()
        assert lo == 0 and hi > 900
        labels = [t for t in ax.get_xticklabels() if t.get_text() and lo <= t.get_position()[0]
                  <= hi]
        assert len(labels) >= 3
        assert not _overlap([t.get_window_extent(renderer) for t in labels]), \
            [t.get_text() for t in labels]


def test_heat_map_has_a_colour_bar_and_shows_down_nodes_apart_from_idle_ones():
    fig = node_occupancy_figure(records())
    heat = fig.axes[0]
    assert len(fig.axes) == 3  # the heat map, the pool total and the colour bar
    assert "busy GPUs" in fig.axes[2].get_ylabel()
    image = heat.get_images()[0]
    cells = image.get_array()
    t = np.linspace(0, 100, cells.shape[1] + 1)[:-1] + 50 / cells.shape[1]
    down = (t > 20.5) & (t < 59.5)
    assert cells.mask[3, down].all() and not cells.mask[3, ~down & ((t < 19.5) | (t > 60.5))].any()
    assert not cells.mask[[0, 1, 2, 4], :].any()
    idle = t < 9.5
    assert (cells[0, idle] == 0).all()  # idle: the colour map's 0, not the down colour
    bad = image.get_cmap().get_bad()
    assert np.allclose(bad[:3], tuple(int(DOWN_COLOUR[i:i + 2], 16) / 255 for i in (1, 3, 5)))
    assert not np.allclose(image.get_cmap()(0.0)[:3], bad[:3])
    assert "node down" in [t.get_text() for t in heat.get_legend().get_texts()]


def test_both_pngs_are_written(tmp_path):
    paths = write_diffusion_plots(records(nodes=3), tmp_path)
    assert all(p.is_file() and p.stat().st_size > 0 for p in paths)
