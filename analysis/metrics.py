"""Summary metrics with vLLM benchmark names (definitions in docs/metrics.md)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analysis.autoscaling import autoscaler_metrics
from analysis.config import slo_is_set
from sim.cost.base import BOUNDS
from sim.errors import ConfigError
from sim.records import Records

DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)  # reported when a summary is given none


@dataclass
class MetricsConfig:
    """Schema of the ``metrics`` node: the latency percentiles a run reports, as
    ``vllm bench serve --metric-percentiles`` (50 is ``median_``, reported in any case)."""

    percentiles: list[float] = field(default_factory=lambda: list(DEFAULT_PERCENTILES))


def check_metrics(metrics) -> None:
    """``metrics.percentiles``: at least one, each in (0, 100], none twice."""
    qs = list(metrics.percentiles)
    if not qs:
        raise ConfigError("metrics.percentiles", qs, "at least one percentile in (0, 100], "
                          "e.g. [50,90,99]")
    seen = set()
    for q in qs:
        if isinstance(q, bool) or not isinstance(q, (int, float)) or not (
                math.isfinite(q) and 0 < q <= 100):
            raise ConfigError("metrics.percentiles", q, "each percentile a number in (0, 100]")
        if float(q) in seen:
            raise ConfigError("metrics.percentiles", q,
                              "listed twice: each percentile at most once")
        seen.add(float(q))


def percentile_label(q: float) -> str:
    """vLLM's name of percentile ``q``: ``median`` for 50, else ``p`` and the number as
    ``vllm bench serve`` writes it (``p99``, ``p99.9``)."""
    q = float(q)
    if q == 50:
        return "median"
    return f"p{int(q) if q.is_integer() else q}"


def stat_labels(percentiles: Sequence[float] | None = None) -> list[tuple[str, float]]:
    """(label, q) of each percentile a summary reports: ``median`` first (vLLM reports it
    whatever ``--metric-percentiles`` asks), then the others of ``percentiles``
    (``DEFAULT_PERCENTILES`` when None) in their order."""
    qs = DEFAULT_PERCENTILES if percentiles is None else percentiles
    return [("median", 50.0), *((percentile_label(q), float(q)) for q in qs
                                if float(q) != 50)]


_LABEL = re.compile(r"p(\d+(?:\.\d+)?(?:e[+-]?\d+)?)")  # percentile_label's p99, p99.9


def percentile_of(label: str) -> float:
    """The percentile a ``percentile_label`` names (``median`` → 50, ``p99.9`` → 99.9)."""
    return 50.0 if label == "median" else float(label[1:])


def reported_labels(keys, name: str) -> list[str]:
    """The percentile labels among ``keys`` (a summary's, a sweep table's columns) for metric
    ``name``: ``median`` first when there, then each ``p<q>`` in the keys' order."""
    keys = [str(k) for k in keys]
    suffix = f"_{name}"
    found = [k[:-len(suffix)] for k in keys if k.endswith(suffix)
             and _LABEL.fullmatch(k[:-len(suffix)])]
    return (["median"] if f"median{suffix}" in keys else []) + found


def per_request_latencies(requests: pd.DataFrame) -> pd.DataFrame:
    """Completed requests with ``ttft_ms``, ``tpot_ms`` (NaN for one-token outputs), ``e2el_ms``."""
    done = requests[requests["status"] == "completed"]
    ttft = (done["first_token_s"] - done["arrival_s"]) * 1e3
    e2el = (done["completion_s"] - done["arrival_s"]) * 1e3
    out = done["generated_tokens"]
    tpot = ((e2el - ttft) / (out - 1)).where(out > 1)
    return pd.DataFrame(
        {
            "request_id": done["request_id"],
            "ttft_ms": ttft,
            "tpot_ms": tpot,
            "e2el_ms": e2el,
            "output_tokens": out,
        }
    )


def value_stats(name: str, values: np.ndarray,
                percentiles: Sequence[float] | None = None) -> dict:
    """``mean_``, ``median_`` and each percentile's (``stat_labels``: by default ``p90_``,
    ``p99_``) statistic of ``name`` over the finite ``values`` (NaN when there are none)."""
    values = values[np.isfinite(values)]
    labels = stat_labels(percentiles)
    if not len(values):
        return {f"{p}_{name}": float("nan") for p in ("mean", *(lb for lb, _ in labels))}
    d = {f"mean_{name}": float(values.mean())}
    qs = np.percentile(values, [q for _, q in labels])
    for (label, _), v in zip(labels, qs, strict=True):
        d[f"{label}_{name}"] = float(v)
    return d


def meets_slo(lat: pd.DataFrame, slo) -> pd.Series:
    """Per completed request: True when every bound of the SLO that is set holds."""
    ok = pd.Series(True, index=lat.index)
    for key in ("ttft_ms", "tpot_ms", "e2el_ms"):
        bound = getattr(slo, key, None) if slo is not None else None
        if bound is not None:
            # a one-token output has no TPOT; it cannot violate a TPOT bound
            ok &= lat[key].fillna(0.0) <= bound
    return ok


def summarize(records: Records, slo=None, percentiles: Sequence[float] | None = None) -> dict:
    """All summary metrics of one run, as a flat JSON-ready dict (``classes``, when the
    requests have a ``request_class``, nests the same latency metrics per class); latencies
    have the ``stat_labels`` of ``percentiles``."""
    req, tl = records.requests, records.timeline
    lat = per_request_latencies(req)
    completed = len(lat)
    rejected = int((req["status"] == "rejected").sum())
    failed = int((req["status"] == "failed").sum())
    done = req[req["status"] == "completed"]
    duration = float(done["completion_s"].max() - req["arrival_s"].min()) if completed else 0.0
    # nothing completed: zero throughput (not NaN); a zero-length span with completions is NaN
    per_s = (lambda x: x / duration) if duration > 0 else (
        lambda x: 0.0 if x == 0 else float("nan"))
    out_tokens = int(done["generated_tokens"].sum())
    in_tokens = int(done["input_tokens"].sum())
    s = {
        "completed": completed,
        "rejected": rejected,
        "rejected_reasons": _reasons(req, "rejected", "reject_reason"),
        "failed": failed,
        "failed_reasons": _reasons(req, "failed", "fail_reason"),
        "duration_s": duration,
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": per_s(completed),
        "output_throughput": per_s(out_tokens),
        "total_token_throughput": per_s(in_tokens + out_tokens),
    }
    s.update(_latency_stats(lat, percentiles))
    itl = records.itl
    s["mean_itl_ms"] = itl.total / itl.count * 1e3 if itl.count else float("nan")
    for label, q in stat_labels(percentiles):
        s[f"{label}_itl_ms"] = itl.quantile(q / 100) * 1e3
    if slo_is_set(slo):
        good = int(meets_slo(lat, slo).sum())
        s["request_goodput"] = per_s(good)
        offered = completed + rejected + failed
        s["slo_attainment"] = good / offered if offered else float("nan")
    s.update(kv_metrics(req, records.meta))
    s.update(cluster_metrics(req, records.meta))
    s.update(autoscaler_metrics(req, records.meta))
    s.update(step_metrics(tl, records.meta))
    s.update(
        {
            k: records.meta[k]
            for k in ("num_gpu_blocks", "max_concurrent_tokens", "invariant_checks", "engine",
                      "frontend")
            if k in records.meta
        }
    )
    if "request_class" in req:
        s["classes"] = class_metrics(req, slo, per_s, percentiles)
    return s


def _reasons(req: pd.DataFrame, status: str, column: str) -> dict:
    """How many requests of ``status`` there are per reason in ``column``."""
    if column not in req:
        return {}
    return req.loc[req["status"] == status, column].value_counts().to_dict()


def _latency_stats(lat: pd.DataFrame, percentiles: Sequence[float] | None = None) -> dict:
    d = {}
    for name in ("ttft_ms", "tpot_ms", "e2el_ms"):
        d.update(value_stats(name, lat[name].to_numpy(float), percentiles))
    return d


def _column_sum(req: pd.DataFrame, col: str) -> int:
    return int(req[col].sum()) if col in req else 0


def kv_metrics(req: pd.DataFrame, meta: dict) -> dict:
    """Preemptions, swaps and the prefix-cache hit rate: the share of completed requests'
    prompt tokens served from the cache (None when prefix caching is off)."""
    hit = float("nan")
    if meta.get("prefix_caching") and "cached_tokens" in req:
        done = req[req["status"] == "completed"]
        prompt = int(done["input_tokens"].sum())
        hit = int(done["cached_tokens"].sum()) / prompt if prompt else float("nan")
    return {"num_preemptions": _column_sum(req, "num_preemptions"),
            "num_swaps": _column_sum(req, "num_swaps"),
            "prefix_cache_hit_rate": hit}


def cluster_metrics(req: pd.DataFrame, meta: dict) -> dict:
    """Replicas, faults (settings and event counts), retries, availability, and KV transfers
    of a disaggregated run."""
    n = int(meta.get("num_replicas", 1))
    d = {"num_replicas": n,
         "num_failures": int(meta.get("num_failures", 0)),
         "num_straggler_episodes": int(meta.get("num_straggler_episodes", 0)),
         "num_link_degradation_episodes": int(meta.get("num_link_degradation_episodes", 0)),
         "retried_requests": int((req["num_retries"] > 0).sum()) if "num_retries" in req else 0,
         "num_retries": _column_sum(req, "num_retries")}
    span = meta.get("sim_time_s", 0.0)
    down = meta.get("replica_downtime_s", 0.0)
    d["availability"] = 1.0 - down / (n * span) if span else float("nan")
    if "faults" in meta:
        d["faults"] = meta["faults"]
    if "kv_transfer_end_s" in req and req["kv_transfer_end_s"].notna().any():
        ms = ((req["kv_transfer_end_s"] - req["kv_transfer_start_s"]) * 1e3).dropna()
        d["mean_kv_transfer_ms"] = float(ms.mean())
        d["p99_kv_transfer_ms"] = float(np.percentile(ms, 99))
    return d


def class_metrics(req: pd.DataFrame, slo, per_s,
                  percentiles: Sequence[float] | None = None) -> dict:
    """Per request class: counts, latency statistics, goodput under ``slo`` and, when requests
    carry their own ``ttft_slo_ms``, the share that met it (rejections and failures count as
    misses)."""
    out = {}
    for name, rows in req.groupby("request_class", sort=True):
        lat = per_request_latencies(rows)
        completed, rejected = len(lat), int((rows["status"] == "rejected").sum())
        failed = int((rows["status"] == "failed").sum())
        d = {"completed": completed, "rejected": rejected, "failed": failed,
             "request_throughput": per_s(completed)}
        d.update(_latency_stats(lat, percentiles))
        total = completed + rejected + failed
        if slo_is_set(slo):
            good = int(meets_slo(lat, slo).sum())
            d["request_goodput"] = per_s(good)
            d["slo_attainment"] = good / total if total else float("nan")
        if "ttft_slo_ms" in rows:
            target = rows.loc[lat.index, "ttft_slo_ms"]
            met = int((lat["ttft_ms"] <= target.fillna(np.inf)).sum())
            d["ttft_slo_attainment"] = met / total if total else float("nan")
        out[str(name)] = d
    return out


def step_rows(tl: pd.DataFrame) -> pd.DataFrame:
    """The engine steps of a timeline (without the KV-transfer rows of a disaggregated run)."""
    return tl[tl["kind"] == 0] if "kind" in tl else tl


def kv_usage(tl: pd.DataFrame, meta: dict) -> np.ndarray | None:
    """Per timeline row, the fraction of its replica's KV blocks in use (None if unknown);
    ``tl``: a timeline frame, or a dict of its column arrays."""
    blocks = meta.get("replica_num_gpu_blocks")
    if blocks is not None and "replica" in tl:
        cap = np.asarray(blocks, float)[np.asarray(tl["replica"])]
    elif meta.get("num_gpu_blocks"):
        cap = float(meta["num_gpu_blocks"])
    else:
        return None
    return np.asarray(tl["kv_blocks_used"]) / cap


def step_metrics(tl: pd.DataFrame, meta: dict) -> dict:
    """What the engine steps looked like: batch size, KV usage, and which roof bound them.
    Means are weighted by step time over every replica's steps (from the timeline's rows, or
    from each replica's running totals when the run kept no timeline)."""
    if "step_totals" in meta:
        return _step_metrics_from_totals(meta["step_totals"], meta)
    tl = step_rows(tl)
    if not len(tl):
        return {"num_steps": 0}
    w = tl["step_time_s"].to_numpy()
    total = w.sum()
    d = {
        "num_steps": int(len(tl)),
        "mean_batch_size": float(np.average(tl["batch_size"], weights=w)),
        "mean_step_time_ms": float(w.mean() * 1e3),
    }
    usage = kv_usage(tl, meta)
    if usage is not None:
        d["mean_kv_usage"] = float(np.average(usage, weights=w))
        d["max_kv_usage"] = float(usage.max())
    for b in BOUNDS:
        d[f"{b}_bound_share"] = float(tl[f"{b}_s"].sum() / total) if total else 0.0
    return d


def _step_metrics_from_totals(totals: list[dict], meta: dict) -> dict:
    """``step_metrics`` from per-replica ``sim.records.StepTotals`` (same sums, streamed)."""
    steps = sum(t["num_steps"] for t in totals)
    if not steps:
        return {"num_steps": 0}
    total = sum(t["time_s"] for t in totals)
    d = {"num_steps": int(steps),
         "mean_batch_size": sum(t["batch_time"] for t in totals) / total,
         "mean_step_time_ms": total / steps * 1e3}
    blocks = meta.get("replica_num_gpu_blocks") or [meta.get("num_gpu_blocks")] * len(totals)
    if all(blocks):
        pairs = list(zip(totals, blocks, strict=True))
        d["mean_kv_usage"] = sum(t["kv_time"] / b for t, b in pairs) / total
        d["max_kv_usage"] = max(t["max_kv_blocks"] / b for t, b in pairs if t["num_steps"])
    for b in BOUNDS:
        d[f"{b}_bound_share"] = sum(t[f"{b}_s"] for t in totals) / total if total else 0.0
    return d
