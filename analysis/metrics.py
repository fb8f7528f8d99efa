"""Summary metrics with vLLM benchmark names (definitions in docs/metrics.md)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.config import slo_is_set
from sim.cost.base import BOUNDS
from sim.records import Records

PERCENTILES = (("median", 50), ("p90", 90), ("p99", 99))


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


def _stats(name: str, values: np.ndarray) -> dict:
    values = values[~np.isnan(values)]
    if not len(values):
        return {f"{p}_{name}": float("nan") for p in ("mean", "median", "p90", "p99")}
    d = {f"mean_{name}": float(values.mean())}
    for label, q in PERCENTILES:
        d[f"{label}_{name}"] = float(np.percentile(values, q))
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


def summarize(records: Records, slo=None) -> dict:
    """All summary metrics of one run, as a flat JSON-ready dict."""
    req, tl = records.requests, records.timeline
    lat = per_request_latencies(req)
    completed = len(lat)
    rejected = int((req["status"] == "rejected").sum())
    done = req[req["status"] == "completed"]
    duration = float(done["completion_s"].max() - req["arrival_s"].min()) if completed else 0.0
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: float("nan"))
    out_tokens = int(done["generated_tokens"].sum())
    in_tokens = int(done["input_tokens"].sum())
    s = {
        "completed": completed,
        "rejected": rejected,
        "rejected_reasons": req.loc[req["status"] == "rejected", "reject_reason"]
        .value_counts()
        .to_dict(),
        "duration_s": duration,
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": per_s(completed),
        "output_throughput": per_s(out_tokens),
        "total_token_throughput": per_s(in_tokens + out_tokens),
    }
    for name in ("ttft_ms", "tpot_ms", "e2el_ms"):
        s.update(_stats(name, lat[name].to_numpy(float)))
    itl = records.itl
    s["mean_itl_ms"] = itl.total / itl.count * 1e3 if itl.count else float("nan")
    for label, q in PERCENTILES:
        s[f"{label}_itl_ms"] = itl.quantile(q / 100) * 1e3
    if slo_is_set(slo):
        good = int(meets_slo(lat, slo).sum())
        s["request_goodput"] = per_s(good)
        s["slo_attainment"] = (
            good / (completed + rejected) if completed + rejected else float("nan")
        )
    s["num_preemptions"] = int(req["num_preemptions"].sum())
    s.update(step_metrics(tl, records.meta))
    s.update(
        {
            k: records.meta[k]
            for k in ("num_gpu_blocks", "max_concurrent_tokens")
            if k in records.meta
        }
    )
    return s


def step_metrics(tl: pd.DataFrame, meta: dict) -> dict:
    """What the engine steps looked like: batch size, KV usage, and which roof bound them."""
    if not len(tl):
        return {"num_steps": 0}
    w = tl["step_time_s"].to_numpy()
    total = w.sum()
    d = {
        "num_steps": int(len(tl)),
        "mean_batch_size": float(np.average(tl["batch_size"], weights=w)),
        "mean_step_time_ms": float(w.mean() * 1e3),
    }
    if meta.get("num_gpu_blocks"):
        usage = tl["kv_blocks_used"].to_numpy() / meta["num_gpu_blocks"]
        d["mean_kv_usage"] = float(np.average(usage, weights=w))
        d["max_kv_usage"] = float(usage.max())
    for b in BOUNDS:
        d[f"{b}_bound_share"] = float(tl[f"{b}_s"].sum() / total) if total else 0.0
    return d
