"""Plots of a diffusion pool's run: job latency ECDFs and node occupancy over time.

Each PNG is written atomically (``analysis.report.save_figure``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from analysis.diffusion_metrics import per_job_times
from analysis.report import save_figure
from sim.diffusion.records import DiffusionRecords

MAX_NODES_AS_LINES = 8  # more nodes: a heat map instead of one line each
MAX_POINTS = 500


def plot_job_latency_ecdf(records: DiffusionRecords, path: Path) -> None:
    """ECDFs of completed jobs' end-to-end latency and queue wait, in seconds."""
    times = per_job_times(records.jobs)
    fig = Figure(figsize=(10, 4))
    axes = fig.subplots(1, 2)
    for ax, col, title in ((axes[0], "job_latency_s", "job latency"),
                           (axes[1], "job_queue_s", "queue wait")):
        data = times[col].dropna()
        if len(data):
            sns.ecdfplot(x=data, ax=ax)
            pos = data[data > 0]
            if len(pos) and pos.max() / pos.min() > 20:
                ax.set_xscale("symlog", linthresh=float(pos.min()))
                ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(f"{title} (s)")
        ax.set_title(f"{title} ECDF")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


def occupancy_grid(nodes: pd.DataFrame, end: float, points: int = MAX_POINTS) -> pd.DataFrame:
    """Mean busy GPUs of every node in ``points`` equal time bins up to ``end`` (the exact
    time average of its occupancy steps over each bin), at the bins' midpoints."""
    edges = np.linspace(0.0, max(end, 1e-9), points + 1)
    frames = []
    for node, rows in nodes.groupby("node", sort=True):
        t, busy = rows["time_s"].to_numpy(), rows["busy_gpus"].to_numpy(float)
        area = np.concatenate([[0.0], np.cumsum(busy[:-1] * np.diff(t))])  # at each change
        k = np.clip(np.searchsorted(t, edges, side="right") - 1, 0, None)
        at = area[k] + busy[k] * np.clip(edges - t[k], 0, None)
        frames.append(pd.DataFrame({"time_s": (edges[:-1] + edges[1:]) / 2, "node": node,
                                    "busy_gpus": np.diff(at) / np.diff(edges)}))
    return pd.concat(frames, ignore_index=True)


def plot_node_occupancy(records: DiffusionRecords, path: Path) -> None:
    """Busy GPUs per node over simulated time, averaged over short bins (a line per node,
    or a heat map for many nodes), node failures shaded; below, GPUs busy in the pool."""
    meta = records.meta
    end = float(meta.get("sim_time_s", records.nodes["time_s"].max()))
    grid = occupancy_grid(records.nodes, end)
    fig = Figure(figsize=(10, 6))
    axes = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    n = int(meta.get("num_nodes", grid["node"].nunique()))
    if n <= MAX_NODES_AS_LINES:
        sns.lineplot(data=grid.assign(node=grid["node"].astype(str)), x="time_s",
                     y="busy_gpus", hue="node", ax=axes[0], linewidth=0.8, estimator=None,
                     errorbar=None)
        axes[0].set_ylabel("busy GPUs (bin mean)")
        for f in meta.get("node_failures", []):
            axes[0].axvspan(f["down_s"], f["up_s"] if f["up_s"] is not None else end,
                            color="grey", alpha=0.15, linewidth=0)
    else:
        wide = grid.pivot(index="node", columns="time_s", values="busy_gpus")
        axes[0].imshow(wide.to_numpy(), aspect="auto", interpolation="nearest",
                       extent=(0, end, n - 0.5, -0.5), cmap="viridis", vmin=0,
                       vmax=int(meta.get("gpus_per_node", 8)))
        axes[0].set_ylabel("node (colour: busy GPUs)")
    total = grid.groupby("time_s", sort=True)["busy_gpus"].sum()
    axes[1].plot(total.index, total.to_numpy(), linewidth=0.8)
    axes[1].set_ylim(0, max(1, n * int(meta.get("gpus_per_node", 8))) * 1.05)
    axes[1].set_ylabel("busy GPUs (pool)")
    axes[1].set_xlabel("simulated time (s)")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


def write_diffusion_plots(records: DiffusionRecords, outdir: Path) -> list[Path]:
    """Both plots into ``outdir``; returns their paths."""
    outdir = Path(outdir)
    paths = [outdir / "job_latency_ecdf.png", outdir / "node_occupancy.png"]
    plot_job_latency_ecdf(records, paths[0])
    plot_node_occupancy(records, paths[1])
    return paths
