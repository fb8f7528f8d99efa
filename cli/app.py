"""The ``python -m sim`` Hydra app: config → scenario → simulate → analysis → files.

A thin shell: it registers the config schemas, validates everything before simulating,
and turns bad input into one line on stderr with exit code 2. In a sweep (``-m``) a job's
failure is written to its ``failed.json`` instead, and the other jobs go on.

Nothing is lost: every file is written atomically; the metrics (tables, then
``summary.json``) are written before any plot and ``summary.json`` again last, as the run's
completion marker; Ctrl-C or SIGTERM writes what was simulated so far (``"partial": true``)
and exits with code 130; a disk that fills is one line and exit code 1; ``resume=true`` skips
a run or sweep job whose complete outputs exist. Every run prints, first, whether it reached
a steady state or was overloaded (``analysis.steady.Load``); one in which nothing completed
exits with code 1 and the reasons.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import traceback
from pathlib import Path
from typing import NoReturn

import hydra
import pandas as pd
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

import conf.schema  # noqa: F401  (registers the config schemas)
from analysis.collect import FAILED_JSON, SUMMARY_JSON, write_sweep_summary
from analysis.diffusion_plots import write_diffusion_plots
from analysis.files import atomic_write, make_folder
from analysis.hourly import format_hourly
from analysis.plots import plot_day, write_plots
from analysis.report import (
    clear_run,
    format_job_summary,
    format_summary,
    run_is_complete,
    write_job_tables,
    write_summary,
    write_tables,
)
from cli.run_dir import release_run_dir
from cli.run_summary import nothing_completed, summarize_run, what_was_left
from cli.validation import check_job_models, validate_config
from scenarios import WorkloadError, requests_for_seed
from sim.builders import pool_memory_budgets
from sim.config.diffusion_cluster import cluster_kind
from sim.diffusion.run import simulate_diffusion, simulate_mixed
from sim.engine.run import simulate
from sim.errors import INTERRUPTED_EXIT_CODE, OUTPUT_ERROR_EXIT_CODE, ConfigError, OutputError
from sim.job_process import (
    DONE,
    FAILED,
    INTERRUPTED,
    JobKilled,
    how_it_ended,
    isolates_jobs,
    run_in_child,
)
from sim.kv.budget import GIB
from sim.kv.build import kv_blocks

log = logging.getLogger("sim")


def _progress_enabled(setting: str) -> bool:
    s = str(setting).lower()
    if s in ("true", "1", "yes", "on"):
        return True
    if s in ("false", "0", "no", "off"):
        return False
    if s != "auto":
        raise ConfigError("progress", setting, "one of auto, true, false")
    return sys.stderr.isatty() and not os.environ.get("CI")


def log_memory_budgets(cfg) -> None:
    """Log each pool's replica memory plan, from the function the replicas are sized by,
    with the KV capacity the replicas use: ``kv_cache.num_gpu_blocks`` when it overrides
    the memory-derived count (as ``sim.kv.build.build_kv_cache`` sizes the cache)."""
    override = cfg.kv_cache.num_gpu_blocks
    for pool, b in pool_memory_budgets(cfg).items():
        blocks = kv_blocks(cfg.kv_cache, b)
        source = ("" if override is None else
                  f" (kv_cache.num_gpu_blocks override; memory gives {b.num_gpu_blocks})")
        cl = cfg.cluster
        replicas = {"prefill": getattr(cl, "prefill_replicas", 1),
                    "decode": getattr(cl, "decode_replicas", 1)}.get(pool, cl.replicas)
        ep = b.tensor_parallel_size if cl.expert_parallel_size > 1 else 1
        log.info("%s on %d replica(s) of %d×%d %s (tp × pp, ep %d, %s pool): weights %.2f "
                 "GiB/GPU, KV cache %.2f GiB/GPU → num_gpu_blocks=%d%s (block_size %d), max "
                 "concurrent tokens %d", cfg.model.name, replicas, b.tensor_parallel_size,
                 b.pipeline_parallel_size, cfg.hardware.name, ep, pool, b.weight_bytes / GIB,
                 b.kv_cache_bytes / GIB,
                 blocks, source, b.block_size, blocks * b.block_size)
        max_len = cfg.scheduler.max_model_len or cfg.model.max_position_embeddings
        if blocks * b.block_size < max_len:
            # vLLM refuses to start here; the simulator runs and rejects what cannot fit
            log.warning("the %s pool's KV cache holds %d tokens, fewer than one request of "
                        "max_model_len=%d: vLLM would refuse to start (raise "
                        "kv_cache.gpu_memory_utilization or set scheduler.max_model_len); "
                        "longer requests are rejected with exceeds_kv_cache",
                        pool, blocks * b.block_size, max_len)


def diffusion_jobs(cfg) -> pd.DataFrame:
    """The run's diffusion job table (``scenarios.diffusion.build_jobs``): the workload's job
    stream, with ``model=`` as the default pipeline when it is one; every pipeline it names
    must be a diffusion model."""
    from scenarios.diffusion import build_jobs

    default = cfg.model.name if getattr(cfg.model, "kind", "llm") == "diffusion" else ""
    jobs = build_jobs(cfg.workload, default, cfg.seed)
    check_job_models(jobs)
    return jobs


def run(cfg: DictConfig, outdir: Path) -> dict:
    """One simulation end to end; returns the summary that was written to ``outdir``.
    ``cluster.kind`` says what runs: LLM replicas, a diffusion node pool, or both. The
    metrics (tables, then ``summary.json``) are written and printed before any plot; Ctrl-C
    or SIGTERM while plotting keeps them, and the summary returned (and written) then says
    ``pending_outputs: ["plots"]``."""
    validate_config(cfg)
    show_progress = _progress_enabled(cfg.progress)
    kind = cluster_kind(cfg.cluster)
    requests = jobs = records = job_records = None
    if kind != "diffusion":
        log_memory_budgets(cfg)
        requests = requests_for_seed(cfg.workload, cfg.seed)
    if kind != "llm":
        jobs = diffusion_jobs(cfg)
    clear_run(outdir)  # an earlier run's files never stay beside this one's
    total = sum(len(t) for t in (requests, jobs) if t is not None)
    with tqdm(total=total, unit="req" if jobs is None else "job", disable=not show_progress,
              mininterval=0.5, desc="simulating") as bar:
        if kind == "llm":
            # the timeline goes to its file as the run goes: memory bounded at any length
            records = simulate(cfg, requests, progress=bar,
                               keep_itl_samples=cfg.keep_itl_samples,
                               timeline_path=outdir / "timeline.parquet")
        elif kind == "diffusion":
            job_records = simulate_diffusion(cfg, jobs, progress=bar)
        else:
            records, job_records = simulate_mixed(cfg, requests, jobs, progress=bar,
                                                  keep_itl_samples=cfg.keep_itl_samples)
    summary = summarize_run(cfg, records, job_records)
    summary["config_sha256"] = config_digest(cfg)
    outputs = []
    if records is not None:
        outputs += write_tables(records, outdir)
    if job_records is not None:
        outputs += write_job_tables(job_records, outdir)
    pending = ["plots"] if cfg.plots else []
    write_summary(summary, outdir, outputs, pending)  # the metrics, before any plot
    if nothing_completed(summary) is None:
        if records is not None:
            print(format_summary(summary))
        if "hourly" in summary:
            print(format_hourly(summary["hourly"]))
        if job_records is not None:
            print(format_job_summary(summary))
    if pending:
        try:
            if records is not None:
                outputs += write_plots(records, outdir)
            if "hourly" in summary:  # traffic that varied over the day
                plot_day(summary["hourly"], outdir / "day.png")
                outputs.append(outdir / "day.png")
            if job_records is not None:
                outputs += write_diffusion_plots(job_records, outdir)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the summary says what is missing
            return {**summary, "pending_outputs": pending}
        write_summary(summary, outdir, outputs)  # last: it marks the outputs complete
    print(f"outputs: {outdir}")
    return {**summary, "pending_outputs": []}


RESUME_IGNORES = ("resume", "progress", "check_invariants")  # leave the outputs as they are


def config_digest(cfg: DictConfig) -> str:
    """SHA-256 of the resolved config, less ``RESUME_IGNORES``: which config a run folder's
    outputs came from, so that ``resume`` never takes another config's outputs for its own
    (a sweep's job N is another combination when the sweep's values change)."""
    doc = OmegaConf.to_container(cfg, resolve=True)
    for key in RESUME_IGNORES:
        doc.pop(key, None)
    text = json.dumps(doc, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def completed_summary(cfg: DictConfig, outdir: Path) -> dict | None:
    """The summary of ``outdir`` when it holds complete outputs of this very config
    (``analysis.report.run_is_complete`` and the same ``config_digest``), else None."""
    if not run_is_complete(outdir):
        return None
    summary = json.loads((Path(outdir) / SUMMARY_JSON).read_text())
    return summary if summary.get("config_sha256") == config_digest(cfg) else None


def interrupted(summary: dict, outdir: Path, sweep_dir: Path | None = None) -> NoReturn:
    """After Ctrl-C or SIGTERM: one line on stderr saying what was written (what was
    simulated, or the finished simulation's metrics without its plots), the sweep's table
    when in a sweep, and exit code 130 (the shell's code for SIGINT)."""
    where = f"{outdir}/{SUMMARY_JSON}"
    hint = ""
    if sweep_dir is not None:
        try:
            write_sweep_summary(sweep_dir)
        except (ConfigError, OSError):
            pass  # no job folder there (the nodes share no file system), or a full disk
        hint = f"; to finish the sweep, rerun it with resume=true hydra.sweep.dir={sweep_dir}"
    if summary.get("partial", True):
        print(f"interrupted at {summary['interrupted_at_sim_s']:.3f} simulated s: partial "
              f"results ({summary['completed']} completed, {summary['rejected']} rejected, "
              f"{summary['unfinished']} unfinished) in {where}{hint}", file=sys.stderr)
    else:
        print(f"interrupted while drawing the plots: the finished simulation's metrics are "
              f"in {where} (pending_outputs: {', '.join(summary['pending_outputs'])}){hint}",
              file=sys.stderr)
    sys.exit(INTERRUPTED_EXIT_CODE)


INPUT_ERRORS = (ConfigError, WorkloadError)  # bad input: one line, exit code 2
NO_TRACEBACK = (*INPUT_ERRORS, JobKilled, OutputError)  # their one line says it all


def failure_record(error: BaseException, overrides: list[str]) -> dict:
    """A failed sweep job's ``failed.json``: error type, one-line message, the job's
    overrides, and the traceback when the error is not plain bad input."""
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    record = {"error_type": type(error).__name__,
              "message": "; ".join(lines) or type(error).__name__,
              "overrides": list(overrides)}
    if not isinstance(error, NO_TRACEBACK):
        record["traceback"] = "".join(traceback.format_exception(error))
    return record


def write_failure(outdir: Path, error: BaseException, overrides: list[str]) -> dict:
    """Record a failed sweep job in ``outdir/failed.json`` (``failure_record``); returns it."""
    record = failure_record(error, overrides)
    make_folder(outdir)
    text = json.dumps(record, indent=2) + "\n"
    atomic_write(outdir / FAILED_JSON, lambda p: Path(p).write_text(text))
    return record


def job_failed(outdir: Path, job: str, overrides: list[str], error: BaseException) -> None:
    """A sweep job failed: ``failed.json`` (when it can be written), the log, and one line on
    stderr; returns None, the missing summary."""
    try:
        record, where = write_failure(outdir, error, overrides), outdir / FAILED_JSON
    except OSError as e:  # a full disk: the line is all that is left
        record, where = failure_record(error, overrides), f"not recorded: {e}"
    if not isinstance(error, NO_TRACEBACK):
        log.error("job %s failed", job, exc_info=error)
    print(f"error: job {job} ({' '.join(overrides)}) failed: {record['error_type']}: "
          f"{record['message']} [{where}]", file=sys.stderr)
    return None


def run_sweep_job(cfg: DictConfig, outdir: Path, job: str, overrides: list[str]) -> dict | None:
    """One job of a multirun. A failure of any kind is written to ``failed.json``, logged and
    reported on one line, and the job returns normally, so the launcher (basic, joblib, Ray,
    submitit) goes on with the other jobs; ``None`` then stands for the missing summary."""
    try:
        summary = run(cfg, outdir)
    except Exception as e:  # any failure: isolating one job from the others is the point
        return job_failed(outdir, job, overrides, e)
    (outdir / FAILED_JSON).unlink(missing_ok=True)  # from an earlier run into the same folder
    why = nothing_completed(summary)
    if why:
        print(f"warning: job {job} ({' '.join(overrides)}): {why}", file=sys.stderr)
    return summary


def run_job_in_child(cfg: DictConfig, outdir: Path, job: str,
                     overrides: list[str]) -> dict | None:
    """``run_sweep_job`` in a child process of this worker (``sim.job_process``): a child
    killed before it recorded how its job ended fails that job alone (``failed.json``,
    ``JobKilled``) and the worker, with the rest of the sweep, goes on."""
    def body() -> int:
        return DONE if run_sweep_job(cfg, outdir, job, overrides) is not None else FAILED

    code = run_in_child(body)
    if code == DONE:
        return json.loads((outdir / SUMMARY_JSON).read_text())
    if code == FAILED:
        return None
    if code == INTERRUPTED:
        raise KeyboardInterrupt
    return job_failed(outdir, job, overrides, JobKilled(
        f"the job's process was {how_it_ended(code)} before it finished (the out-of-memory "
        "killer, a crash or a kill); the other jobs went on"))


def single_run(cfg: DictConfig, outdir: Path) -> None:
    """One run outside a sweep, ended with README's exit codes: 2 on bad input, 1 when an
    output could not be written or nothing completed (the reasons on one line), 130 after
    Ctrl-C or SIGTERM."""
    try:
        summary = run(cfg, outdir)
    except INPUT_ERRORS as e:
        release_run_dir(outdir, HydraConfig.get().output_subdir)
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except OutputError as e:
        print(f"error: {e}; {what_was_left(outdir)}", file=sys.stderr)
        sys.exit(OUTPUT_ERROR_EXIT_CODE)
    if summary["partial"] or summary["pending_outputs"]:
        interrupted(summary, outdir)
    why = nothing_completed(summary)
    if why:
        print(f"error: {why}; the summary is in {outdir}/{SUMMARY_JSON}", file=sys.stderr)
        sys.exit(1)




@hydra.main(version_base=None, config_path="pkg://conf", config_name="config")
def main(cfg: DictConfig) -> None:
    """Hydra entry point of one simulation (also runs each job of a ``-m`` sweep)."""
    hc = HydraConfig.get()
    outdir = Path(hc.runtime.output_dir)
    sweep = hc.mode == RunMode.MULTIRUN
    if cfg.resume and completed_summary(cfg, outdir) is not None:
        log.info("%s: complete outputs exist, skipped",
                 f"job {hc.job.num}" if sweep else f"run in {outdir}")
        return
    if not sweep:
        single_run(cfg, outdir)
        return
    job_run = run_job_in_child if isolates_jobs(hc) else run_sweep_job
    summary = job_run(cfg, outdir, str(hc.job.num), list(hc.overrides.task))
    if summary is not None and (summary["partial"] or summary.get("pending_outputs")):
        interrupted(summary, outdir, Path(hc.sweep.dir))
