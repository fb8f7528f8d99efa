"""``python -m analysis.report DIR``: one Markdown file, ``DIR/report.md``, with the tables and
plots of whatever DIR holds: a capacity plan (``capacity.json``), a design comparison
(``compare.json``), a sweep (job folders with ``.hydra/overrides.yaml``) or one run
(``summary.json``). Plots are linked by relative path, so the folder reads on its own."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from analysis.files import write_text
from analysis.inputs import fields_of, output_dir, read_json
from analysis.markdown import md_table
from analysis.verdict import fmt, fmt_pm, metric_label, metric_unit, setting_text
from sim.errors import ConfigError, OutputError, report_error

RUN_METRICS = ("offered_rate", "completed", "rejected", "request_throughput", "output_throughput",
               "request_goodput", "slo_attainment", "median_ttft_ms", "p99_ttft_ms",
               "median_tpot_ms", "p99_tpot_ms", "p99_itl_ms", "mean_e2el_ms",
               "mean_batch_size", "mean_kv_usage", "num_preemptions", "mean_replicas",
               "peak_replicas", "scale_ups", "drains", "gpu_hours", "cost",
               "arrived_while_scaling_up")
SWEEP_METRICS = ("request_throughput", "request_goodput", "median_ttft_ms", "p99_ttft_ms",
                 "median_tpot_ms", "p99_tpot_ms")


def _images(root: Path, names) -> list[str]:
    return [f"![{n}]({n})" for n in names if (root / n).exists()]


def _run_plots(s: dict) -> list[str]:
    """The plots a run's ``summary.json`` lists as its own (never one an earlier run left)."""
    outputs = s.get("outputs")
    return [n for n in outputs if isinstance(n, str) and n.endswith(".png")] if isinstance(
        outputs, list) else []


def run_markdown(root: Path) -> str:
    """One run: its configuration choices, its load verdict (steady, not steady or
    OVERLOADED), the main metrics and its plots."""
    s = read_json(root / "summary.json", "summary.json", "a run's summary (a JSON object)")
    head = ", ".join(f"{k} `{s[k]}`" for k in ("model", "hardware", "backend", "scheduler",
                                               "workload", "seed") if k in s)
    rows = [[metric_label(k), s[k], metric_unit(k)] for k in RUN_METRICS
            if isinstance(s.get(k), (int, float))]
    out = [f"# Simulation run: {root.name}", "", head, ""]
    verdicts = [s.get("load_verdict"), s.get("jobs_load_verdict")]  # a mixed run has two
    for v in dict.fromkeys(v for v in verdicts if isinstance(v, str)):
        out += [f"**{v}**", ""]
    if s.get("partial"):
        out += [f"**Partial run**: stopped by Ctrl-C at {s.get('interrupted_at_sim_s')} "
                f"simulated s with {s.get('unfinished')} requests unfinished; the metrics "
                "count the requests that ended.", ""]
    out += [md_table(["metric", "value", "unit"], rows), ""]
    hourly = s.get("hourly")
    if isinstance(hourly, list) and hourly and all(isinstance(h, dict) for h in hourly):
        columns = list(hourly[0])
        out += ["## Hour by hour (by arrival)", "",
                md_table(columns, [[h.get(c) for c in columns] for h in hourly]), ""]
    if s.get("pending_outputs"):
        out += [f"Not written: {', '.join(map(str, s['pending_outputs']))} (interrupted).", ""]
    out += _images(root, _run_plots(s))
    out += ["", "Every metric is defined in docs/metrics.md; all metrics of the run are in "
            "`summary.json`."]
    return "\n".join(out) + "\n"


def sweep_markdown(root: Path) -> str:
    """A sweep: one row per job with its overrides, status and main metrics."""
    from analysis.collect import collect_sweep, override_columns

    t = collect_sweep(root)
    over = override_columns(t)
    fixed = [c for c in over if t[c].astype(str).nunique() == 1 and len(t) > 1]
    over = [c for c in over if c not in fixed]
    mets = [m for m in SWEEP_METRICS if m in t]
    rows = [[r["job"], *(r[c] for c in over), r["status"], *(r[m] for m in mets)]
            for _, r in t.iterrows()]
    out = [f"# Sweep: {root.name}", "", f"{len(t)} jobs, "
           f"{int((t['status'] != 'ok').sum())} failed. Whole-run metrics from each job's "
           "`summary.json` (no warm-up removed; `python -m analysis.compare DIR` gives "
           "steady-state comparisons with confidence intervals).", ""]
    if fixed:
        out += ["Same in every job: " + ", ".join(f"`{c}={t[c].iloc[0]}`" for c in fixed), ""]
    out += [md_table(["job", *over, "status", *(metric_label(m) for m in mets)], rows), ""]
    failed = t[t["status"] != "ok"]
    if len(failed):
        out += ["## Failed jobs", ""] + [f"- job {r['job']}: {r['error']}"
                                         for _, r in failed.iterrows()] + [""]
    return "\n".join(out)


def compare_markdown(r: dict) -> str:
    """A design comparison (the result of ``analysis.compare.compare``)."""
    groups, w = r["settings"], r["warmup"]
    out = [f"# Comparison of `{r['factor']}` designs", "",
           f"Designs: {', '.join(f'`{d}`' for d in r['designs'])}; baseline `{r['baseline']}`; "
           f"{len(r['seeds'])} seeds ({', '.join(map(str, r['seeds']))}); "
           f"failed jobs: {r['failed_jobs']}.", "", "## Verdicts", ""]
    out += [f"- {v}" for v in r["verdicts"]] or ["- (no pair of designs to compare)"]
    corr = ("Holm-adjusted over the metrics of each verdict (one design against the "
            "baseline at one setting), so a verdict claims a false difference with "
            "probability at most 5%"
            if r["correction"] == "holm" else "not adjusted for multiple comparisons")
    out += ["", "## How it was measured", "",
            f"- Replications: one per seed; every design gets the same arrivals and lengths for "
            f"a seed (common random numbers), so designs are compared by paired differences "
            f"per seed. Intervals are {int(r['level'] * 100)}% Student-t intervals over seeds.",
            f"- Significance: paired t-test, p-value {corr}. A significant difference under "
            f"{r.get('min_effect', 0.01):.0%} of the baseline's mean is reported as "
            "negligible.",
            f"- Warm-up: {w['rule']} (requests in arrival order), applied {w['applied']}. "
            f"Requests dropped per job: min {w['dropped_requests']['min']}, median "
            f"{fmt(w['dropped_requests']['median'])}, max {w['dropped_requests']['max']}; "
            f"the cut falls {fmt(w['cut_s']['min'])}–{fmt(w['cut_s']['max'])} s (median "
            f"{fmt(w['cut_s']['median'])} s) after the start."
            + (" Runs whose TTFT never settled (overloaded; cut capped at half the run): "
               + ", ".join(f"`{u['design']}` at {fmt(u['rate'])} req/s seed {u['seed']}"
                           for u in w["unsettled_jobs"]) + "." if w["unsettled_jobs"] else ""),
            "- Steady-state metrics count requests that arrived after the cut; throughputs "
            "divide by the time from the cut to their last completion.", "",
            "## Mean per design (± 95% CI over seeds)", ""]
    means = pd.DataFrame(r["means"])
    if len(means):
        designs = r["designs"]
        rows = []
        for _, g in means.groupby([*groups, "metric"], sort=False, dropna=False):
            by = {d: fmt_pm(x["mean"], x["ci"]) for d, x in
                  zip(g["design"], g.to_dict("records"), strict=True)}
            first = g.iloc[0]
            unit = metric_unit(first["metric"])
            rows.append([setting_text(first, groups) or "-",
                         metric_label(first["metric"]) + (f" ({unit})" if unit else ""),
                         *(by.get(d, "-") for d in designs)])
        out += [md_table(["setting", "metric", *(f"`{d}`" for d in designs)], rows), ""]
    diffs = pd.DataFrame(r["differences"])
    if len(diffs):
        out += [f"## Paired differences vs `{r['baseline']}` (design − baseline)", ""]
        rows = [[f"`{x['design']}`", setting_text(x, groups) or "-", metric_label(x["metric"]),
                 fmt_pm(x["diff"], x["ci"]), fmt(x["p"]), fmt(x["p_adj"]),
                 _significance(x)] for x in diffs.to_dict("records")]
        out += [md_table(["design", "setting", "metric", "difference ± 95% CI", "p",
                          "p adjusted", "significant"], rows), ""]
    out += ["## Plots", ""] + [f"![{p}]({p})" for p in r.get("plots", [])]
    return "\n".join(out) + "\n"


def _significance(row: dict) -> str:
    if not row["significant"]:
        return "no"
    return "yes, negligible" if row.get("negligible") else "yes"


def _document_markdown(path: Path, what: str, markdown) -> str:
    """``markdown`` of the JSON object in ``path``; a field it lacks or cannot read names
    the file."""
    doc = read_json(path, path.name, what)
    with fields_of(path, path.name, what):
        return markdown(doc)


def write_report(root: Path) -> Path:
    """Write ``root/report.md`` for whatever ``root`` holds; returns its path."""
    root = Path(root)
    if not root.is_dir():
        raise ConfigError("DIR", str(root), "an existing output directory")
    output_dir(root, "DIR")
    if (root / "capacity.json").exists():
        from analysis.capacity_report import capacity_markdown
        text = _document_markdown(root / "capacity.json", "a capacity plan of python -m "
                                  "analysis.capacity (a JSON object)", capacity_markdown)
    elif (root / "compare.json").exists():
        text = _document_markdown(root / "compare.json", "a comparison of python -m "
                                  "analysis.compare (a JSON object)", compare_markdown)
    elif any(root.glob("*/.hydra/overrides.yaml")):
        text = sweep_markdown(root)
    elif (root / "summary.json").exists():
        text = run_markdown(root)
    else:
        raise ConfigError("DIR", str(root), "a run, sweep, comparison or capacity output "
                          "directory (summary.json, job folders, compare.json or capacity.json)")
    path = root / "report.md"
    write_text(path, text)
    return path


def main(argv: list[str] | None = None) -> int:
    """``python -m analysis.report DIR``: exit code 2 with one line on bad input."""
    args = sys.argv[1:] if argv is None else argv
    try:
        if len(args) != 1:
            raise ConfigError("DIR", " ".join(args) or None, "exactly one output directory")
        path = write_report(Path(args[0]))
    except (ConfigError, OutputError) as e:
        return report_error(e)
    print(f"wrote {path}")
    return 0
