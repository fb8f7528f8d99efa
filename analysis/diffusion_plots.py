"""Plots of a diffusion pool's run: job latency ECDFs and node occupancy over time.

Each PNG is written atomically (``analysis.files.save_figure``). The GPU and offered load in
the latency plot's title come from the run's config, by default the one Hydra saved beside
the outputs (``analysis.plots.run_config``).
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
from omegaconf import DictConfig

from analysis.diffusion_metrics import per_job_times
from analysis.files import save_figure
from analysis.plots import ecdf_line, number_text, offered_load, run_config, setting, title_of
from sim.diffusion.records import DiffusionRecords

MAX_NODES_AS_LINES = 8  # more nodes: a heat map instead of one line each
MAX_POINTS = 500
MAX_DECADE_TICKS = 6  # more decades on a log axis: label every other one
DOWN_COLOUR = "#d62728"  # a node that is down, in the heat map (idle is the colour map's 0)
MAX_TITLE_PIPELINES = 3
ROW_INCHES = 0.14  # node panel height per node: one node's row stays a band the eye can follow
NODE_PANEL_INCHES = (3.4, 16.0)  # the node panel's height: at least, at most
POOL_PANEL_INCHES = 1.7
MARGIN_INCHES = 0.9  # the time axis' ticks and label
MAX_NODE_LABELS = 16  # more nodes: label every 2nd, 5th, 10th, ... row


def _time_axis(ax, data: pd.Series) -> None:
    """An x axis of seconds from 0: linear, or symlog when the values span more than 20×
    (linear below the smallest positive value), labelled at 0 and at powers of ten only, so
    the labels never crowd together."""
    pos = data[data > 0]
    top = float(data.max()) if len(data) else 1.0
    if len(pos) and pos.max() / pos.min() > 20:
        lin = float(pos.min())
        ax.set_xscale("symlog", linthresh=lin)
        lo, hi = math.ceil(math.log10(lin)), math.floor(math.log10(float(pos.max())))
        step = 1 + (hi - lo) // MAX_DECADE_TICKS
        ticks = [0.0] + [10.0 ** k for k in range(lo, hi + 1, step)]
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x:g}"))
    ax.set_xlim(0.0, top * 1.05 if top > 0 else 1.0)


def pipelines(jobs: pd.DataFrame) -> str | None:
    """The jobs' pipelines, the most jobs' first ("flux1_dev+wan21_t2v_14b"); None without
    jobs or their ``model`` column."""
    if "model" not in jobs or jobs.empty:
        return None
    names = [str(m) for m in jobs["model"].value_counts().index]
    more = len(names) - MAX_TITLE_PIPELINES
    return "+".join(names[:MAX_TITLE_PIPELINES]) + (f"+{more} more" if more > 0 else "")


def pool_title(records: DiffusionRecords, cfg: DictConfig | None = None) -> str:
    """What a diffusion pool ran, e.g. "flux1_dev on h100_sxm, policy=fcfs, 0.8 jobs/s": the
    jobs' pipelines and the pool's policy (from the records), the GPU and the offered load
    (from ``cfg``, where given)."""
    policy = records.meta.get("policy") or setting(cfg, "cluster.policy")
    if setting(cfg, "workload.kind") == "mixed":  # its job stream is Poisson, beside the LLM's
        rate = setting(cfg, "workload.diffusion_rate")
        load = None if rate is None else f"{number_text(rate)} jobs/s"
    else:
        load = offered_load(cfg, "jobs/s")
    return title_of(pipelines(records.jobs) or setting(cfg, "model.name"),
                    setting(cfg, "hardware.name"), policy and f"policy={policy}",
                    "elastic gangs" if records.meta.get("elastic") else None, load)


def job_latency_figure(records: DiffusionRecords, cfg: DictConfig | None = None) -> Figure:
    """ECDFs of completed jobs' end-to-end latency and queue wait, in seconds, under a title
    saying what the pool ran (``pool_title``)."""
    times = per_job_times(records.jobs)
    fig = Figure(figsize=(10, 4.3))
    axes = fig.subplots(1, 2)
    for ax, col, title in ((axes[0], "job_latency_s", "job latency"),
                           (axes[1], "job_queue_s", "queue wait")):
        data = times[col].dropna()
        if len(data):
            ecdf_line(ax, data)
        _time_axis(ax, data)
        ax.set_xlabel(f"{title} (s)")
        ax.set_title(f"{title} ECDF")
    title = pool_title(records, cfg)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_job_latency_ecdf(records: DiffusionRecords, path: Path,
                          cfg: DictConfig | None = None) -> None:
    """``job_latency_figure`` as a PNG."""
    save_figure(job_latency_figure(records, cfg), path, dpi=110)


def occupancy_grid(nodes: pd.DataFrame, end: float, points: int = MAX_POINTS) -> pd.DataFrame:
    """Per node, in ``points`` equal time bins up to ``end`` (at the bins' midpoints): the
    mean busy GPUs and the fraction of the bin the node was down (exact time averages of its
    occupancy steps over each bin)."""
    edges = np.linspace(0.0, max(end, 1e-9), points + 1)
    frames = []
    for node, rows in nodes.groupby("node", sort=True):
        t = rows["time_s"].to_numpy()
        means = {col: _bin_means(t, values, edges) for col, values in (
            ("busy_gpus", rows["busy_gpus"].to_numpy(float)),
            ("down", 1.0 - rows["up"].to_numpy(float)))}
        frames.append(pd.DataFrame({"time_s": (edges[:-1] + edges[1:]) / 2, "node": node,
                                    **means}))
    return pd.concat(frames, ignore_index=True)


def _bin_means(t: np.ndarray, values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Time averages over the bins ``edges`` of a step function (``values[i]`` from ``t[i]``
    to ``t[i + 1]``, the last one on)."""
    area = np.concatenate([[0.0], np.cumsum(values[:-1] * np.diff(t))])  # at each change
    k = np.clip(np.searchsorted(t, edges, side="right") - 1, 0, None)
    at = area[k] + values[k] * np.clip(edges - t[k], 0, None)
    return np.diff(at) / np.diff(edges)


def _heat_map(fig: Figure, axes, grid: pd.DataFrame, n: int, end: float, gpus: int,
              down_label: str = "node down") -> None:
    """Busy GPUs per node and bin as colours on ``axes[0]``, with a colour bar beside both
    axes (so their time axes stay aligned); a bin in which the node was down (or off) most
    of the time in ``DOWN_COLOUR``, labelled ``down_label`` (an idle node is the colour
    map's 0)."""
    ax = axes[0]
    busy = grid.pivot(index="node", columns="time_s", values="busy_gpus").to_numpy()
    down = grid.pivot(index="node", columns="time_s", values="down").to_numpy()
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad=DOWN_COLOUR)
    image = ax.imshow(np.ma.masked_where(down > 0.5, busy), aspect="auto",
                      interpolation="nearest", extent=(0, end, n - 0.5, -0.5), cmap=cmap,
                      vmin=0, vmax=gpus)
    fig.colorbar(image, ax=list(axes), label="busy GPUs per node (bin mean)", pad=0.01)
    ax.set_ylabel("node")
    _node_ticks(ax, n)
    if (down > 0.5).any():
        ax.legend(handles=[Patch(color=DOWN_COLOUR, label=down_label)], loc="upper right",
                  fontsize="small")


def _label_step(n: int) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, ... that labels at most ``MAX_NODE_LABELS`` of
    ``n`` rows."""
    scale = 1
    while True:
        for m in (1, 2, 5):
            if math.ceil(n / (m * scale)) <= MAX_NODE_LABELS:
                return m * scale
        scale *= 10


def _node_ticks(ax, n: int) -> None:
    """The heat map's rows labelled with node ids, every ``_label_step``-th one, a minor
    tick on every row."""
    step = _label_step(n)
    ax.yaxis.set_major_locator(FixedLocator(range(0, n, step)))
    ax.yaxis.set_minor_locator(FixedLocator(range(n)) if step > 1 else NullLocator())
    ax.tick_params(axis="y", labelsize="small")


def node_panel_inches(n: int) -> float:
    """Height of the per-node panel for ``n`` nodes: ``ROW_INCHES`` a node, within
    ``NODE_PANEL_INCHES`` (beyond its top a heat map's rows thin out)."""
    return float(np.clip(n * ROW_INCHES, *NODE_PANEL_INCHES))


def node_occupancy_figure(records: DiffusionRecords) -> Figure:
    """Busy GPUs per node over simulated time, averaged over short bins (a line per node,
    node failures shaded; or a heat map for many nodes, down nodes in their own colour, as
    tall as the nodes need); below, GPUs busy in the pool."""
    meta = records.meta
    end = float(meta.get("sim_time_s", records.nodes["time_s"].max()))
    grid = occupancy_grid(records.nodes, end)
    gpus = int(meta.get("gpus_per_node", 8))
    n = int(meta.get("num_nodes", grid["node"].nunique()))
    top = node_panel_inches(n)
    fig = Figure(figsize=(10, top + POOL_PANEL_INCHES + MARGIN_INCHES),
                 layout="constrained")  # room for the colour bar
    axes = fig.subplots(2, 1, sharex=True,
                        gridspec_kw={"height_ratios": [top, POOL_PANEL_INCHES]})
    if n <= MAX_NODES_AS_LINES:
        sns.lineplot(data=grid.assign(node=grid["node"].astype(str)), x="time_s",
                     y="busy_gpus", hue="node", ax=axes[0], linewidth=0.8, estimator=None,
                     errorbar=None)
        axes[0].set_ylabel("busy GPUs (bin mean)")
        for f in meta.get("node_failures", []):
            axes[0].axvspan(f["down_s"], f["up_s"] if f["up_s"] is not None else end,
                            color="grey", alpha=0.15, linewidth=0)
    else:
        _heat_map(fig, axes, grid, n, end, gpus, "node off or down" if "autoscaler" in meta
                  else "node down")
    total = grid.groupby("time_s", sort=True)["busy_gpus"].sum()
    axes[1].plot(total.index, total.to_numpy(), linewidth=0.8)
    axes[1].set_ylim(0, max(1, n * gpus) * 1.05)
    axes[1].set_ylabel("busy GPUs (pool)")
    axes[1].set_xlabel("simulated time (s)")
    return fig


def plot_node_occupancy(records: DiffusionRecords, path: Path) -> None:
    """``node_occupancy_figure`` as a PNG."""
    save_figure(node_occupancy_figure(records), path, dpi=110)


def write_diffusion_plots(records: DiffusionRecords, outdir: Path,
                          cfg: DictConfig | None = None) -> list[Path]:
    """Both plots into ``outdir``; returns their paths. ``cfg``: the run's config (None:
    ``analysis.plots.run_config(outdir)``)."""
    outdir = Path(outdir)
    cfg = cfg if cfg is not None else run_config(outdir)
    paths = [outdir / "job_latency_ecdf.png", outdir / "node_occupancy.png"]
    plot_job_latency_ecdf(records, paths[0], cfg)
    plot_node_occupancy(records, paths[1])
    return paths
