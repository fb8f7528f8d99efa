"""The roofline chart of one engine step: where each operator sits under the GPU's roofs.

Log-log axes: arithmetic intensity (FLOP per byte of memory traffic) against achieved FLOP/s.
The memory roof is ``bandwidth × intensity``; each dtype's compute roof is flat at its peak and
meets the memory roof at that dtype's balance point (peak ÷ bandwidth). Every operator that
does arithmetic is one marker at (its intensity, its FLOPs ÷ its predicted time), coloured by
the roof the cost model says binds it; operators without FLOPs (memory copies, collectives,
host time) have no place on these axes and are listed under the chart with their share of the
step, so nothing of the step is hidden.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from analysis.files import make_folder, save_figure

BOUND_COLORS = dict(zip(("compute", "memory", "comm", "host"), sns.color_palette("deep", 4),
                        strict=True))
MARKERS = "osD^vP*Xph<>"
OPERATOR_GID = "operator:"  # gid prefix of each operator's marker (tests and tools find them)
ROOF_GID = "roof:"


def plottable(ops: pd.DataFrame) -> pd.Series:
    """Operators that have a place on log-log roofline axes: FLOPs, bytes and time all > 0."""
    return (ops["flops"] > 0) & (ops["bytes"] > 0) & (ops["time_s"] > 0)


def roofline_figure(ops: pd.DataFrame, peaks: dict[str, float], bandwidth: float,
                    title: str = "") -> Figure:
    """The chart as a matplotlib Figure.

    ``ops`` has one row per operator with columns ``operator``, ``flops``, ``bytes``,
    ``time_s`` (totals per GPU over the step) and ``bound``; ``peaks`` maps a dtype label to
    its dense peak FLOP/s; ``bandwidth`` is the memory bandwidth in bytes/s.
    """
    on = ops[plottable(ops)]
    intensity = (on["flops"] / on["bytes"]).to_numpy(float)
    achieved = (on["flops"] / on["time_s"]).to_numpy(float)
    ridges = {d: p / bandwidth for d, p in peaks.items()}
    xs = np.concatenate([intensity, list(ridges.values())])
    x = np.geomspace(xs.min() / 10, xs.max() * 10, 256)
    top = max(peaks.values())

    fig = Figure(figsize=(12, 6.5))
    ax = fig.subplots()
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.plot(x, np.minimum(bandwidth * x, top), color="tab:gray", lw=2, gid=ROOF_GID + "memory",
            label=f"memory roof {bandwidth / 1e12:.2f} TB/s")
    for i, (dtype, peak) in enumerate(sorted(peaks.items(), key=lambda kv: -kv[1])):
        flat = x >= ridges[dtype]
        ax.plot(x[flat], np.full(flat.sum(), peak), color="0.15", lw=1.5,
                ls=("-", "--", ":")[i % 3], gid=ROOF_GID + dtype,
                label=f"{dtype} roof {peak / 1e12:,.0f} TFLOP/s")
        ax.axvline(ridges[dtype], color="0.6", lw=0.8, ls=":")
        ax.text(ridges[dtype], 0.02, f" {dtype} balance {ridges[dtype]:,.0f} FLOP/B",
                transform=ax.get_xaxis_transform(), rotation=90, va="bottom", ha="right",
                fontsize=8, color="0.35")

    for j, (name, bound, xi, yi) in enumerate(zip(on["operator"], on["bound"], intensity,
                                                   achieved, strict=True)):
        ax.plot([xi], [yi], ls="none", marker=MARKERS[j % len(MARKERS)], ms=8,
                color=BOUND_COLORS.get(bound, "0.5"), markeredgecolor="black",
                gid=OPERATOR_GID + name, label=f"{name} ({bound})")

    ax.set_xlim(x[0], x[-1])
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, borderaxespad=0.0)
    ax.set_ylim(achieved.min() / 10 if len(achieved) else top / 1e4, top * 3)
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("achieved FLOP/s (per GPU)")
    ax.set_title(title or "roofline of one step")
    ax.grid(True, which="major", alpha=0.3)

    off = ops[~plottable(ops)]
    if len(off):
        total = ops["time_s"].sum()
        items = [f"{n} {100 * t / total:.1f}%" if total > 0 else n
                 for n, t in zip(off["operator"], off["time_s"], strict=True)]
        fig.text(0.01, 0.01, "not on the roofline (no FLOPs), share of step time: "
                 + ", ".join(items), fontsize=7, wrap=True)
        fig.tight_layout(rect=(0, 0.05, 1, 1))
    else:
        fig.tight_layout()
    _label(ax, on["operator"].tolist(), intensity, achieved)  # after the layout is final
    return fig


def _label(ax, names: list[str], x: np.ndarray, y: np.ndarray, size: float = 8) -> None:
    """Name each marker beside it; a label that would overlap one already placed moves down
    (with a leader line to its marker) until it is free, so crowded operators stay readable."""
    scale = 72.0 / ax.figure.dpi  # display pixels to points
    pts = ax.transData.transform(np.column_stack([x, y])) * scale if len(x) else np.empty((0, 2))
    boxes: list[tuple[float, float, float, float]] = []
    for i in np.argsort(-pts[:, 1], kind="stable"):
        width, height = 0.6 * size * len(names[i]), 1.2 * size
        dx, dy = 8.0, 4.0
        for _ in range(40):
            bx, by = pts[i, 0] + dx, pts[i, 1] + dy
            if not any(bx < b[1] and b[0] < bx + width and by < b[3] and b[2] < by + height
                       for b in boxes):
                break
            dx, dy = 20.0, dy - 0.8 * height
        boxes.append((bx, bx + width, by, by + height))
        leader = {"arrowstyle": "-", "color": "0.5", "lw": 0.6} if dy != 4.0 else None
        ax.annotate(names[i], (x[i], y[i]), xytext=(dx, dy), textcoords="offset points",
                    fontsize=size, arrowprops=leader)


def write_roofline_chart(ops: pd.DataFrame, peaks: dict[str, float], bandwidth: float,
                         path: Path | str, title: str = "") -> Figure:
    """Draw the chart (see ``roofline_figure``) and save it as a PNG at ``path`` (its
    folder made if missing)."""
    fig = roofline_figure(ops, peaks, bandwidth, title)
    make_folder(Path(path).parent)
    save_figure(fig, Path(path), dpi=110, format="png")
    return fig
