"""The tables of a design comparison: the mean and interval of each metric per design and
setting, and the paired differences against the baseline with their adjusted p-values."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.stats import LEVEL, holm, t_summary
from analysis.steady import HIGHER_IS_BETTER, STEADY_METRICS
from sim.errors import ConfigError

ALPHA = 1 - LEVEL
PER_GPU = ("output_throughput_per_gpu",)


def metric_column(jobs: pd.DataFrame, metric: str) -> str:
    """The column holding ``metric``: its steady-state value, or else the whole-run value
    from ``summary.json``; an unknown name is a ``ConfigError``."""
    if f"steady.{metric}" in jobs:
        return f"steady.{metric}"
    if metric in jobs and pd.api.types.is_numeric_dtype(jobs[metric]):
        return metric
    known = [*STEADY_METRICS, *PER_GPU]
    raise ConfigError("metrics", metric, f"a metric name, e.g. one of {known}")


def design_table(jobs: pd.DataFrame, groups: list[str], metrics: list[str]) -> pd.DataFrame:
    """Mean and 95% t-interval over seeds of each metric, per design and setting."""
    frames = []
    for m in metrics:
        g = jobs.groupby(["design", *groups], sort=False, dropna=False)[metric_column(jobs, m)]
        a = g.agg(["count", "mean", "std"]).reset_index()
        a["ci"], _ = t_summary(a["count"], a["mean"], a["std"].fillna(0.0))
        frames.append(a.rename(columns={"count": "n"}).drop(columns="std").assign(metric=m))
    out = pd.concat(frames, ignore_index=True)
    return _by_metric(out[["design", *groups, "metric", "mean", "ci", "n"]], groups, metrics)


def difference_table(jobs: pd.DataFrame, groups: list[str], metrics: list[str],
                     baseline: str, correction: str, min_effect: float = 0.01) -> pd.DataFrame:
    """Per design other than the baseline, setting and metric: the paired difference
    (design − baseline) over the seeds both ran, its interval, p-value, adjusted p-value
    (Holm over the metrics of one design at one setting), whether it is significant, and
    whether it is negligible: significant but under ``min_effect`` of the baseline's mean."""
    cols = {metric_column(jobs, m): m for m in metrics}
    wide = jobs.pivot_table(index=[*groups, "seed"], columns="design", values=list(cols),
                            aggfunc="first", dropna=False)
    frames = []
    for design in dict.fromkeys(jobs["design"]):
        if design == baseline:
            continue
        for col, m in cols.items():
            if (col, design) not in wide or (col, baseline) not in wide:
                continue
            pair = pd.DataFrame({"d": wide[(col, design)] - wide[(col, baseline)],
                                 "b": wide[(col, baseline)]}).dropna()
            g = pair.groupby(level=list(range(len(groups))), sort=False, dropna=False)
            a = g["d"].agg(["count", "mean", "std"]).assign(base=g["b"].mean())
            if not isinstance(a.index, pd.MultiIndex):
                a.index = pd.MultiIndex.from_arrays([a.index], names=groups)
            a = a.reset_index()
            a["ci"], a["p"] = t_summary(a["count"], a["mean"], a["std"].fillna(0.0))
            frames.append(a.rename(columns={"count": "n", "mean": "diff"}).drop(columns="std")
                          .assign(design=design, baseline=baseline, metric=m))
    if not frames:
        return pd.DataFrame()
    out = pd.concat(frames, ignore_index=True)
    out = out[["design", "baseline", *groups, "metric", "diff", "ci", "p", "n", "base"]]
    out["relative"] = out["diff"] / out["base"].abs().where(out["base"] != 0)
    if correction == "holm":  # one family per verdict sentence: a design at one setting
        fam = out.groupby(["design", *groups], sort=False, dropna=False)["p"]
        out["p_adj"] = fam.transform(lambda p: pd.Series(holm(p.to_numpy()), index=p.index))
    else:
        out["p_adj"] = out["p"]
    out["significant"] = out["p_adj"] < ALPHA
    # significant but too small to matter (CRN makes tiny differences detectable)
    out["negligible"] = out["significant"] & (out["relative"].abs() < min_effect)
    higher = out["metric"].isin(HIGHER_IS_BETTER)
    out["better"] = out["significant"] & np.where(higher, out["diff"] > 0, out["diff"] < 0)
    return _by_metric(out, ["design", *groups], metrics)


def _by_metric(df: pd.DataFrame, keys: list[str], metrics: list[str]) -> pd.DataFrame:
    """Rows ordered by ``keys`` (in order of appearance) and then by the metrics' order."""
    order = {m: i for i, m in enumerate(metrics)}
    first = {k: {v: i for i, v in enumerate(dict.fromkeys(df[k]))} for k in keys}
    sort = pd.DataFrame({**{k: df[k].map(first[k]) for k in keys},
                         "_m": df["metric"].map(order)})
    return df.loc[sort.sort_values([*keys, "_m"], kind="stable").index].reset_index(drop=True)


def mark_unsettled(diffs: pd.DataFrame, jobs: pd.DataFrame, groups: list[str],
                    baseline: str) -> pd.DataFrame:
    """Add ``unsettled`` and ``runs``: of the design's and the baseline's runs at the
    setting, how many never reached a steady state (TTFT still trending: overload)."""
    if diffs.empty:
        return diffs
    keys = [*groups, "design"]
    count = jobs.assign(u=~jobs["warmup_settled"]).groupby(keys, dropna=False)["u"].agg(
        ["sum", "count"]).reset_index()
    base = count[count["design"] == baseline].drop(columns="design")
    both = count.merge(base, on=groups, suffixes=("", "_b"), how="left")
    both["unsettled"] = both["sum"] + both["sum_b"]
    both["runs"] = both["count"] + both["count_b"]
    return diffs.merge(both[[*keys, "unsettled", "runs"]], on=keys, how="left")
