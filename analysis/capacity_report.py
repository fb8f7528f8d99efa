"""What a capacity plan shows people: the plot of GPUs over the horizon and its Markdown."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from analysis.files import save_figure
from analysis.markdown import md_table
from analysis.verdict import fmt, metric_label, metric_unit


def plot_gpus(periods: list[dict], path: Path) -> None:
    """GPUs needed per month (provisioned for the busiest hour, and the day's mean when
    autoscaled hourly), with the busiest-hour rate on a second axis."""
    month = np.array([p["month"] for p in periods])
    fig = Figure(figsize=(8, 4.5))
    ax = fig.subplots()
    ax.step(month, [p["gpus"] for p in periods], where="mid", marker="o",
            label="GPUs (provisioned for the peak)")
    ax.plot(month, [p["autoscaled_gpu_hours_per_day"] / 24 for p in periods], linestyle="--",
            marker=".", label="mean GPUs if autoscaled hourly")
    unverified = [p for p in periods if not p["verified"]]
    if unverified:
        ax.scatter([p["month"] for p in unverified], [p["gpus"] for p in unverified],
                   marker="x", color="red", zorder=3, label="not verified")
    ax.set_xlabel("month")
    ax.set_ylabel("GPUs")
    ax.set_ylim(bottom=0)
    ax2 = ax.twinx()
    ax2.plot(month, [p["peak_rate"] for p in periods], color="grey", alpha=0.6,
             label="busiest-hour rate")
    ax2.set_ylabel("busiest-hour rate (req/s)")
    ax2.set_ylim(bottom=0)
    lines = ax.get_legend_handles_labels()
    more = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="upper left")
    ax.set_title("GPUs needed over the forecast horizon")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


def _slo_text(slo: dict) -> str:
    parts = []
    for m, b in slo.items():
        unit = metric_unit(m)
        op = "≥" if m == "slo_attainment" else "≤"
        parts.append(f"{metric_label(m)} {op} {fmt(b)}{' ' + unit if unit else ''}")
    return ", ".join(parts)


def capacity_markdown(r: dict) -> str:
    """A capacity plan (``capacity.json``) as Markdown."""
    c = r["config"]
    out = ["# Capacity plan", "",
           f"{c['model']} on {c['hardware']} (tp {c['tensor_parallel_size']} × pp "
           f"{c['pipeline_parallel_size']} = {c['gpus_per_replica']} GPU(s) per replica), "
           f"backend `{c['backend']}`, scheduler `{c['scheduler']}`, workload "
           f"`{c['workload']}`, router `{c['router']}`.", "",
           f"SLO: {_slo_text(r['slo'])}; and the replica keeps up with the offered load.", ""]
    s = r["search"]
    if not r["feasible"]:
        b = r["best_found"]
        out += ["**The SLO cannot be met**: no rate down to the search's minimum meets it. "
                f"Closest: {fmt(b['rate'])} req/s, which misses {'; '.join(b['violations'])}.",
                ""]
    else:
        lo, hi = s["bracket"]
        out += [f"**Maximum sustainable rate of one replica: {fmt(r['max_rate_per_replica'])} "
                f"req/s** (meets the SLO at {fmt(lo)}, misses it at {fmt(hi)}; "
                f"{s['simulations']} simulations of {c['num_requests_per_search_run']} requests "
                f"per seed, seeds {c['seeds']}, {fmt(s['wall_s'])} s).", ""]
    metrics = list(r["slo"])
    rows = [[fmt(e["rate"]), "yes" if e["ok"] else "no",
             *(fmt(e["metrics"].get(m)) for m in metrics),
             fmt(e["metrics"].get("throughput_ratio"))] for e in s["evaluations"]]
    out += ["## Rate search (bracketing, then bisection)", "",
            md_table(["rate (req/s)", "meets SLO", *(metric_label(m) for m in metrics),
                      "throughput ratio"], rows), ""]
    if r.get("config_search"):
        rows = [[" ".join(x["overrides"]), x["gpus_per_replica"],
                 fmt(x.get("max_rate_per_replica")) if "error" not in x else x["error"],
                 fmt(x.get("gpu_hours_per_million_requests")),
                 "**chosen**" if x.get("chosen") else ""] for x in r["config_search"]]
        out += ["## Configuration search", "",
                md_table(["overrides", "GPUs/replica", "max rate (req/s)",
                          "GPU-hours per million requests", ""], rows), ""]
    if r.get("periods"):
        rows = [[p["month"], fmt(p["peak_rate"]), p["replicas"], p["gpus"],
                 "yes" if p["verified"] else f"no ({p['note']})",
                 f"${p['cost_per_hour']:,.2f}", f"${p['cost_per_million_tokens']:,.3f}",
                 f"${p['autoscaled_cost_per_day']:,.0f}"] for p in r["periods"]]
        out += [f"## Forecast (GPU-hour price ${r['gpu_hour_price']:g})", "",
                "Each month is sized for its busiest hour and verified by simulating the "
                "cluster with its router at that size, and at one replica fewer, which must "
                "miss the SLO. Cost per million tokens (input + output) is for capacity "
                "provisioned for the peak all day, over the day's average traffic; the "
                "autoscaled cost follows the diurnal profile hour by hour.", "",
                md_table(["month", "peak rate (req/s)", "replicas", "GPUs", "verified",
                          "cost per hour", "cost per million tokens",
                          "autoscaled cost per day"], rows), "",
                "![GPUs over the horizon](capacity_gpus.png)", ""]
    days = [p for p in r.get("periods") or () if "day" in p]
    if days:
        rows = [[p["month"], fmt(p["day"]["mean_replicas"]), p["day"]["peak_replicas"],
                 fmt(p["day"]["gpu_hours"]), f"${p['day']['cost']:,.0f}",
                 ", ".join(map(str, p["day"]["hours_missing_slo"])) or "none"] for p in days]
        out += ["## A day on the autoscaler", "",
                f"Each month's day simulated with the autoscaler in the loop "
                f"({days[0]['day']['hour_s']:g} s hours; scale-up delay "
                f"{days[0]['day']['scale_up_delay_s']:.0f} s), the SLO judged hour by hour.", "",
                md_table(["month", "mean replicas", "peak replicas", "GPU-hours per day",
                          "cost per day", "hours missing the SLO"], rows), ""]
    return "\n".join(out) + "\n"
