"""Job shapes against their pipelines, whatever ``cluster.job_cost``: which pipeline each
job names, its size defaults, and whether the pipeline (and a fixed parallel plan) can
make it.

A workload's ``height``, ``width`` and ``frames`` (flat, or a ``mix`` entry's) of 0 mean the
pipeline's default, as ``steps`` 0 does: ``resolve_sizes`` fills them in per job before the
pool runs, so ``jobs.parquet`` holds the real shape. ``check_workload_shapes`` checks, before
anything runs, every shape a workload can draw with the roofline pipeline's own checks
(``sim.diffusion.pipeline.resolve``: sizes the VAE and patching divide, frames of an image
model, …; ``sim.diffusion.plans.check_plan`` for a fixed ``cluster.parallel``), naming the
workload field that holds the bad value (``workload.mix[i].height`` when the entry sets it).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf

from sim.config.diffusion_model import DiffusionPipelineConfig
from sim.diffusion.job import JobShape, ParallelPlan
from sim.diffusion.pipeline import load_pipeline, resolve, with_defaults
from sim.diffusion.plans import check_plan
from sim.errors import ConfigError

log = logging.getLogger("sim")
SIZE_FIELDS = ("height", "width", "frames")  # 0: the pipeline's default
SHAPE_FIELDS = ("model", "height", "width", "frames", "steps", "images", "guidance")


class Pipelines:
    """Pipelines by name: the run's own ``model=`` (with its ``model.*`` overrides, as the
    cost model prices it), else ``conf/model/<name>.yaml`` (``load_pipeline``), cached."""

    def __init__(self, own_name: str = "", own: DiffusionPipelineConfig | None = None) -> None:
        self._pipes = {own_name: own} if own_name and own is not None else {}

    @classmethod
    def of_run(cls, cfg) -> Pipelines:
        """The pipelines of a run config (its ``model`` when that is a diffusion pipeline)."""
        m = getattr(cfg, "model", None)
        own = getattr(m, "diffusion", None) if m is not None else None
        if isinstance(own, DictConfig):
            own = OmegaConf.to_object(own)
        return cls(str(getattr(m, "name", "")) if m is not None else "", own)

    def __call__(self, name: str) -> DiffusionPipelineConfig:
        """The pipeline called ``name`` (``ConfigError`` naming ``model`` if none is)."""
        if name not in self._pipes:
            self._pipes[name] = load_pipeline(name)
        return self._pipes[name]


def resolve_sizes(jobs: pd.DataFrame, pipelines: Pipelines) -> pd.DataFrame:
    """``jobs`` with each 0 ``height``, ``width`` and ``frames`` replaced by its pipeline's
    default (the table itself when it has none)."""
    zero = np.zeros(len(jobs), bool)
    for f in SIZE_FIELDS:
        zero |= jobs[f].to_numpy() == 0
    if not zero.any():
        return jobs
    out = jobs.copy()
    models = out["model"].astype(str)
    for name in models[zero].unique():
        pipe = pipelines(name)
        rows = (models == name).to_numpy()
        for f in SIZE_FIELDS:
            hit = rows & (out[f].to_numpy() == 0)
            out.loc[hit, f] = int(getattr(pipe, f))
    return out


@dataclass(frozen=True)
class Entry:
    """One shape a workload draws (its flat shape, or a ``mix`` entry over it), with the
    workload field each value comes from."""

    shape: JobShape
    fields: dict[str, str]  # shape field -> the workload field that sets it


def workload_entries(w, default_model: str) -> Iterator[Entry]:
    """Every shape ``w`` can draw: the flat one, or each ``mix`` entry (its null fields, and
    an empty model, from the flat ones; an empty flat model is ``default_model``)."""
    flat = {f: getattr(w, f) for f in SHAPE_FIELDS}
    names = {f: f"workload.{f}" for f in SHAPE_FIELDS}
    if not flat["model"]:
        flat["model"], names["model"] = default_model, "model"
    mix = list(getattr(w, "mix", []) or [])
    sources = [(flat, names)] if not mix else []
    for i, e in enumerate(mix):
        values, where = dict(flat), dict(names)
        for f in SHAPE_FIELDS:
            v = getattr(e, f)
            if v is not None and not (f == "model" and v == ""):
                values[f], where[f] = v, f"workload.mix[{i}].{f}"
        sources.append((values, where))
    for values, where in sources:
        v = values
        yield Entry(JobShape(str(v["model"]), int(v["height"]), int(v["width"]),
                             int(v["frames"]), int(v["steps"]), int(v["images"]),
                             str(v["guidance"])), where)


def check_workload_shapes(w, default_model: str, pipelines: Pipelines,
                          plan: ParallelPlan | None = None) -> None:
    """Every shape of ``w`` names a diffusion pipeline that can make it (on ``plan`` when
    fixed), else one ``ConfigError`` naming the workload field; a video pipeline asked for
    ``frames=1`` makes images: allowed, with a warning."""
    for entry in workload_entries(w, default_model):
        s, where = entry.shape, entry.fields
        try:
            pipe = pipelines(s.model)
        except ConfigError as e:
            field = where["model"] if e.field == "model" else e.field
            raise ConfigError(field, e.value, e.expected) from None
        try:
            job = resolve(with_defaults(s, pipe), pipe)
            if plan is not None:
                check_plan(plan, job)
        except ConfigError as e:
            field = e.field
            if field.startswith("job."):
                field = where.get(field[4:], f"workload.{field[4:]}")
            raise ConfigError(field, e.value, e.expected) from None
        if s.frames == 1 and pipe.frames > 1:
            log.warning("%s=1: %s is a video pipeline (%d frames by default); these jobs make "
                        "single images", where["frames"], s.model, pipe.frames)
