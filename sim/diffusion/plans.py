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
- PipeFusion, three parts, each once (docs/diffusion.md):

  - ``pipefusion_p2p``, every step: each stage sends each patch's activations to the next
    (overlapped with the next patch's compute: only the excess shows);
  - ``pipefusion_warmup``, once per job: xDiT runs the first ``WARMUP_STEPS`` step(s)
    synchronously (``_sync_pipeline``: no stale K and V exist yet, so the whole sequence
    passes stage 1, then stage 2, …, each GPU idle outside its turn). Such a step takes the
    ``p`` stages' work in sequence and ``p − 1`` hand-offs of the full sequence instead of
    one stage's: ``(p − 1) × (the step's DiT time on this GPU + a hand-off)`` beyond the
    step's own price (the DiT time: its compute and the collectives inside its layers, which
    a stage runs in its turn too). When the job has no more steps than that, every step runs
    so;
  - ``pipefusion_fill_drain``, once per job: the patch pipeline of the remaining
    (asynchronous) steps fills at their start and drains at their end, ``(p − 1)``
    patch-stage times in all; in between it stays full, since each patch attends to the
    other patches' K and V from the previous step (stale activations).

  The two once-per-job parts are spread over the steps (``JobTiming.step_s``).

``plan=auto`` keeps the fastest valid plan; plans within ``TIE_REL`` of it are tied, and the
tie goes to the plan with fewer degrees above 1, then to the one whose GPUs sit on cheaper
degrees (``PREFERENCE``: the degree that communicates least first), so the choice is
deterministic and no degree is used that buys nothing. A data-parallel degree above the
job's images would leave a group without an image: it is invalid.
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
# xDiT's default num_pipeline_warmup_steps: xfuser/config/args.py, xFuserArgs.warmup_steps = 1
# (--warmup_steps, default 1), passed by the pipelines as runtime_config.warmup_steps
WARMUP_STEPS = 1
TIE_REL = 1e-9  # plans whose times differ by less than this (relative) are tied
# degrees by what they communicate per step, least first: data (nothing), cfg (one gather),
# pipefusion (patch sends), ulysses (all-to-alls per layer), ring (K and V per layer),
# tensor (all-reduces per layer)
PREFERENCE = ("data", "cfg", "pipefusion", "ulysses", "ring", "tensor")


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
    if plan.data > job.images:
        raise ConfigError(f"{FIELD}.data", plan.data,
                          f"at most the job's {job.images} image(s): a data-parallel group "
                          "without an image would idle")
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


def simpler_first(plan: ParallelPlan) -> tuple[int, ...]:
    """Sort key of tied plans (module doc): fewer degrees above 1 first, then the plan whose
    costliest degrees (``PREFERENCE`` from the end) are smallest."""
    return (sum(getattr(plan, n) > 1 for n in DEGREES),
            *(getattr(plan, n) for n in reversed(PREFERENCE)))


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
    """The plan's own communication and serial time per step (module doc), given the DiT
    layers' operators of the step on this GPU (``dit_step_ops``)."""
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
        ops += _pipefusion_ops(pricer, p, job, split, dit_ops)
    return ops


def _pipefusion_ops(pricer: Pricer, p: int, job: Job, split: DitSplit,
                    dit_ops: list[OperatorCost]) -> list[OperatorCost]:
    """PipeFusion's sends, warm-up and fill/drain per step (module doc), from the step's DiT
    operators on this GPU (its stage, every patch)."""
    compute = sum(op.time_s for op in dit_ops if op.bound != "comm")
    # a warm-up step runs each stage's whole step in turn, collectives inside its layers too
    stage_step = sum(op.time_s for op in dit_ops)
    d = job.pipe.dit
    # this GPU's share of the joint sequence, per patch and whole
    seq_tokens = math.ceil((job.image_tokens + d.text_tokens) / split.seq)
    per_token = split.batch * d.hidden * ACT_BYTES
    bw = split.link_bw
    send = pricer.comm("pipefusion_p2p", "p2p", per_token * math.ceil(seq_tokens / p), 2, bw)
    patch_stage = compute / p  # one patch through this stage
    exposed = max(send.time_s - patch_stage, 0.0)
    ops = [OperatorCost(send.name, p, 0.0, send.bytes * p, exposed * p, "comm")]
    warm_steps = min(WARMUP_STEPS, job.steps)
    hand_off = pricer.comm("pipefusion_warmup", "p2p", per_token * seq_tokens, 2, bw)
    warm = warm_steps * (p - 1) * (stage_step + hand_off.time_s)
    ops.append(OperatorCost("pipefusion_warmup", warm_steps, 0.0,
                            warm_steps * (p - 1) * hand_off.bytes, warm / job.steps, "serial"))
    if job.steps > warm_steps:
        bubble = (p - 1) * (patch_stage + exposed) / job.steps
        ops.append(OperatorCost("pipefusion_fill_drain", 1, 0.0, 0.0, bubble, "serial"))
    return ops
