"""Schemas and range checks of the diffusion fields of the ``workload`` group.

A workload has a ``kind``: ``llm`` (requests, the default), ``diffusion`` (a stream of image or
video generation jobs) or ``mixed`` (both: the LLM fields drive the requests and
``diffusion_rate`` a Poisson stream of jobs). A job's shape is the flat fields ``model``,
``height``, ``width``, ``frames``, ``steps``, ``images`` and ``guidance``, or one entry of
``mix`` (a ``JobShapeConfig``) drawn by weight; ``priority_classes`` split jobs into named
classes with a priority. ``height``, ``width``, ``frames`` and ``steps`` of 0 mean the
pipeline's default (the simulator fills them in per job). ``check_diffusion`` checks ranges
only: whether a pipeline can make a shape (divisibility by its patch and VAE factors) is
``sim.diffusion.shapes``' check.

``GUIDANCE_MODES`` mirrors ``sim.diffusion.job.GUIDANCE_MODES`` (``scenarios`` never imports
``sim``; a test keeps the two equal).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any

from scenarios.errors import WorkloadError
from scenarios.traces import MAX_TIME_S

KINDS = ("llm", "diffusion", "mixed")
GUIDANCE_MODES = ("cfg", "distilled", "none")
# the Alibaba GenTD26 trace's request types and final statuses
TRACE_TYPES = ("TXT_2_IMG", "IMG_2_IMG", "INPAINTING")
TRACE_STATUSES = ("SUCCEED", "FAILED", "PENDING", "PROCESSING")
# jobs held in memory at once: a typo fails here rather than as a huge allocation
MAX_JOBS = 100_000_000


@dataclass
class JobShapeConfig:
    """One entry of ``workload.mix``: a job shape and its weight. A field left out (``""`` for
    ``model``, null otherwise) takes the workload's flat value (``workload.height``, …)."""

    model: str = ""
    height: int | None = None  # 0: the pipeline's default
    width: int | None = None
    frames: int | None = None  # 1: an image; more: a video of that many frames; 0: default
    steps: int | None = None  # 0: the pipeline's default
    images: int | None = None  # images per prompt
    guidance: str | None = None  # "": the pipeline's default; else one of GUIDANCE_MODES
    weight: float = 1.0  # relative: the entries' weights need not sum to 1


@dataclass
class PriorityClassConfig:
    """A class of diffusion jobs: its name, relative weight and priority (lower is more
    urgent, as for LLM request classes); each job draws its class by weight."""

    name: str = "???"
    weight: float = 1.0
    priority: int = 0


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _check_int(name: str, x: Any, least: int) -> None:
    if not (_is_int(x) and x >= least):
        raise WorkloadError(name, x, f"must be an integer >= {least}")


def _check_weight(name: str, x: Any) -> None:
    if not (isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)
            and x > 0):
        raise WorkloadError(name, x, "must be a finite number > 0")


def _check_guidance(name: str, x: Any) -> None:
    if x != "" and x not in GUIDANCE_MODES:
        raise WorkloadError(name, x, f"'' (the pipeline's default) or one of "
                            f"{list(GUIDANCE_MODES)}")


def _check_model(name: str, x: Any) -> None:
    if not isinstance(x, str):
        raise WorkloadError(name, x, "a model name (a conf/model option), or '' for the run's")


def check_shape(shape: Any, prefix: str, partial: bool = False) -> None:
    """Range checks of one job shape (the workload's flat fields, or a ``mix`` entry with
    ``partial=True``, whose null fields are inherited and so not checked here). ``height``,
    ``width``, ``frames`` and ``steps`` of 0 mean the pipeline's default."""
    _check_model(f"{prefix}.model", shape.model)
    for name, least in (("height", 0), ("width", 0), ("frames", 0), ("steps", 0),
                        ("images", 1)):
        value = getattr(shape, name)
        if not (partial and value is None):
            _check_int(f"{prefix}.{name}", value, least)
    if not (partial and shape.guidance is None):
        _check_guidance(f"{prefix}.guidance", shape.guidance)


def _check_names(name: str, values: Any, known: tuple[str, ...]) -> None:
    for i, v in enumerate(values):
        if v not in known:
            raise WorkloadError(f"{name}[{i}]", v, f"one of {list(known)}")


def check_priority_classes(classes: Any) -> None:
    """Unique non-empty names, weights > 0, integer priorities."""
    names = set()
    for i, c in enumerate(classes):
        field = f"workload.priority_classes[{i}]"
        if not isinstance(c.name, str) or not c.name or c.name == "???":
            raise WorkloadError(f"{field}.name", c.name, "a non-empty class name")
        if c.name in names:
            raise WorkloadError(f"{field}.name", c.name, "class names must be unique")
        names.add(c.name)
        _check_weight(f"{field}.weight", c.weight)
        if not _is_int(c.priority):
            raise WorkloadError(f"{field}.priority", c.priority, "must be an integer")


def diffusion_job_count(w: Any) -> int:
    """Jobs of the diffusion stream of a synthetic arrival process: ``num_requests`` for
    ``kind=diffusion``; for ``kind=mixed`` ``diffusion_num_jobs``, or when that is null as many
    as arrive at ``diffusion_rate`` while the LLM stream's ``num_requests`` arrive at ``rate``
    (so both streams span about the same time)."""
    if w.kind != "mixed":
        return int(w.num_requests)
    if w.diffusion_num_jobs is not None:
        return int(w.diffusion_num_jobs)
    return max(1, math.ceil(w.num_requests * w.diffusion_rate / w.rate))


def check_diffusion(w: Any) -> None:
    """Range checks of the diffusion fields of a workload (dataclass or DictConfig); raise
    ``WorkloadError`` naming the field. Every field is checked whatever the kind, so a bad
    override never goes unnoticed; the defaults pass, so LLM workloads are unaffected."""
    if w.kind not in KINDS:
        raise WorkloadError("workload.kind", w.kind, f"one of {list(KINDS)}")
    check_shape(w, "workload")
    for i, entry in enumerate(w.mix):
        check_shape(entry, f"workload.mix[{i}]", partial=True)
        _check_weight(f"workload.mix[{i}].weight", entry.weight)
    check_priority_classes(w.priority_classes)
    _check_weight("workload.diffusion_rate", w.diffusion_rate)
    if w.diffusion_num_jobs is not None:
        _check_int("workload.diffusion_num_jobs", w.diffusion_num_jobs, 1)
        if w.diffusion_num_jobs > MAX_JOBS:
            raise WorkloadError("workload.diffusion_num_jobs", w.diffusion_num_jobs,
                                f"must be at most {MAX_JOBS:,}")
    _check_names("workload.trace_types", w.trace_types, TRACE_TYPES)
    _check_names("workload.trace_statuses", w.trace_statuses, TRACE_STATUSES)
    if w.kind == "mixed":
        _check_mixed(w)


def _check_mixed(w: Any) -> None:
    """In a mixed run ``model=`` is the LLM, so the jobs must name their pipeline; the job
    stream is Poisson and, without ``diffusion_num_jobs``, sized from the LLM's rate."""
    named = bool(w.model) or (len(w.mix) > 0 and all(e.model for e in w.mix))
    if not named:
        raise WorkloadError("workload.model", w.model, "a diffusion model name (e.g. flux1_dev) "
                            "with kind=mixed, where model= is the LLM (or a model in every "
                            "workload.mix entry)")
    if w.diffusion_num_jobs is None and w.arrival not in ("poisson", "gamma"):
        raise WorkloadError("workload.diffusion_num_jobs", None, "an integer >= 1 with "
                            f"kind=mixed and arrival={w.arrival} (null sizes the job stream "
                            "from the LLM's rate, which only poisson and gamma have)")
    n = diffusion_job_count(w)
    if n > MAX_JOBS:
        raise WorkloadError("workload.diffusion_rate", w.diffusion_rate,
                            f"gives {n:,} jobs; at most {MAX_JOBS:,} (set "
                            "workload.diffusion_num_jobs)")
    if n / w.diffusion_rate > MAX_TIME_S:
        raise WorkloadError("workload.diffusion_rate", w.diffusion_rate,
                            f"at least {n} jobs / {MAX_TIME_S:g} s = {n / MAX_TIME_S:g} (the "
                            "job arrivals would span longer)")


# entry schemas of the workload's lists, by the list they make up
ENTRY_LISTS = {JobShapeConfig: "workload.mix", PriorityClassConfig: "workload.priority_classes"}


def _entry_index(name: str, key: str, overrides: list[str]) -> int | None:
    """Index of the first entry holding ``key`` in the override that sets list ``name``."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    short = name.removeprefix("workload.")
    for text in overrides:
        if text.split("=", 1)[0].lstrip("+~") not in (name, short):
            continue
        try:
            value = OverridesParser.create().parse_overrides([text])[0].value()
        except Exception:  # noqa: BLE001 (not ours to report: Hydra does)
            return None
        for i, entry in enumerate(value if isinstance(value, list) else []):
            if isinstance(entry, dict) and key in entry:
                return i
    return None


def entry_key_error(error: BaseException, overrides: list[str]) -> str | None:
    """One line for a config-composition ``error`` that is an unknown key in an entry of
    ``workload.mix`` or ``workload.priority_classes`` (OmegaConf names the key alone),
    naming the entry (``workload.mix[0]``, found in ``overrides``) and the key; None for any
    other error."""
    cause = error
    while cause is not None and not hasattr(cause, "object_type"):
        cause = cause.__cause__
    schema = getattr(cause, "object_type", None)
    key = getattr(cause, "key", None)
    if schema not in ENTRY_LISTS or not isinstance(key, str) or "not in" not in str(cause):
        return None
    name = ENTRY_LISTS[schema]
    i = _entry_index(name, key, overrides)
    where = f"{name}[{i}]" if i is not None else f"an entry of {name}"
    known = [f.name for f in dataclasses.fields(schema)]
    return f"{where}: unknown key {key!r}; an entry has {', '.join(known)}"
