"""Turn a workload config into the table of diffusion jobs the node pool serves.

Contract of ``build_jobs(workload, default_model, seed) -> pandas.DataFrame``:

- ``workload`` is a ``WorkloadConfig`` or a ``DictConfig`` of the same shape, checked with
  ``check_workload`` first (one ``WorkloadError`` naming the field for any bad value or trace).
  ``default_model`` is the run's ``model=`` name, used where the workload names no model.
- One row per job (a prompt: ``images`` images, or one video of ``frames`` frames), with the
  columns ``JOB_COLUMNS`` of ``sim.diffusion.job`` in that order: ``arrival_time_s`` (float64,
  seconds from the start), ``model`` (str), ``height``, ``width``, ``frames``, ``steps`` (0: the
  pipeline's default), ``images`` (int64), ``guidance`` (str, "": the pipeline's default) and
  ``priority`` (int64, lower is more urgent; 0 without classes); plus ``class`` (str) when
  ``workload.priority_classes`` is set, and ``client``/``think_time_s`` with closed-loop
  arrivals (the LLM table's meaning: a follow-up row has arrival NaN, set by the simulator to
  the completion of the client's previous job plus its think time).
- ``kind=llm`` has no jobs: an empty table. ``kind=diffusion``: ``arrival`` is one of the LLM
  processes with ``rate`` in jobs/s and ``num_requests`` jobs (poisson and gamma: or over the
  span of ``workload.rate_profile``, as LLM requests), or ``trace`` replay of a
  diffusion job trace (``read_job_trace``; the Alibaba layout), whose rows give the arrival,
  the images per prompt and the steps (a shape's ``steps`` > 0 replaces the trace's), chosen
  by ``trace_types``/``trace_statuses``, windowed by ``window_start_s``/``window_end_s``,
  shifted to start at 0 and scaled by ``time_scale`` as LLM traces are. ``kind=mixed``: a
  Poisson stream at ``diffusion_rate`` of ``diffusion_job_count(workload)`` jobs (the LLM
  fields drive ``scenarios.build_requests``, which reads none of the diffusion fields).
- Shapes: every job has the flat shape (``workload.height`` …), or, with ``workload.mix``, each
  job independently draws an entry by weight; an entry's null fields take the flat values.
- Randomness: streams are children of ``SeedSequence(seed)`` under spawn key ``JOB_STREAM``
  (``(7, 0)`` arrivals, ``(7, 1)`` shapes, ``(7, 2)`` classes), apart from the LLM requests'
  ``(0,)`` and ``(1,)``, so a mixed run's two streams are independent, adding a mix leaves the
  arrivals as they were, and the same seed gives an identical table. Rows are sorted by
  arrival (stably; a closed loop's NaN follow-ups stay in order at the end).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from scenarios.arrivals import closed_loop, poisson_arrivals
from scenarios.config import check_workload
from scenarios.diffusion_config import diffusion_job_count
from scenarios.errors import WorkloadError
from scenarios.traces import MAX_TIME_S, read_job_trace, window_trace
from scenarios.workload import open_loop_arrivals

# mirrors sim.diffusion.job.JOB_COLUMNS (scenarios never imports sim; a test keeps them equal)
JOB_COLUMNS = ("arrival_time_s", "model", "height", "width", "frames", "steps", "images",
               "guidance", "priority")
SHAPE_FIELDS = ("model", "height", "width", "frames", "steps", "images", "guidance")
INT_FIELDS = ("height", "width", "frames", "steps", "images")
JOB_STREAM = 7  # spawn key of the job streams under the run's SeedSequence
ARRIVALS, SHAPES, CLASSES = 0, 1, 2


def job_rng(seed: int, stream: int) -> np.random.Generator:
    """The generator of one job stream (``ARRIVALS``, ``SHAPES`` or ``CLASSES``) of a run."""
    return np.random.default_rng(np.random.SeedSequence(int(seed),
                                                        spawn_key=(JOB_STREAM, stream)))


def _trace_jobs(w: Any) -> pd.DataFrame:
    path = str(w.trace_path)
    trace = window_trace(
        read_job_trace(path, list(w.trace_types), list(w.trace_statuses)),
        float(w.window_start_s),
        None if w.window_end_s is None else float(w.window_end_s),
        float(w.time_scale),
        w.max_requests,
        path,
    )
    last = float(trace["arrival_time_s"].iloc[-1])
    if last > MAX_TIME_S:
        raise WorkloadError("workload.time_scale", w.time_scale,
                            f"the scaled trace would last {last:g} s; at most {MAX_TIME_S:g} s")
    return trace


def _arrivals(w: Any, rng: np.random.Generator) -> pd.DataFrame:
    """Arrival times (and closed-loop client columns) of the workload's jobs."""
    if w.kind == "mixed":
        n = diffusion_job_count(w)
        return pd.DataFrame({"arrival_time_s": poisson_arrivals(float(w.diffusion_rate), n,
                                                                rng)})
    if w.arrival == "trace":
        return _trace_jobs(w)
    if w.arrival == "closed_loop":
        n = int(w.num_requests)
        arrival, client, think = closed_loop(n, int(w.concurrency), float(w.think_time_s),
                                             str(w.think_time_dist), rng, float(w.ramp_up_s))
        return pd.DataFrame({"arrival_time_s": arrival, "client": client,
                             "think_time_s": think})
    # poisson or gamma: num_requests jobs, or as many as the rate profile's span brings
    return pd.DataFrame({"arrival_time_s": open_loop_arrivals(w, rng)})


def _shapes(w: Any, default_model: str, n: int, rng: np.random.Generator) -> dict[str, Any]:
    """Each job's shape fields: the flat shape, or per job a ``mix`` entry drawn by weight."""
    flat = {name: getattr(w, name) for name in SHAPE_FIELDS}
    flat["model"] = flat["model"] or default_model
    if not len(w.mix):
        return {name: np.full(n, value, dtype=object if name in ("model", "guidance") else
                              np.int64) for name, value in flat.items()}
    weights = np.array([float(e.weight) for e in w.mix])
    pick = rng.choice(len(weights), size=n, p=weights / weights.sum())
    out = {}
    for name in SHAPE_FIELDS:
        values = [getattr(e, name) for e in w.mix]
        values = [flat[name] if v is None or (name == "model" and v == "") else v
                  for v in values]
        column = np.array(values, dtype=np.int64 if name in INT_FIELDS else object)
        out[name] = column[pick]
    return out


def _classes(w: Any, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    classes = w.priority_classes
    if not len(classes):
        return {"priority": np.zeros(n, dtype=np.int64)}
    weights = np.array([float(c.weight) for c in classes])
    pick = rng.choice(len(weights), size=n, p=weights / weights.sum())
    return {"priority": np.array([int(c.priority) for c in classes], dtype=np.int64)[pick],
            "class": np.array([str(c.name) for c in classes], dtype=object)[pick]}


def empty_jobs() -> pd.DataFrame:
    """A job table with no rows (the job stream of an LLM workload)."""
    dtypes = {"arrival_time_s": "float64", "model": str, "guidance": str,
              "priority": "int64", **dict.fromkeys(INT_FIELDS, "int64")}
    return pd.DataFrame({c: pd.Series(dtype=dtypes[c]) for c in JOB_COLUMNS})


def build_jobs(workload: Any, default_model: str, seed: int) -> pd.DataFrame:
    """Build the diffusion job table of one run (contract: module docstring)."""
    check_workload(workload)
    if workload.kind == "llm":
        return empty_jobs()
    rows = _arrivals(workload, job_rng(seed, ARRIVALS))
    n = len(rows)
    shapes = _shapes(workload, str(default_model), n, job_rng(seed, SHAPES))
    if workload.kind == "diffusion" and workload.arrival == "trace":
        shapes["steps"] = np.where(shapes["steps"] > 0, shapes["steps"],
                                   rows["steps"].to_numpy())
        shapes["images"] = rows["images"].to_numpy()
    extra = [c for c in ("client", "think_time_s") if c in rows]
    table = {"arrival_time_s": rows["arrival_time_s"].to_numpy(dtype=float), **shapes,
             **_classes(workload, n, job_rng(seed, CLASSES)),
             **{c: rows[c].to_numpy() for c in extra}}
    columns = [*JOB_COLUMNS, *(["class"] if "class" in table else []), *extra]
    out = pd.DataFrame(table)[columns]
    return out.sort_values("arrival_time_s", kind="stable").reset_index(drop=True)


def check_job_files(workload: Any) -> None:
    """Read the diffusion trace the workload names, as ``build_jobs`` will, and raise its first
    problem (columns, values, order, rows left by the filters and the window) as one
    ``WorkloadError``; nothing to read for other workloads. Call after ``check_workload``."""
    if workload.kind == "diffusion" and workload.arrival == "trace":
        _trace_jobs(workload)
