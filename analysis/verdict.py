"""Plain-language verdicts of a design comparison, and the number formatting they share with
the Markdown report: "`sarathi` lowers p99 TPOT vs `vllm` by 41 ± 6 ms at 6 req/s; no
significant difference in p50 TTFT, p99 TTFT"."""

from __future__ import annotations

import math

import pandas as pd

UNITS = {"ms": "ms", "request_throughput": "req/s", "request_goodput": "req/s",
         "output_throughput": "tok/s", "total_token_throughput": "tok/s",
         "output_throughput_per_gpu": "tok/s/GPU", "median_tps": "tok/s",
         "gpu_hours": "GPU-h", "cost": "USD"}
NAMES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2E latency",
         "wait": "queue wait"}
LABELS = {"request_throughput": "throughput", "request_goodput": "goodput",
          "output_throughput": "output throughput", "total_token_throughput": "token throughput",
          "output_throughput_per_gpu": "output throughput per GPU",
          "median_tps": "p50 tokens/s per user", "slo_attainment": "SLO attainment"}


def metric_label(metric: str) -> str:
    """A reader's name for a metric: ``p99_tpot_ms`` → "p99 TPOT"."""
    if metric in LABELS:
        return LABELS[metric]
    parts = metric.split("_")
    if len(parts) == 3 and parts[2] == "ms" and parts[1] in NAMES:
        stat = "p50" if parts[0] == "median" else parts[0]
        return f"{stat} {NAMES[parts[1]]}"
    return metric


def metric_unit(metric: str) -> str:
    """The unit a metric is reported in ("" when it has none)."""
    return "ms" if metric.endswith("_ms") else UNITS.get(metric, "")


def _decimals(x: float) -> int:
    """Decimals that show two significant digits of ``x`` (negative: round to tens, ...)."""
    return 1 - math.floor(math.log10(abs(x))) if x and math.isfinite(x) else 0


def fmt(x: float, digits: int | None = None) -> str:
    """A number with ``digits`` decimals, or else three significant digits without trailing
    zeros (whole numbers from 100 up); "n/a" for NaN or None."""
    if x is None or not math.isfinite(float(x)):
        return "n/a"
    if digits is not None:
        return f"{x:,.{digits}f}"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    text = f"{x:.{max(0, _decimals(x) + 1)}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def fmt_pm(mean: float, half: float | None) -> str:
    """``mean ± half`` rounded to the half-width's second significant digit."""
    if half is None or not math.isfinite(half):
        return fmt(mean)
    d = _decimals(half) if half > 0 else max(0, _decimals(mean))
    if d < 0:  # e.g. 1523 ± 240 → 1,520 ± 240
        return f"{fmt(round(mean, d), 0)} ± {fmt(round(half, d), 0)}"
    return f"{fmt(mean, d)} ± {fmt(half, d)}"


def setting_text(row: dict | pd.Series, groups: list[str]) -> str:
    """Where a comparison was made: "at 6 req/s" plus any other varied override."""
    parts = []
    for g in groups:
        v = row[g]
        if g == "rate":
            if v is not None and math.isfinite(float(v)):
                parts.append(f"at {fmt(float(v))} req/s")
        else:
            parts.append(f"{g}={v}")
    return ", ".join(parts)


def verdict_sentences(diffs: pd.DataFrame, groups: list[str], min_effect: float = 0.01,
                      ) -> list[str]:
    """One sentence per design and setting: each significant difference with its size and
    95% interval, then the significant ones under ``min_effect`` of the baseline, then the
    metrics without a significant difference."""
    if diffs is None or diffs.empty:
        return []
    out = []
    for _, g in diffs.groupby(["design", *groups], sort=False, dropna=False):
        first = g.iloc[0]
        design, base, where = first["design"], first["baseline"], setting_text(first, groups)
        if g["n"].max() < 2:
            out.append(f"`{design}` vs `{base}` {where}: one replication only, no interval "
                       "(add seeds: seed=0,1,2,...)")
            continue
        said, same, small = [], [], []
        for _, r in g.iterrows():
            label = metric_label(r["metric"])
            if not r["significant"]:
                same.append(label)
                continue
            if r.get("negligible", False):
                small.append(label)
                continue
            verb = "lowers" if r["diff"] < 0 else "raises"
            unit = metric_unit(r["metric"])
            said.append(f"{verb} {label} by {fmt_pm(abs(r['diff']), r['ci'])}"
                        f"{' ' + unit if unit else ''}")
        if said:
            text = f"`{design}` " + ", ".join(said) + f" vs `{base}` {where}"
        elif small:
            text = f"`{design}` vs `{base}` {where}: no difference of practical size"
        else:
            text = (f"`{design}` vs `{base}` {where}: no significant difference in any metric")
        if small:
            text += f"; differences under {min_effect:.0%} in {', '.join(small)}"
        if same and (said or small):
            text += f"; no significant difference in {', '.join(same)}"
        if first.get("unsettled", 0) > 0:
            text += (f" (not steady: TTFT still growing at the end of {int(first['unsettled'])}"
                     f" of {int(first['runs'])} runs, an overload)")
        out.append(text)
    return out
