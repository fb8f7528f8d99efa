"""``cluster.job_cost.name=constant``: fixed per-stage times, for tests and queueing theory.

A job of ``images`` images (or one video) of ``steps`` denoising steps on a plan of ``g`` GPUs
takes ``encode_ms`` (text encoders, one GPU: not sped up), then ``steps`` steps of
``step_ms × images / speedup(g)``, then ``decode_ms × images / speedup(g)``, where
``speedup(g) = 1 + parallel_efficiency × (g − 1)`` (linear with efficiency 1). The shape's
resolution and model do not matter; ``steps = 0`` means ``default_steps``. Every plan of
``g`` GPUs is as fast as any other, so ``best`` returns Ulysses over the gang.
"""

from __future__ import annotations

from sim.diffusion.job import JobShape, JobTiming, ParallelPlan
from sim.errors import ConfigError


class ConstantDiffusionCost:
    """A ``DiffusionCost`` with fixed stage times and a stated parallel efficiency."""

    def __init__(self, encode_s: float, step_s: float, decode_s: float,
                 default_steps: int = 50, parallel_efficiency: float = 1.0) -> None:
        self.encode_s, self.step_s, self.decode_s = float(encode_s), float(step_s), float(decode_s)
        self.default_steps, self.efficiency = int(default_steps), float(parallel_efficiency)

    @classmethod
    def from_config(cls, c) -> ConstantDiffusionCost:
        """From ``cluster.job_cost`` (a ``DiffusionJobCostConfig``)."""
        return cls(c.encode_ms * 1e-3, c.step_ms * 1e-3, c.decode_ms * 1e-3, c.default_steps,
                   c.parallel_efficiency)

    def speedup(self, gpus: int) -> float:
        """How many times faster the steps and the decode run on ``gpus`` GPUs than on one."""
        return 1.0 + self.efficiency * (gpus - 1)

    def timing(self, shape: JobShape, plan: ParallelPlan) -> JobTiming:
        """Time of ``shape`` on ``plan.gpus`` GPUs (the split does not matter here)."""
        if plan.gpus < 1:
            raise ConfigError("cluster.parallel", plan.label(), "degrees must be >= 1")
        s = self.speedup(plan.gpus)
        steps = shape.steps or self.default_steps
        return JobTiming(plan, steps, self.encode_s, self.step_s * shape.images / s,
                         self.decode_s * shape.images / s)

    def best(self, shape: JobShape, gpus: int) -> JobTiming:
        """Ulysses over ``gpus`` GPUs (every plan of that size is equally fast)."""
        return self.timing(shape, ParallelPlan(ulysses=gpus))
