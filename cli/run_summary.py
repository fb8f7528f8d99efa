"""What one run's ``summary.json`` holds, and what it says about how the run ended.

``summarize_run`` gathers every field of an LLM, diffusion or mixed run: the metrics of
``analysis``, what was run, whether it is partial, and its load verdict
(``analysis.steady.Load``). ``nothing_completed`` and ``what_was_left`` put a run that
ended badly into words for the command's one line.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from omegaconf import DictConfig

from analysis.autoscaling import hourly_replicas
from analysis.diffusion_metrics import summarize_jobs
from analysis.hourly import hourly_job_metrics, hourly_metrics
from analysis.metrics import summarize
from analysis.report import SUMMARY_JSON, reasons_text
from analysis.steady import job_load, request_load
from scenarios.rate_profile import RateProfile, has_profile


def summarize_run(cfg: DictConfig, records, job_records) -> dict:
    """Every ``summary.json`` field of a run (LLM ``records``, diffusion ``job_records``, or
    both): the metrics, what was run, whether it is partial and its load verdict (``jobs_``
    names for the diffusion side; a diffusion-only run also has them unprefixed)."""
    first = records or job_records
    meta = first.meta
    until = meta["sim_time_s"] if first.partial else math.inf
    info = {"model": cfg.model.name, "hardware": cfg.hardware.name, "backend": cfg.backend.name,
            "scheduler": cfg.scheduler.name, "workload": cfg.workload.name, "seed": cfg.seed,
            "sim_time_s": meta["sim_time_s"]}
    if job_records is not None:
        info["cluster"] = cfg.cluster.name
    summary = {}
    if records is not None:
        summary.update(summarize(records, cfg.slo, cfg.metrics.percentiles))
        summary.update(info)
        summary.update(run_state(records))
        load = request_load(records.requests, summary["request_throughput"], until)
        summary.update(load.fields())
        if has_profile(cfg.workload):  # traffic that varies: each hour on its own
            summary["hourly"] = _hourly(cfg, records.meta, records.requests,
                                        lambda h, n, span: hourly_metrics(
                                            records.requests, h, n, cfg.slo, span))
    if job_records is not None:
        summary.update(summarize_jobs(job_records, cfg.metrics.percentiles))
        load = job_load(job_records.jobs, summary["jobs_per_hour"] / 3600.0, until)
        summary.update(load.fields("jobs_"))
        if records is None:
            summary.update(info)
            summary.update(job_run_state(summary, job_records))
            summary.update(load.fields())
            if has_profile(cfg.workload):  # (a mixed run's profile shapes its requests)
                summary["hourly"] = _hourly(cfg, job_records.meta, job_records.jobs,
                                            lambda h, n, span: hourly_job_metrics(
                                                job_records.jobs, h, n, span))
    return summary


def _hourly(cfg: DictConfig, meta: dict, work, metrics) -> list[dict]:
    """``summary.json``'s ``hourly``: ``metrics(hour_s, hours, span_s)`` of the requests or
    jobs ``work`` over the rate profile's hours and those the run went on after its span
    (draining), with the replicas (or nodes) of each hour when autoscaled."""
    p = cfg.workload.rate_profile
    span = RateProfile.from_config(p, float(cfg.workload.rate)).end
    hours = math.ceil(max(span, meta["sim_time_s"]) / float(p.hour_s))
    rows = metrics(float(p.hour_s), hours, span)
    if "autoscaler" in meta:
        for row, more in zip(rows, hourly_replicas(meta, work, float(p.hour_s), hours),
                             strict=True):
            row.update(more)
    return rows


def nothing_completed(summary: dict) -> str | None:
    """When no request (nor job) of a run completed, why, in words: "no request completed:
    20 rejected (exceeds_max_model_len: 20), 0 failed"; None when something did."""
    sides = []
    if "request_throughput" in summary:
        sides.append(("request", summary["completed"], summary["rejected"],
                      summary.get("rejected_reasons"), summary.get("failed", 0),
                      summary.get("failed_reasons")))
    if "jobs_completed" in summary:
        sides.append(("job", summary["jobs_completed"], summary["jobs_rejected"],
                      summary.get("jobs_rejected_reasons"), summary["jobs_failed"],
                      summary.get("jobs_failed_reasons")))
    if not sides or any(completed for _, completed, *_ in sides):
        return None
    return "; ".join(f"no {what} completed: {reasons_text(rejected, 'rejected', why_r)}, "
                     f"{reasons_text(failed, 'failed', why_f)}"
                     for what, _, rejected, why_r, failed, why_f in sides)


def what_was_left(outdir: Path) -> str:
    """After an output could not be written: what ``outdir`` holds of the run, in words."""
    try:
        doc = json.loads((Path(outdir) / SUMMARY_JSON).read_text())
    except (OSError, ValueError):
        return f"{outdir} holds no summary.json: no results of this run were kept"
    pending = doc.get("pending_outputs") if isinstance(doc, dict) else None
    if pending:
        return (f"the metrics are complete in {outdir}/{SUMMARY_JSON}, the "
                f"{', '.join(pending)} are not")
    return f"{outdir}/{SUMMARY_JSON} is complete"


def job_run_state(summary: dict, records) -> dict:
    """A diffusion-only run's ``completed``, ``rejected``, ``failed`` and ``unfinished`` (its
    jobs), ``partial`` and, if partial, when it stopped: the keys an LLM run reports."""
    state = {"completed": summary["jobs_completed"], "rejected": summary["jobs_rejected"],
             "failed": summary["jobs_failed"], "unfinished": summary["jobs_unfinished"],
             "partial": records.partial}
    if records.partial:
        state["interrupted_at_sim_s"] = records.meta["interrupted_at_sim_s"]
    return state


NOT_ENDED = ("pending", "waiting", "running", "transferring")  # statuses of live requests


def run_state(records) -> dict:
    """Whether the run is ``partial`` (stopped by Ctrl-C), how many requests had not ended
    (``unfinished``: still in one of ``NOT_ENDED``) and, if partial, when it stopped."""
    state = {"partial": records.partial,
             "unfinished": int(records.requests["status"].isin(NOT_ENDED).sum())}
    if records.partial:
        state["interrupted_at_sim_s"] = records.meta["interrupted_at_sim_s"]
    return state
