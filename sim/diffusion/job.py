"""What a diffusion job is, and what the serving side needs to know of its cost.

The seam between the diffusion cost model (``sim.diffusion.cost``: operators of the text
encoders, the DiT and the VAE, split over GPUs by a parallel plan) and the node pool that
queues and runs jobs (``sim.diffusion.pool``). The pool sees only ``DiffusionCost``.

Job streams come from ``scenarios`` as a DataFrame with the columns ``JOB_COLUMNS``, one row
per job (a prompt's request: ``images`` images or one video of ``frames`` frames).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

# scenarios -> sim: one row per job; guidance "" means the pipeline's default
JOB_COLUMNS = ("arrival_time_s", "model", "height", "width", "frames", "steps", "images",
               "guidance", "priority")
GUIDANCE_MODES = ("cfg", "distilled", "none")  # cfg: 2 DiT passes per step; else 1


@dataclass(frozen=True)
class ParallelPlan:
    """How one job's work is split over its GPUs (xDiT's vocabulary).

    ``ulysses`` and ``ring`` split the latent sequence (all-to-all of heads / ring passes of
    K and V), ``cfg`` runs the two guidance passes on two GPU groups, ``pipefusion`` splits
    the DiT layers into a patch pipeline, ``data`` runs independent images on separate GPU
    groups, ``tensor`` splits every weight. Their product is the job's GPU count.
    """

    ulysses: int = 1
    ring: int = 1
    cfg: int = 1
    pipefusion: int = 1
    data: int = 1
    tensor: int = 1

    @property
    def gpus(self) -> int:
        """GPUs the plan occupies: the product of its degrees."""
        return self.ulysses * self.ring * self.cfg * self.pipefusion * self.data * self.tensor

    def label(self) -> str:
        """Short name, e.g. ``ulysses4xcfg2`` (``single`` for one GPU)."""
        parts = [f"{k}{v}" for k, v in vars(self).items() if v > 1]
        return "x".join(parts) or "single"


@dataclass(frozen=True)
class JobShape:
    """The work of one job: pipeline, output size, denoising steps, images per prompt."""

    model: str
    height: int
    width: int
    frames: int = 1  # 1 for an image
    steps: int = 0  # 0: the pipeline's default
    images: int = 1  # images per prompt, denoised as one batch
    guidance: str = ""  # "" = the pipeline's default; else one of GUIDANCE_MODES


@dataclass(frozen=True)
class JobTiming:
    """Predicted time of one job on ``plan.gpus`` GPUs, by stage.

    A job is ``encode_s`` (text encoders), then ``steps`` denoising steps of ``step_s`` each
    (every guidance pass of every image included), then ``decode_s`` (VAE). A job may be paused
    between steps (preemption) and resumed; ``steps`` is the count it needs in total.
    """

    plan: ParallelPlan
    steps: int
    encode_s: float
    step_s: float
    decode_s: float

    @property
    def total_s(self) -> float:
        """Service time of the whole job, run without a pause."""
        return self.encode_s + self.steps * self.step_s + self.decode_s


class DiffusionCost(Protocol):
    """What the node pool needs from a diffusion cost model."""

    def timing(self, shape: JobShape, plan: ParallelPlan) -> JobTiming:
        """Time of ``shape`` under ``plan``; raises ``sim.errors.ConfigError`` naming the
        field for a plan that cannot run it (degrees that do not divide the heads or the
        sequence, CFG parallel without CFG, …)."""
        ...

    def best(self, shape: JobShape, gpus: int) -> JobTiming:
        """The fastest valid plan on exactly ``gpus`` GPUs (``plan=auto``) and its timing."""
        ...
