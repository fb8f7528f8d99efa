"""Parallel plans of one job over its GPUs (xDiT's vocabulary): validity, enumeration, the
per-GPU split of the DiT step, and the plan's own communication per step.

Degrees (``ParallelPlan``): Ulysses ``u`` and ring ``r`` sequence parallelism, CFG parallel
``c`` (the two guidance passes on two GPU groups), PipeFusion ``p`` (layers in ``p`` stages,
the sequence in ``M = p`` patches), data parallel ``d`` (the job's images over ``d`` groups),
tensor parallel ``t``. Their product is the job's GPU count. Per step, besides what the DiT
layers communicate (``sim.diffusion.dit``):

- CFG parallel: one all-gather over the ``c`` groups of the noise predictions (the guidance
  combines both), ``c × images × latent bytes``;
- sequence parallel: one all-gather over the ``u·r`` GPUs of the output latent tokens;
- PipeFusion: each stage sends each patch's activations to the next (``p2p``, overlapped with
  the next patch's compute: only the excess shows); the pipeline fills and drains once per
  job, on the first step only, since each patch attends to the other patches' K and V from
  the previous step (stale activations); that bubble of ``(p − 1)`` patch-stage times is
  spread over the steps.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import fields

from sim.cost.base import OperatorCost
from sim.cost.pricing import ACT_BYTES, Pricer
from sim.diffusion.dit import DitSplit
from sim.diffusion.job import ParallelPlan
from sim.diffusion.pipeline import Job
from sim.errors import ConfigError

FIELD = "cluster.parallel"
DEGREES = tuple(f.name for f in fields(ParallelPlan))


def parse_plan(text: str) -> ParallelPlan:
    """A plan from its label (``ParallelPlan.label``): ``single``, ``ulysses4xcfg2``, …"""
    if text in ("single", "1"):
        return ParallelPlan()
    degrees = {}
    for part in str(text).split("x"):
        name = part.rstrip("0123456789")
        value = part[len(name):]
        if name not in DEGREES or not value.isdigit() or int(value) < 1 or name in degrees:
            raise ConfigError("plan", text, "'single', 'auto' or 'x'-joined degrees NAME<int> "
                              f"of {list(DEGREES)}, e.g. ulysses4xcfg2")
        degrees[name] = int(value)
    return ParallelPlan(**degrees)


def check_plan(plan: ParallelPlan, job: Job, gpus: int | None = None) -> None:
    """Refuse a plan that cannot run ``job`` (on ``gpus`` GPUs), naming the degree."""
    for name in DEGREES:
        v = getattr(plan, name)
        if not isinstance(v, int) or v < 1:
            raise ConfigError(f"{FIELD}.{name}", v, "a whole number >= 1")
    if gpus is not None and plan.gpus != gpus:
        raise ConfigError(FIELD, plan.label(), f"the degrees must multiply to the job's {gpus} "
                          f"GPUs (they multiply to {plan.gpus})")
    d = job.pipe.dit
    if d.heads % (plan.ulysses * plan.tensor):
        field = "ulysses" if plan.ulysses > 1 else "tensor"
        raise ConfigError(f"{FIELD}.{field}", getattr(plan, field),
                          f"Ulysses × tensor degree ({plan.ulysses * plan.tensor}) must divide "
                          f"{job.name}'s {d.heads} attention heads")
    if plan.tensor > 1 and d.ffn % plan.tensor:
        raise ConfigError(f"{FIELD}.tensor", plan.tensor, f"must divide the MLP width {d.ffn}")
    if plan.cfg > 1 and (plan.cfg != 2 or job.passes != 2):
        raise ConfigError(f"{FIELD}.cfg", plan.cfg,
                          "1, or 2 under classifier-free guidance (the two passes on two GPU "
                          f"groups); {job.name} runs guidance={job.guidance}")
    if plan.pipefusion > d.layers:
        raise ConfigError(f"{FIELD}.pipefusion", plan.pipefusion,
                          f"at most the DiT's {d.layers} blocks")
    rows = job.latent_height // d.patch_size
    if plan.pipefusion * plan.ulysses * plan.ring > rows * job.latent_frames:
        raise ConfigError(f"{FIELD}.pipefusion", plan.pipefusion,
                          f"sequence parts × patches must not exceed the {rows} token rows "
                          "per latent frame")


def enumerate_plans(gpus: int) -> list[ParallelPlan]:
    """Every assignment of degrees whose product is ``gpus`` (valid or not for a job)."""
    if gpus < 1:
        raise ConfigError("gpus", gpus, "must be >= 1")
    divisors = [k for k in range(1, gpus + 1) if gpus % k == 0]
    out = []
    for combo in itertools.product(divisors, repeat=len(DEGREES)):
        if math.prod(combo) == gpus:
            out.append(ParallelPlan(**dict(zip(DEGREES, combo, strict=True))))
    return out


def valid_plans(job: Job, gpus: int) -> list[ParallelPlan]:
    """The plans of ``enumerate_plans`` that can run ``job``."""
    out = []
    for plan in enumerate_plans(gpus):
        try:
            check_plan(plan, job, gpus)
        except ConfigError:
            continue
        out.append(plan)
    return out


def dit_split(plan: ParallelPlan, job: Job, link_bw: float) -> DitSplit:
    """This GPU's share of a DiT step under ``plan`` (the busiest GPU)."""
    images = math.ceil(job.images / plan.data)
    layers = job.pipe.dit.layers
    # the slowest stage holds ⌈layers / p⌉ blocks
    stage = math.ceil(layers / plan.pipefusion) / layers
    return DitSplit(batch=images * job.passes // plan.cfg, ulysses=plan.ulysses, ring=plan.ring,
                    tensor=plan.tensor, stage=stage, patches=plan.pipefusion, link_bw=link_bw)


def plan_comm_ops(pricer: Pricer, plan: ParallelPlan, job: Job, split: DitSplit,
                  dit_ops: list[OperatorCost]) -> list[OperatorCost]:
    """The plan's own communication and serial time per step (module doc)."""
    ops: list[OperatorCost] = []
    bw = split.link_bw
    images = math.ceil(job.images / plan.data)
    if plan.cfg > 1:
        nbytes = plan.cfg * images * job.latent_bytes
        ops.append(pricer.comm("cfg_allgather", "allgather", nbytes, plan.cfg, bw))
    if split.seq > 1:
        nbytes = split.batch * job.latent_bytes
        ops.append(pricer.comm("sp_output_allgather", "allgather", nbytes, split.seq, bw))
    p = plan.pipefusion
    if p > 1:
        d = job.pipe.dit
        tokens = math.ceil((job.image_tokens + d.text_tokens) / (split.seq * p))
        send = pricer.comm("pipefusion_p2p", "p2p", split.batch * tokens * d.hidden * ACT_BYTES,
                           2, bw)
        compute = sum(op.time_s for op in dit_ops)
        patch_stage = compute / p  # one patch through this stage
        exposed = max(send.time_s - patch_stage, 0.0)
        ops.append(OperatorCost(send.name, p, 0.0, send.bytes * p, exposed * p, "comm"))
        bubble = (p - 1) * (patch_stage + exposed) / job.steps
        ops.append(OperatorCost("pipefusion_fill_drain", 1, 0.0, 0.0, bubble, "serial"))
    return ops
