"""``python -m analysis.compare DIR [factor=scheduler] [metrics=...] [warmup=auto|SECONDS]
[baseline=NAME] [correction=holm|none] [min_effect=0.01] [plots=true|false]``: compare the
designs of a sweep with confidence.

The sweep varies a design factor (``scheduler`` by default) and replicates over ``seed``;
every design sees the same arrivals and lengths for a given seed (common random numbers:
``scenarios.requests_for_seed`` draws them from the seed alone), so designs are compared by
paired differences per seed. Per design and setting (rate and any other override) it gives
the mean and 95% t-interval of each steady-state metric; per design against the baseline the
mean paired difference with its interval and a plain verdict. A difference counts as
significant when its Holm-adjusted p-value is below 0.05, the family being the metrics of one
verdict (one design against the baseline at one setting), so a verdict claims a false
difference with probability at most 5%. A significant difference smaller than
``min_effect`` (1%) of the baseline's mean is called negligible rather than a win or a loss.
Writes ``compare.json``, ``compare.md`` and PNG plots into DIR.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from analysis.collect import collect_sweep, override_columns
from analysis.compare_tables import (
    PER_GPU,
    design_table,
    difference_table,
    mark_unsettled,
    metric_column,
)
from analysis.config import check_slo
from analysis.files import write_json, write_text
from analysis.inputs import check_warmup, fields_of, output_dir, read_parquet, read_yaml
from analysis.stats import LEVEL
from analysis.steady import (
    STEADY_METRICS,
    latencies,
    steady_metrics,
    warmup_cut,
)
from analysis.verdict import verdict_sentences
from sim.errors import ConfigError, OutputError, report_error

DEFAULT_METRICS = ("median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms",
                   "request_throughput", "request_goodput")
OPTIONS = {"factor": "scheduler", "metrics": None, "warmup": "auto", "baseline": None,
           "correction": "holm", "min_effect": "0.01", "plots": "true"}
NOT_GROUPS = ("job", "dir", "status", "error", "seed")
# what the steady-state metrics read of a run's requests.parquet
REQUEST_COLUMNS = ("request_id", "arrival_s", "first_scheduled_s", "first_token_s",
                   "completion_s", "input_tokens", "generated_tokens", "status")


def parse_args(argv: list[str]) -> tuple[Path, dict]:
    """``DIR key=value ...`` → (DIR, options); an unknown key or a missing DIR is a
    ``ConfigError``."""
    dirs = [a for a in argv if "=" not in a]
    if len(dirs) != 1:
        raise ConfigError("DIR", " ".join(dirs) or None, "exactly one sweep directory")
    opts = dict(OPTIONS)
    for a in argv:
        if "=" in a:
            key, _, value = a.partition("=")
            if key not in OPTIONS:
                raise ConfigError(key, value, f"an option, one of {sorted(OPTIONS)}")
            opts[key] = value
    if opts["plots"] not in ("true", "false"):
        raise ConfigError("plots", opts["plots"], "true or false")
    if opts["correction"] not in ("holm", "none"):
        raise ConfigError("correction", opts["correction"], "holm or none")
    try:
        opts["min_effect"] = float(opts["min_effect"])
    except ValueError:
        opts["min_effect"] = -1.0
    if not (np.isfinite(opts["min_effect"]) and opts["min_effect"] >= 0):
        raise ConfigError("min_effect", opts["min_effect"], "a fraction >= 0 (0.01 = 1%)")
    if opts["warmup"] != "auto":
        try:
            w = float(opts["warmup"])
        except ValueError:
            w = -1.0
        if not (np.isfinite(w) and w >= 0):
            raise ConfigError("warmup", opts["warmup"], "auto or a number of seconds >= 0")
        opts["warmup"] = w
    return Path(dirs[0]), opts


def gpus_of(cfg) -> int:
    """GPUs of the whole deployment a run simulated (every replica's tp × pp)."""
    c = cfg.cluster
    if c.get("disaggregated", False):
        tp = c.tensor_parallel_size
        p = c.prefill_tensor_parallel_size or tp
        d = c.decode_tensor_parallel_size or tp
        return int((c.prefill_replicas * p + c.decode_replicas * d) * c.pipeline_parallel_size)
    return int(c.replicas * c.tensor_parallel_size * c.pipeline_parallel_size)


def load_jobs(root: Path, factor: str) -> tuple[pd.DataFrame, list[str]]:
    """The sweep's finished jobs with their design, setting columns, seed, rate and GPUs;
    and the names of the setting columns (overrides other than the factor and the seed)."""
    table = collect_sweep(root)
    if not _override_columns(table):
        raise ConfigError("DIR", str(root), "the folder of a -m sweep over some override; its "
                          "jobs have none (a single run's folder?)")
    if factor not in _override_columns(table):
        raise ConfigError("factor", factor, "an override of this sweep, one of "
                          f"{_override_columns(table)}")
    ok = table[table["status"] == "ok"].copy()
    if ok.empty:
        raise ConfigError("DIR", str(root), "a sweep with at least one finished job")
    ok["design"] = ok[factor].astype(str)
    ok["seed"] = ok["seed"] if "seed" in ok else 0
    settings = [job_settings(root / d) for d in ok["dir"]]
    ok["rate"], ok["gpus"] = [s[0] for s in settings], [s[1] for s in settings]
    ok.attrs["total_jobs"] = len(table)
    groups = [c for c in _override_columns(table) if c not in (factor, "seed", "workload.rate")]
    groups = [c for c in groups if ok[c].astype(str).nunique() > 1]
    return ok.reset_index(drop=True), ["rate", *groups]


def job_settings(job_dir: Path) -> tuple[float, int, Any]:
    """What the comparison reads of a job's resolved config (``.hydra/config.yaml``): its
    rate (NaN for a trace), its GPUs and its SLO."""
    path = job_dir / ".hydra" / "config.yaml"
    what = "the resolved config of a python -m sim run (a YAML mapping)"
    doc = read_yaml(path, "config.yaml", what)
    with fields_of(path, "config.yaml", what):
        cfg = OmegaConf.create(doc)
        rate = float(cfg.workload.rate) if cfg.workload.arrival != "trace" else np.nan
        if math.isinf(rate):
            raise ConfigError("config.yaml", str(path), "a run at a finite workload.rate (a "
                              "burst, rate inf, has no steady state to compare)")
        slo = cfg.get("slo")
        if slo is not None:
            check_slo(slo)
        scaler = cfg.cluster.get("autoscaler")
        if scaler is not None and scaler.get("policy", "none") != "none":
            raise ConfigError("config.yaml", str(path), "a run on a fixed replica count (an "
                              "autoscaled run's GPUs move with its load: compare the "
                              "gpu_hours and cost of its summary.json instead)")
        return rate, gpus_of(cfg), slo


def job_requests(job_dir: Path) -> pd.DataFrame:
    """A finished job's ``requests.parquet``, with the columns the steady-state metrics read
    and at least one completed request."""
    path = job_dir / "requests.parquet"
    what = "a run's request table (parquet) with at least one completed request"
    requests = read_parquet(path, "requests.parquet", what, REQUEST_COLUMNS)
    if not (requests["status"] == "completed").any():
        raise ConfigError("requests.parquet", str(path), f"{what}; none is completed")
    return requests


def _override_columns(table: pd.DataFrame) -> list[str]:
    """The sweep's override columns that can set a design or a setting."""
    return [c for c in override_columns(table) if c not in NOT_GROUPS]


def steady_table(jobs: pd.DataFrame, root: Path, groups: list[str], warmup) -> tuple[
        pd.DataFrame, dict[int, pd.DataFrame]]:
    """Per job the steady-state metrics, measured from one warm-up cut per replication (the
    latest of its designs' cuts, so paired designs are measured on the same requests); and
    per job its steady requests' latencies (for ECDFs)."""
    reqs = {}
    cuts = []
    for i, row in jobs.iterrows():
        r = job_requests(root / row["dir"])
        reqs[i] = r
        w = warmup_cut(r, warmup)
        cuts.append((w.dropped, w.cut_s, w.settled, w.rule))
    jobs = jobs.assign(warmup_dropped=[c[0] for c in cuts], warmup_cut_s=[c[1] for c in cuts],
                       warmup_settled=[c[2] for c in cuts], warmup_rule=[c[3] for c in cuts])
    rep = jobs.groupby([*groups, "seed"], dropna=False)["warmup_cut_s"].transform("max")
    jobs["cut_s"] = rep
    rows, lat = [], {}
    for i, row in jobs.iterrows():
        if warmup != "auto":
            check_warmup(reqs[i], row["cut_s"], "warmup", warmup, f"job {row['dir']}")
        m = steady_metrics(reqs[i], row["cut_s"], job_settings(root / row["dir"])[2])
        m["output_throughput_per_gpu"] = m["output_throughput"] / row["gpus"]
        rows.append(m)
        lat[i] = latencies(reqs[i][reqs[i]["arrival_s"] >= row["cut_s"]])
    steady = pd.DataFrame(rows, index=jobs.index)
    return pd.concat([jobs, steady.add_prefix("steady.")], axis=1), lat


def compare(root: Path, opts: dict) -> dict:
    """Everything the comparison finds; also writes compare.json, compare.md and plots."""
    from analysis.compare_plots import write_compare_plots
    from analysis.report_md import compare_markdown

    output_dir(root, "DIR")
    jobs, groups = load_jobs(root, str(opts["factor"]))
    total = jobs.attrs["total_jobs"]
    designs = list(dict.fromkeys(jobs.sort_values("job")["design"]))
    baseline = opts["baseline"] or designs[0]
    if baseline not in designs:
        raise ConfigError("baseline", baseline, f"one of the designs {designs}")
    known = jobs.assign(**{f"steady.{m}": 0.0 for m in (*STEADY_METRICS, *PER_GPU)})
    metrics = opts["metrics"].split(",") if opts["metrics"] else None
    for m in metrics or ():
        metric_column(known, m)  # before the work: a typo fails fast
    jobs, lat = steady_table(jobs, root, groups, opts["warmup"])
    metrics = metrics or [m for m in DEFAULT_METRICS
                          if f"steady.{m}" in jobs and jobs[f"steady.{m}"].notna().any()]
    for m in metrics:
        metric_column(jobs, m)
    means = design_table(jobs, groups, metrics)
    diffs = difference_table(jobs, groups, metrics, baseline, opts["correction"],
                             opts["min_effect"])
    diffs = mark_unsettled(diffs, jobs, groups, baseline)
    result = {
        "dir": str(root), "factor": opts["factor"], "baseline": baseline, "designs": designs,
        "settings": groups, "metrics": metrics, "correction": opts["correction"],
        "min_effect": opts["min_effect"],
        "level": LEVEL, "seeds": sorted(jobs["seed"].unique().tolist()),
        "failed_jobs": int(total - len(jobs)),
        "warmup": warmup_summary(jobs),
        "jobs": jobs[["job", "design", "seed", *groups, "warmup_dropped", "warmup_cut_s",
                      "cut_s"]].to_dict("records"),
        "means": means.to_dict("records"), "differences": diffs.to_dict("records"),
        "verdicts": verdict_sentences(diffs, groups, opts["min_effect"]),
    }
    result["plots"] = ([p.name for p in write_compare_plots(jobs, lat, groups, root)]
                       if opts["plots"] == "true" else [])
    write_json(root / "compare.json", result, default=str)
    write_text(root / "compare.md", compare_markdown(result))
    return result


def warmup_summary(jobs: pd.DataFrame) -> dict:
    """How the warm-up was chosen and how long it was, over all jobs."""
    start = jobs["cut_s"] - jobs["warmup_cut_s"]
    return {"rule": str(jobs["warmup_rule"].iloc[0]),
            "applied": "per replication (setting × seed): the latest cut of its designs",
            "dropped_requests": {"min": int(jobs["warmup_dropped"].min()),
                                 "median": float(jobs["warmup_dropped"].median()),
                                 "max": int(jobs["warmup_dropped"].max())},
            "cut_s": {"min": float(jobs["cut_s"].min()),
                      "median": float(jobs["cut_s"].median()),
                      "max": float(jobs["cut_s"].max())},
            "extra_for_pairing_s_max": float(start.max()),
            "unsettled_jobs": [
                {"job": int(r["job"]), "design": r["design"], "seed": int(r["seed"]),
                 "rate": float(r["rate"])} for _, r in jobs[~jobs["warmup_settled"]].iterrows()]}




def main(argv: list[str] | None = None) -> int:
    """Command-line entry: one line on stderr and exit code 2 on bad input."""
    try:
        root, opts = parse_args(sys.argv[1:] if argv is None else argv)
        result = compare(root, opts)
    except (ConfigError, OutputError) as e:
        return report_error(e)
    for line in result["verdicts"]:
        print(line)
    print(f"wrote {root / 'compare.md'}, compare.json and {len(result['plots'])} plots")
    return 0


if __name__ == "__main__":
    sys.exit(main())
