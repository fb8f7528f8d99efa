"""Seaborn plots of one run: latency ECDFs, the engine over time, and what bound its steps.

Each PNG is written atomically (``analysis.files.save_figure``). What was run (model, GPU,
scheduler, load, SLO) comes from the run's config, by default the one Hydra saved beside the
outputs (``run_config``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import seaborn as sns
import yaml
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from analysis.files import save_figure
from analysis.metrics import kv_usage, per_request_latencies, step_metrics
from analysis.timeline_bins import binned, time_span
from sim.cost.base import BOUNDS
from sim.records import Records

MAX_POINTS = 2000
ECDF_POINTS = 4096  # an ECDF is drawn through at most this many of its order statistics
SLO_COLOUR = "#d62728"
# the latency ECDF panels: per-request column (also the name of its ``slo`` bound) and title
LATENCY_PANELS = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2el_ms", "E2E latency"))


def run_config(outdir: Path) -> DictConfig | None:
    """The run's config as Hydra saved it beside the outputs (``.hydra/config.yaml``); None
    where there is none (a run outside Hydra, ``hydra.output_subdir=null``) or it is not a
    readable YAML mapping: the plots are then drawn without what it tells."""
    try:
        cfg = OmegaConf.load(Path(outdir) / ".hydra" / "config.yaml")
    except (OSError, yaml.YAMLError):
        return None
    return cfg if isinstance(cfg, DictConfig) else None


def setting(cfg: DictConfig | None, key: str):
    """The value at dotted ``key`` of ``cfg``; None where it or ``cfg`` is missing."""
    if cfg is None:
        return None
    try:
        return OmegaConf.select(cfg, key, default=None)
    except OmegaConfBaseException:  # an interpolation that only resolves inside the run
        return None


def number_text(x: float) -> str:
    """``x`` in at most four digits, with a decimal point: 5.0, 0.35, 12.5."""
    text = f"{float(x):.4g}"
    return text if any(c in text for c in ".e") else f"{text}.0"


def offered_load(cfg: DictConfig | None, unit: str) -> str | None:
    """How the run's traffic arrives, for a title: the rate in ``unit`` (open loop),
    ``concurrency=N`` (closed loop) or ``trace NAME`` (replay, with its time scale)."""
    arrival = setting(cfg, "workload.arrival")
    if arrival == "closed_loop":
        return f"concurrency={setting(cfg, 'workload.concurrency')}"
    if arrival == "trace":
        name = Path(str(setting(cfg, "workload.trace_path") or "")).name
        scale = setting(cfg, "workload.time_scale")
        return f"trace {name}" + (f" (gaps ×{scale:g})" if scale not in (None, 1) else "")
    rate = setting(cfg, "workload.rate")
    return None if rate is None else f"{number_text(rate)} {unit}"


def title_of(what: str | None, gpu: str | None, *details: str | None) -> str:
    """The title "WHAT on GPU, DETAIL, ...", without the parts that are unknown."""
    head = " on ".join(str(v) for v in (what, gpu) if v)
    return ", ".join(str(p) for p in (head, *details) if p)


def run_title(cfg: DictConfig | None) -> str:
    """What an LLM run simulated, e.g. "llama3_8b on h100_sxm, scheduler=vllm, 5.0 req/s"
    (sessions/s for multi-turn sessions); "" without a config."""
    if cfg is None:
        return ""
    unit = "sessions/s" if setting(cfg, "workload.multi_turn.enabled") else "req/s"
    scheduler = setting(cfg, "scheduler.name")
    return title_of(setting(cfg, "model.name"), setting(cfg, "hardware.name"),
                    scheduler and f"scheduler={scheduler}", offered_load(cfg, unit))


def mark_bound(ax, value: float, unit: str = "ms") -> None:
    """A dashed vertical line at an SLO bound on ``ax``, labelled with its value."""
    ax.axvline(value, color=SLO_COLOUR, linestyle="--", linewidth=1)
    ax.text(value, 0.02, f"SLO {value:g} {unit} ", transform=ax.get_xaxis_transform(),
            rotation=90, ha="right", va="bottom", fontsize=8, color=SLO_COLOUR)


def ecdf_line(ax, data) -> None:
    """The ECDF of ``data`` on ``ax`` as a step line through at most ``ECDF_POINTS`` of its
    order statistics (evenly spaced in rank, both extremes kept), so a million requests
    draw as fast, and look the same, as a few thousand."""
    x = np.sort(np.asarray(data, float))
    n = len(x)
    rank = np.unique(np.linspace(0, n - 1, min(n, ECDF_POINTS)).astype(np.int64))
    ax.step(x[rank], (rank + 1) / n, where="post")
    ax.set_ylabel("Proportion")


def latency_ecdf_figure(records: Records, cfg: DictConfig | None = None) -> Figure:
    """ECDFs of TTFT, TPOT and end-to-end latency over completed requests, each with its
    ``cfg.slo`` bound where set, under a title saying what ``cfg`` ran."""
    lat = per_request_latencies(records.requests)
    fig = Figure(figsize=(14, 4.3))
    for ax, (col, name) in zip(fig.subplots(1, 3), LATENCY_PANELS, strict=True):
        data = lat[col].dropna()
        if len(data):
            ecdf_line(ax, data)
            if data.min() > 0 and data.max() / data.min() > 20:
                ax.set_xscale("log")
                ax.xaxis.set_minor_formatter(NullFormatter())
        bound = setting(cfg, f"slo.{col}")
        if bound is not None:
            mark_bound(ax, float(bound))
        ax.set_xlabel(f"{name} (ms)")
        ax.set_title(f"{name} ECDF")
    title = run_title(cfg)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_latency_ecdfs(records: Records, path: Path, cfg: DictConfig | None = None) -> None:
    """``latency_ecdf_figure`` as a PNG."""
    save_figure(latency_ecdf_figure(records, cfg), path, dpi=110)


def queue_by_class(requests: pd.DataFrame, times: np.ndarray) -> pd.DataFrame:
    """Requests waiting for their first step (arrived, not yet scheduled) at each of
    ``times``, per ``request_class`` (one class ``all`` without classes)."""
    req = requests[requests["first_scheduled_s"].notna()]
    classes = req["request_class"].astype(str) if "request_class" in req else None
    frames = []
    for name, rows in (req.groupby(classes, sort=True) if classes is not None
                       else [("all", req)]):
        arrived = np.searchsorted(np.sort(rows["arrival_s"].to_numpy()), times, side="right")
        started = np.searchsorted(np.sort(rows["first_scheduled_s"].to_numpy()), times,
                                  side="right")
        frames.append(pd.DataFrame({"time_s": times, "waiting": arrived - started,
                                    "class": name}))
    return pd.concat(frames, ignore_index=True)


def _kv_usage_pct(meta: dict):
    """Per step of a batch, the percentage of its replica's KV blocks in use."""
    def pct(b: dict) -> np.ndarray:
        usage = kv_usage(b, meta)
        return usage * 100 if usage is not None else np.zeros(len(b["time_s"]))
    return pct


def plot_timeline(records: Records, path: Path, span: tuple[float, float] | None = None
                  ) -> None:
    """Per replica, batch size and KV-cache usage over simulated time (replica failures
    shaded); the requests waiting for their first step, per class. ``span``: the steps'
    ``time_span`` (None: read it)."""
    meta = records.meta
    span = span if span is not None else time_span(records.timeline, meta)
    replicas = len(meta.get("replica_num_gpu_blocks") or [0])
    series = binned(records.timeline, meta, {
        "batch_size": (["batch_size"], lambda b: b["batch_size"]),
        "kv_usage_pct": (["kv_blocks_used"], _kv_usage_pct(meta))},
        points=max(200, MAX_POINTS // replicas), span=span)
    pools = meta.get("replica_pools")
    names = {r: f"{pools[r]} {r}" if pools and len(set(pools)) > 1 else str(r)
             for r in series["replica"].unique()}
    series["replica"] = series["replica"].map(names)
    many = len(names) > 8
    fig = Figure(figsize=(10, 7))
    axes = fig.subplots(3, 1, sharex=True)
    for ax, col, label in ((axes[0], "batch_size", "batch size (seqs)"),
                           (axes[1], "kv_usage_pct", "KV cache used (%)")):
        sns.lineplot(data=series, x="time_s", y=col, hue="replica", ax=ax, linewidth=0.8,
                     estimator=None, errorbar=None, legend=not many,
                     palette="viridis" if many else "tab10")
        ax.set_ylabel(label)
        for f in meta.get("failures", []):  # a replica down: shaded, lines bridge it
            end = f["up_s"] if f["up_s"] is not None else meta.get("sim_time_s")
            ax.axvspan(f["down_s"], end, color="grey", alpha=0.15, linewidth=0)
    axes[1].set_ylim(0, 105)
    queue = queue_by_class(records.requests, np.linspace(*span, MAX_POINTS))
    sns.lineplot(data=queue, x="time_s", y="waiting", hue="class", ax=axes[2], linewidth=0.8,
                 estimator=None, errorbar=None)
    axes[2].set_ylabel("waiting requests")
    axes[2].set_xlabel("simulated time (s)")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


def _roof_share(column: str):
    """Per step of a batch, the share of its time on ``column``'s roof."""
    def share(b: dict) -> np.ndarray:
        step = b["step_time_s"]
        return np.divide(b[column], step, out=np.zeros(len(step)), where=step > 0)
    return share


def plot_bound_share(records: Records, path: Path,
                     span: tuple[float, float] | None = None) -> None:
    """Share of step time bound by compute, memory, communication and host, over time;
    ``span`` as ``plot_timeline``'s."""
    span = span if span is not None else time_span(records.timeline, records.meta)
    cols = [f"{b}_s" for b in BOUNDS]
    fig = Figure(figsize=(11, 4))
    ax0, ax1 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 3]})
    steps = step_metrics(records.timeline, records.meta)
    share = np.array([steps.get(f"{b}_bound_share", 0.0) for b in BOUNDS])
    sns.barplot(x=list(BOUNDS), y=share * 100, ax=ax0, hue=list(BOUNDS), legend=False)
    ax0.set_ylabel("share of step time (%)")
    ax0.set_title("whole run")
    ax0.tick_params(axis="x", labelsize=8)
    b = binned(records.timeline, records.meta, {c: ([c], _roof_share(c)) for c in cols},
               points=200, span=span, by_replica=False)
    ax1.stackplot(b["time_s"], *(b[c] * 100 for c in cols), labels=list(BOUNDS))
    ax1.set_ylim(0, 100)
    ax1.set_xlabel("simulated time (s)")
    ax1.set_ylabel("share of step time (%)")
    ax1.set_title("which roof bound the steps")
    ax1.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


def plot_day(hourly: list[dict], path: Path) -> None:
    """A day hour by hour (``summary.json``'s ``hourly``): the offered rate, the replicas
    (billed and ready, when autoscaled; nodes for diffusion jobs) and the mean and p99 TTFT
    (the job latency for diffusion jobs)."""
    day = pd.DataFrame(hourly)
    jobs = "mean_latency_s" in day
    panels = 3 if "replicas" in day else 2
    fig = Figure(figsize=(10, 2.6 * panels))
    axes = fig.subplots(panels, 1, sharex=True)
    axes[0].step(day["hour"], day["offered_rate"], where="post")
    axes[0].set_ylabel(f"offered ({'jobs' if jobs else 'req'}/s)")
    if panels == 3:
        for col, label in (("replicas", "billed"), ("ready_replicas", "ready")):
            axes[1].step(day["hour"], day[col], where="post", label=label)
        axes[1].set_ylabel(f"{'nodes' if jobs else 'replicas'} (hour mean)")
        axes[1].legend(loc="upper left", fontsize=8)
    latency = (("mean_latency_s", "p99_latency_s", "job latency (s)") if jobs
               else ("mean_ttft_ms", "p99_ttft_ms", "TTFT (ms)"))
    for col, label in zip(latency[:2], ("mean", "p99"), strict=True):
        axes[-1].plot(day["hour"], day[col], marker=".", label=label)
    axes[-1].set_yscale("log")
    axes[-1].set_ylabel(latency[2])
    axes[-1].legend(loc="upper left", fontsize=8)
    axes[-1].set_xlabel("hour (by arrival)")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


def write_plots(records: Records, outdir: Path, cfg: DictConfig | None = None) -> list[Path]:
    """All plots of one run into ``outdir``; returns their paths. ``cfg``: the run's config
    (None: ``run_config(outdir)``)."""
    outdir = Path(outdir)
    cfg = cfg if cfg is not None else run_config(outdir)
    paths = [outdir / "latency_ecdf.png", outdir / "timeline.png", outdir / "bound_share.png"]
    meta = records.meta
    kept = "timeline_file" in meta or "step_totals" not in meta  # not ``timeline: false``
    has_rows = kept and step_metrics(records.timeline, meta)["num_steps"] > 0
    if not has_rows and "step_totals" not in meta:
        return []
    plot_latency_ecdfs(records, paths[0], cfg)
    if not has_rows:  # ``timeline: false``: no per-step rows to draw
        return paths[:1]
    span = time_span(records.timeline, meta)  # one read of the rows for both plots
    plot_timeline(records, paths[1], span)
    plot_bound_share(records, paths[2], span)
    return paths
