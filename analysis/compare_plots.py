"""Plots of a design comparison: metrics vs rate with confidence bands, goodput vs rate, the
throughput-per-GPU vs tokens/s-per-user Pareto front, and latency ECDFs per design."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from analysis.files import save_figure
from analysis.stats import t_interval
from analysis.verdict import metric_label

BAND_METRICS = ("median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms")
MAX_ECDF_RATES = 3


def _label(jobs: pd.DataFrame, groups: list[str]) -> pd.Series:
    """Line label: the design, plus any setting other than the rate."""
    label = jobs["design"].astype(str)
    for g in groups[1:]:
        label = label + f", {g}=" + jobs[g].astype(str)
    return label


def _bands(jobs: pd.DataFrame, column: str) -> pd.DataFrame:
    rows = []
    for (label, rate), g in jobs.groupby(["label", "rate"], sort=False):
        iv = t_interval(g[column])
        rows.append({"label": label, "rate": rate, "mean": iv.mean,
                     "ci": 0.0 if np.isnan(iv.half_width) else iv.half_width})
    return pd.DataFrame(rows).sort_values("rate", kind="stable")


def _band_axis(ax, jobs: pd.DataFrame, column: str, title: str, palette: dict) -> None:
    """Mean line and CI band per label. The metrics are positive: a band is drawn from zero
    up (linear axis), or, on a log axis when the means span over 30×, from a tenth of the
    smallest mean up."""
    bands = _bands(jobs, column)
    means = bands["mean"][bands["mean"] > 0]
    log = len(means) > 1 and means.max() / means.min() > 30
    floor = means.min() / 10 if log else 0.0
    for label in palette:
        b = bands[bands["label"] == label]
        if b.empty:
            continue
        ax.plot(b["rate"], b["mean"], marker="o", ms=3, color=palette[label], label=label)
        ax.fill_between(b["rate"], np.maximum(b["mean"] - b["ci"], floor), b["mean"] + b["ci"],
                        alpha=0.2, color=palette[label], linewidth=0)
    if log:
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)
    ax.set_xlabel("request rate (req/s)")
    ax.set_title(title)


def plot_bands(jobs: pd.DataFrame, path: Path, palette: dict) -> None:
    """p50/p99 TTFT and TPOT vs rate per design, mean over seeds with 95% CI bands."""
    fig = Figure(figsize=(11, 8))
    axes = fig.subplots(2, 2).ravel()
    for ax, m in zip(axes, BAND_METRICS, strict=True):
        _band_axis(ax, jobs, f"steady.{m}", f"{metric_label(m)} (ms)", palette)
    axes[0].legend(fontsize=8)
    fig.suptitle("steady state, mean over seeds with 95% confidence bands")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


def plot_goodput(jobs: pd.DataFrame, path: Path, palette: dict) -> None:
    """Goodput (requests meeting the SLO per second) vs rate, or throughput without an SLO."""
    col = ("steady.request_goodput" if "steady.request_goodput" in jobs
           and jobs["steady.request_goodput"].notna().any() else "steady.request_throughput")
    fig = Figure(figsize=(6, 4.5))
    ax = fig.subplots()
    _band_axis(ax, jobs, col, metric_label(col.removeprefix("steady.")) + " (req/s)", palette)
    lim = [0, float(jobs["rate"].max()) * 1.05]
    ax.plot(lim, lim, color="grey", linestyle=":", linewidth=1, label="offered load")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


def pareto_front(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Indices of the points no other point beats on both ``x`` and ``y`` (higher is
    better), ordered by ``x``."""
    order = np.lexsort((-y, -x))  # x descending, ties: best y first
    best = -np.inf
    keep = []
    for i in order:
        if y[i] > best:
            keep.append(i)
            best = y[i]
    return np.array(keep[::-1], dtype=int)


def _label_rates(ax, pts: pd.DataFrame, palette: dict) -> None:
    """Each point's request rate (req/s) in small text beside it, in its line's colour; a
    trace replay's points (no rate) unlabelled."""
    for _, p in pts[pts["rate"].notna()].iterrows():
        ax.annotate(f"{p['rate']:g}", (p["steady.median_tps"],
                                       p["steady.output_throughput_per_gpu"]),
                    xytext=(4, 3), textcoords="offset points", fontsize=7,
                    color=palette[p["label"]])


def pareto_figure(jobs: pd.DataFrame, palette: dict) -> Figure:
    """Output tokens/s per GPU vs tokens/s per user (1000 / TPOT, median over requests),
    one point per design and rate (mean over seeds) labelled with its rate, and the Pareto
    front of all of them."""
    metrics = ["steady.median_tps", "steady.output_throughput_per_gpu"]
    pts = (jobs.groupby(["label", "rate"], sort=True, dropna=False)[metrics].mean()
           .reset_index().dropna(subset=metrics))
    fig = Figure(figsize=(7, 5))
    ax = fig.subplots()
    for label, p in pts.groupby("label", sort=False):
        ax.plot(p["steady.median_tps"], p["steady.output_throughput_per_gpu"], marker="o",
                ms=4, color=palette[label], label=label, linewidth=0.8)
    _label_rates(ax, pts, palette)
    if len(pts):
        f = pareto_front(pts["steady.median_tps"].to_numpy(),
                         pts["steady.output_throughput_per_gpu"].to_numpy())
        front = pts.iloc[f]
        ax.step(front["steady.median_tps"], front["steady.output_throughput_per_gpu"],
                where="pre", color="black", linewidth=1.2, alpha=0.6, label="Pareto front")
    ax.set_xlabel("tokens/s per user (p50 of 1000 / TPOT)")
    ax.set_ylabel("output tokens/s per GPU")
    ax.set_title("throughput per GPU vs interactivity (labels: request rate, req/s)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_pareto(jobs: pd.DataFrame, path: Path, palette: dict) -> None:
    """``pareto_figure`` as a PNG."""
    save_figure(pareto_figure(jobs, palette), path, dpi=110)


def plot_ecdfs(jobs: pd.DataFrame, lat: dict, path: Path, palette: dict) -> None:
    """ECDFs of steady-state TTFT and TPOT per design, pooled over seeds, at up to three
    rates (lowest, middle, highest)."""
    rates = np.sort(jobs["rate"].dropna().unique())
    if len(rates) > MAX_ECDF_RATES:
        rates = rates[[0, len(rates) // 2, -1]]
    if not len(rates):
        rates = np.array([np.nan])
    fig = Figure(figsize=(4 * len(rates), 7))
    axes = fig.subplots(2, len(rates), squeeze=False)
    for j, rate in enumerate(rates):
        sel = jobs[jobs["rate"] == rate] if np.isfinite(rate) else jobs
        frames = [lat[i][["ttft_ms", "tpot_ms"]].assign(label=sel.at[i, "label"])
                  for i in sel.index]
        data = pd.concat(frames, ignore_index=True)
        for k, col in enumerate(("ttft_ms", "tpot_ms")):
            ax = axes[k, j]
            d = data.dropna(subset=[col])
            if len(d) and d[col].min() > 0:
                sns.ecdfplot(data=d, x=col, hue="label", palette=palette, ax=ax,
                             legend=(j == 0 and k == 0), log_scale=True)
            ax.set_xlabel(f"{'TTFT' if k == 0 else 'TPOT'} (ms)")
            ax.set_title(f"{rate:g} req/s" if np.isfinite(rate) else "")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


def write_compare_plots(jobs: pd.DataFrame, lat: dict, groups: list[str],
                        outdir: Path) -> list[Path]:
    """Every comparison plot into ``outdir``; returns their paths."""
    jobs = jobs.assign(label=_label(jobs, groups))
    labels = list(dict.fromkeys(jobs["label"]))
    palette = dict(zip(labels, sns.color_palette("tab10", len(labels)), strict=True))
    paths = {"compare_latency_vs_rate.png": lambda p: plot_bands(jobs, p, palette),
             "compare_goodput_vs_rate.png": lambda p: plot_goodput(jobs, p, palette),
             "compare_pareto.png": lambda p: plot_pareto(jobs, p, palette),
             "compare_ecdf.png": lambda p: plot_ecdfs(jobs, lat, p, palette)}
    out = []
    for name, draw in paths.items():
        draw(outdir / name)
        out.append(outdir / name)
    return out
