"""``DiffusionCostModel``: a job's time on a parallel plan from the pipeline's operators on the
roofline (the ``DiffusionCost`` the node pool uses, and what ``python -m sim.explain`` reads).

A job is three stages (``JobTiming``): ``encode`` (the text encoders on one GPU, batch 2
under classifier-free guidance for the negative prompt), ``steps`` × ``step`` (one DiT
forward of every guidance pass of every image of this GPU group, split by the plan, plus
the plan's communication) and ``decode`` (the VAE on the job's GPUs). A stage's time is the
sum of its operators' times on the busiest GPU: nothing overlaps except what the operators
say (ring and PipeFusion sends hide behind compute).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from sim.config.diffusion_model import DiffusionPipelineConfig, check_diffusion_pipeline
from sim.cost.attention_kernels import check_arch
from sim.cost.base import OperatorCost
from sim.cost.eager import eager_launch_s
from sim.cost.pricing import Pricer
from sim.diffusion.dit import dit_step_ops
from sim.diffusion.encoders import encode_ops
from sim.diffusion.execution import execution_of
from sim.diffusion.job import JobShape, JobTiming, ParallelPlan
from sim.diffusion.memory import PlanMemory, check_fits, offload_seconds, plan_memory
from sim.diffusion.pipeline import Job, load_pipeline, resolve
from sim.diffusion.plans import (
    TIE_REL,
    check_plan,
    dit_split,
    plan_comm_ops,
    simpler_first,
    valid_plans,
)
from sim.diffusion.vae import decode_ops, output_bytes, runs_mask_loop, split_factor
from sim.errors import ConfigError

STAGES = ("encode", "step", "decode")


class DiffusionCostModel:
    """Prices jobs of the pipelines under ``conf/model/`` on one GPU type.

    ``pipelines`` maps a model name to its pipeline where the run has it already (the run's
    own ``model=``, with any ``model.*`` overrides); other names are read with
    ``load_pipeline`` when a job first asks for them. Timings are cached per (shape, plan)
    and the best plan per (shape, GPUs): the pool asks for every job.
    """

    def __init__(self, pricer: Pricer,
                 pipelines: dict[str, DiffusionPipelineConfig] | None = None,
                 loader: Callable[[str], DiffusionPipelineConfig] = load_pipeline,
                 link_bw: float | None = None) -> None:
        self.pricer = pricer
        hw = pricer.hw
        self.capacity = float(getattr(hw, "cuda_total_bytes", 0.0) or hw.hbm_bytes)
        self.link_bw = float(link_bw or pricer.hw.nvlink_bandwidth)
        self._pipes = dict(pipelines or {})
        self._loader = loader
        self._timing: dict[tuple[JobShape, ParallelPlan], JobTiming] = {}
        self._best: dict[tuple[JobShape, int], JobTiming] = {}

    @classmethod
    def from_config(cls, cfg) -> DiffusionCostModel:
        """For ``cfg.hardware`` with the calibration of ``cfg.backend`` (as the LLM roofline
        picks it), knowing the run's own ``cfg.model`` when it is a diffusion pipeline."""
        from sim.cost.calibration_file import load_calibration
        from sim.cost.compute_speed import compute_scale, scaled_compute

        c = getattr(cfg, "cost_model", None)
        name = getattr(c, "calibration", "auto") or "auto"
        if name == "auto":
            eff, doc = load_calibration(cfg.hardware.calibration, cfg.backend.name)
        else:
            eff, doc = load_calibration(name, cfg.backend.name, "cost_model.calibration")
        m = cfg.model
        own = {}
        if getattr(m, "diffusion", None) is not None:
            # the run's own pipeline may carry model.diffusion.* overrides: check them here,
            # as load_pipeline checks the pipelines it reads
            check_diffusion_pipeline(m.diffusion)
            own = {m.name: m.diffusion}
        return cls(Pricer(scaled_compute(cfg.hardware, compute_scale(c, doc)), eff), own)

    def pipeline(self, name: str) -> DiffusionPipelineConfig:
        """The pipeline called ``name``."""
        if name not in self._pipes:
            self._pipes[name] = self._loader(name)
        return self._pipes[name]

    def job(self, shape: JobShape) -> Job:
        """``shape`` resolved against its pipeline (defaults, checks, latent tokens); its
        attention kernel must run on this GPU."""
        job = resolve(shape, self.pipeline(shape.model))
        hw = self.pricer.hw
        check_arch(job.pipe.attention_impl, getattr(hw, "arch", ""), hw.name)
        return job

    # ---- operators by stage
    def breakdown(self, shape: JobShape, plan: ParallelPlan, stage: str) -> list[OperatorCost]:
        """Every operator of ``stage`` (``encode``, ``step`` or ``decode``) on the busiest GPU:
        per job for encode and decode, per denoising step for step."""
        job = self.job(shape)
        check_plan(plan, job)
        if stage == "encode":
            return self._encode(job)
        if stage == "step":
            return self._step(job, plan)
        if stage == "decode":
            return self._decode(job, plan)
        raise ConfigError("stage", stage, f"one of {list(STAGES)}")

    def _encode(self, job: Job) -> list[OperatorCost]:
        return encode_ops(self.pricer, job.pipe.text_encoders, job.passes)

    def _step(self, job: Job, plan: ParallelPlan) -> list[OperatorCost]:
        split = dit_split(plan, job, self.link_bw)
        ops = dit_step_ops(self.pricer, job.pipe.dit, job.image_tokens, split,
                           job.pipe.attention_impl,
                           execution_of(job.pipe, self.pricer.hw.calibration),
                           job.pipe.attention_sm_share)
        return ops + plan_comm_ops(self.pricer, plan, job, split, ops)

    def _decode(self, job: Job, plan: ParallelPlan) -> list[OperatorCost]:
        v = job.pipe.vae
        g = plan.gpus if job.pipe.vae_parallel else 1
        launch_s = (eager_launch_s(self.pricer.hw.calibration, job.pipe.eager_launch_us,
                                   "the VAE's causal-mask loop takes no host time")
                    if runs_mask_loop(v) else 0.0)
        one = decode_ops(self.pricer, v, job.latent_frames, job.latent_height, job.latent_width,
                         launch_s)
        # a split decode (xDiT's parallel VAE) shares the work over the gang; otherwise each
        # data-parallel group decodes its own images whole on one GPU (the reference code)
        share = (split_factor(job.images, g, job.latent_height) if job.pipe.vae_parallel
                 else float(math.ceil(job.images / plan.data)))
        # the busiest GPU's share of each layer's work; the layers it runs stay as counted
        ops = [OperatorCost(op.name, op.count, op.flops * share, op.bytes * share,
                            op.time_s * share, op.bound, op.dtype) for op in one]
        if g > 1:
            nbytes = job.images * output_bytes(v, job.height, job.width, job.frames)
            ops.append(self.pricer.comm("vae_output_allgather", "allgather", nbytes, g,
                                        self.link_bw))
        return ops

    # ---- DiffusionCost
    def memory(self, shape: JobShape, plan: ParallelPlan) -> PlanMemory:
        """What one GPU of ``plan`` holds for ``shape`` (``sim.diffusion.memory``)."""
        return plan_memory(self.job(shape), plan, self.capacity)

    def timing(self, shape: JobShape, plan: ParallelPlan) -> JobTiming:
        """Time of ``shape`` under ``plan`` (``ConfigError`` naming the field if it cannot
        run it, or naming the plan and the GiB if it does not fit in memory)."""
        key = (shape, plan)
        hit = self._timing.get(key)
        if hit is None:
            job = self.job(shape)
            check_plan(plan, job)
            check_fits(job, plan, self.capacity, self.pricer.hw.name)
            before, after = offload_seconds(job, plan, float(self.pricer.hw.pcie_bandwidth))
            hit = JobTiming(plan, job.steps, _total(self._encode(job)) + before,
                            _total(self._step(job, plan)),
                            _total(self._decode(job, plan)) + after)
            self._timing[key] = hit
        return hit

    def best(self, shape: JobShape, gpus: int) -> JobTiming:
        """The fastest valid plan on exactly ``gpus`` GPUs and its timing; a tie goes to the
        plan with fewer and cheaper degrees (``sim.diffusion.plans.simpler_first``)."""
        key = (shape, gpus)
        hit = self._best.get(key)
        if hit is None:
            job = self.job(shape)
            memory = {p: plan_memory(job, p, self.capacity) for p in valid_plans(job, gpus)}
            plans = [p for p, m in memory.items() if m.fits]
            if memory and not plans:  # say why the least hungry one does not fit
                check_fits(job, min(memory, key=lambda p: memory[p].peak), self.capacity,
                           self.pricer.hw.name)
            if not plans:
                raise ConfigError("gpus", gpus, f"no parallel plan of {job.name} fits {gpus} "
                                  "GPUs")
            timings = [self.timing(shape, p) for p in plans]
            fastest = min(t.total_s for t in timings)
            tied = [t for t in timings if t.total_s <= fastest * (1 + TIE_REL)]
            hit = min(tied, key=lambda t: simpler_first(t.plan))
            self._best[key] = hit
        return hit


def _total(ops: list[OperatorCost]) -> float:
    return float(sum(op.time_s for op in ops))
