"""``python -m sim.explain model=<diffusion pipeline> …``: one job's stages as operators on the
roofline, the plan's communication, and why more GPUs do not make it proportionally faster.

    python -m sim.explain model=flux1_dev job=1024x1024 plan=ulysses4xcfg2 hardware=h100_sxm

Arguments (``key=value``; every other one is a ``python -m sim`` override):

- ``job=HEIGHTxWIDTH[xFRAMES]`` (default: the pipeline's default size and frames);
- ``steps=N``, ``images=N``, ``guidance=cfg|distilled|none`` (default: the pipeline's);
- ``plan=auto`` (default: the fastest valid plan on ``gpus``), ``single``, or degrees joined
  by ``x``: ``ulysses4xcfg2``, ``ring2xpipefusion4``, … (of ulysses, ring, cfg, pipefusion,
  data, tensor);
- ``gpus=N`` (with ``plan=auto``; default and most ``hardware.gpus_per_node``: a job runs on
  one node's GPUs);
- ``chart=PATH|none``: the roofline PNG of the denoising step (default: ``roofline.png`` in
  the run's output dir, as for an LLM step).

It prints, per stage (text encoding once per job, one denoising step, the VAE decode once per
job), every operator with its count, FLOPs, bytes, arithmetic intensity, the balance point of
its dtype, the roof that binds it and its time and share; then the plan's communication per
step, the job's total, and the best plan's time on 1, 2, 4, … GPUs split into compute,
communication and serial time (the text encoders run on one GPU; PipeFusion's warm-up
step and pipeline fill/drain) — what keeps the speed-up below the GPU count; and, for the
plan shown, its speed-up over one GPU and where the rest goes.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.roofline_chart import write_roofline_chart
from sim.cost.attention_kernels import CALIBRATED, fallback_note, kernel_class
from sim.cost.base import OperatorCost
from sim.cost.pricing import Pricer
from sim.diffusion.cost import STAGES, DiffusionCostModel
from sim.diffusion.execution import execution_of
from sim.diffusion.job import GUIDANCE_MODES, JobShape, JobTiming, ParallelPlan
from sim.diffusion.pipeline import Job, with_defaults
from sim.diffusion.plans import parse_plan
from sim.diffusion.vae import channels_first_3d, cuda_core_class, decode_tiles, runs_mask_loop
from sim.errors import ConfigError

OWN_KEYS = ("job", "plan", "gpus", "steps", "images", "guidance")
JOB = re.compile(r"^(\d+)x(\d+)(?:x(\d+))?$")
STAGE_TITLES = {"encode": "text encoders (one GPU, once per job)",
                "step": "one denoising step (per GPU: every guidance pass of this GPU group)",
                "decode": "VAE decode (per GPU, once per job)"}
COLS = ["operator", "count", "GFLOP", "MB", "FLOP/B", "dtype", "balance", "bound", "TFLOP/s",
        "time_ms", "share_%"]


def _int(key: str, text: str, low: int = 1) -> int:
    if not str(text).isdigit() or int(text) < low:
        raise ConfigError(key, text, f"a whole number >= {low}")
    return int(text)


def parse_shape(model: str, default: JobShape, own: dict[str, str]) -> JobShape:
    """The job of ``job=``/``steps=``/``images=``/``guidance=`` (module doc)."""
    h, w, f = default.height, default.width, default.frames
    if "job" in own:
        m = JOB.match(own["job"])
        if not m:
            raise ConfigError("job", own["job"], "HEIGHTxWIDTH or HEIGHTxWIDTHxFRAMES, "
                              "e.g. 1024x1024 or 720x1280x129")
        h, w, f = int(m[1]), int(m[2]), int(m[3] or 1)
    guidance = own.get("guidance", "")
    if guidance and guidance not in GUIDANCE_MODES:
        raise ConfigError("guidance", guidance, f"one of {list(GUIDANCE_MODES)}")
    steps = _int("steps", own["steps"]) if "steps" in own else 0
    images = _int("images", own["images"]) if "images" in own else 1
    return JobShape(model, h, w, f, steps, images, guidance)


def ops_table(ops: list[OperatorCost], hw) -> pd.DataFrame:
    """The operators as explain prints them (one row each, ``COLS``)."""
    peaks = {"bf16": float(hw.bf16_flops), "fp32": float(getattr(hw, "fp32_flops", 0.0))}
    bw = float(hw.hbm_bandwidth)
    t = pd.DataFrame({
        "operator": [o.name for o in ops], "count": [o.count for o in ops],
        "flops": [o.flops for o in ops], "bytes": [o.bytes for o in ops],
        "time_s": [o.time_s for o in ops], "bound": [o.bound for o in ops],
        # the CUDA-core class runs against the FP32 roof, everything else the bf16 one
        "dtype": [("fp32" if o.dtype == "fp32" else "bf16") if o.flops > 0 else "-"
                  for o in ops]})
    total = t["time_s"].sum()
    t["GFLOP"] = t["flops"] / 1e9
    t["MB"] = t["bytes"] / 1e6
    t["FLOP/B"] = t["flops"] / t["bytes"].where(t["bytes"] > 0)
    t["balance"] = [peaks[d] / bw if d in peaks else np.nan for d in t["dtype"]]
    t["TFLOP/s"] = (t["flops"] / t["time_s"].where(t["time_s"] > 0)).fillna(0.0) / 1e12
    t["time_ms"] = t["time_s"] * 1e3
    t["share_%"] = 100 * t["time_s"] / total if total > 0 else 0.0
    return t


def split_time(cost: DiffusionCostModel, shape: JobShape, timing: JobTiming) -> dict:
    """A job's time on its plan as compute (operators on the roofline), communication,
    serial time (text encoding on one GPU, PipeFusion's warm-up and fill/drain) and eager host
    time beyond the GPU's, in seconds."""
    plan, steps = timing.plan, timing.steps
    parts = {"compute": 0.0, "comm": 0.0, "serial": timing.encode_s, "host": 0.0}
    for stage, times in (("step", steps), ("decode", 1)):
        for op in cost.breakdown(shape, plan, stage):
            key = op.bound if op.bound in ("comm", "serial", "host") else "compute"
            parts[key] += op.time_s * times
    # what the decode stage holds beyond its operators: offload's copies after the steps
    parts["serial"] += timing.decode_s - sum(o.time_s for o in cost.breakdown(shape, plan,
                                                                               "decode"))
    return parts


def scaling_table(cost: DiffusionCostModel, shape: JobShape, max_gpus: int) -> pd.DataFrame:
    """The best plan's time on 1, 2, 4, … ``max_gpus`` GPUs, its speed-up (over the fewest
    GPUs the job fits on) and split; a gang the job does not fit on says so."""
    rows, base, base_compute, base_g = [], None, None, 1
    g = 1
    while g <= max_gpus:
        try:
            t = cost.best(shape, g)
        except ConfigError:
            rows.append({"gpus": g, "plan": "does not fit"})
            g *= 2
            continue
        parts = split_time(cost, shape, t)
        if base is None:
            base, base_compute, base_g = t.total_s, parts["compute"], g
        rows.append({"gpus": g, "plan": t.plan.label(), "total_s": t.total_s,
                     "speedup": base / t.total_s,
                     "efficiency_%": 100 * base * base_g / t.total_s / g,
                     "compute_s": parts["compute"], "comm_s": parts["comm"],
                     "serial_s": parts["serial"], "host_s": parts["host"],
                     # compute beyond 1/g of one GPU's: smaller (less efficient) kernels, work
                     # every GPU repeats, the VAE strips' halos
                     "compute_extra_s": parts["compute"] - base_compute * base_g / g,
                     "comm_%": 100 * parts["comm"] / t.total_s,
                     "serial_%": 100 * parts["serial"] / t.total_s,
                     "host_%": 100 * parts["host"] / t.total_s})
        g *= 2
    return pd.DataFrame(rows)


def attention_line(impl: str, hw, pipe=None) -> str:
    """What prices the DiT's attention: a measured kernel class at a long sequence on this GPU
    (``pipe``: its SM-share override), or the backend's tables."""
    if impl == CALIBRATED:
        return ("calibrated (the backend's fitted encoder-attention tables; "
                "model.diffusion.attention_impl=fa2|fa3|sdpa_flash|... names a kernel class)")
    k = kernel_class(hw.calibration, impl)
    if k is None:
        return fallback_note(hw.calibration, impl)
    slow = k.slowdown(hw.bf16_flops, getattr(hw, "fp32_flops", 0.0),
                      getattr(pipe, "attention_sm_share", None))
    at = {d: c.eta_max / slow * hw.bf16_flops / 1e12 for d, c in k.curves.items()}
    peaks = ", ".join(f"head dim {d}: {v:,.0f}" for d, v in sorted(at.items()))
    carried = ""
    if slow != 1.0:
        share = getattr(pipe, "attention_sm_share", None)
        share = k.sm_share if share is None else share
        carried = (f"; its SM part, {100 * share:.0f}% of its time where it was measured, runs "
                   f"at this GPU's FP32 rate: {1 / slow:.2f}x the throughput the tensor peak "
                   "alone carries over")
    return f"{impl} (kernel class {k.name}; saturated TFLOP/s {peaks}{carried})"


def execution_line(pipe, hw) -> str:
    """The DiT's execution mode and, in eager, the host costs that price it."""
    e = execution_of(pipe, hw.calibration)
    if not e.eager:
        return "compiled (torch.compile: fused elementwise kernels, host ahead of the GPU)"
    if e.launch_s == 0 and e.unfused == 1:
        return (f"eager, priced as compiled: no fitted eager-mode costs for hardware "
                f"calibration {hw.calibration!r} (model.diffusion.eager_launch_us / "
                "eager_unfused set them)")
    return (f"eager (PyTorch ops one by one: {e.unfused:.2f} kernels and passes per fused "
            f"elementwise one, {e.launch_s * 1e6:.1f} us of host dispatch per launch; a step "
            "takes max(GPU, host); model.diffusion.execution=compiled for torch.compile)")


def vae_line(job: Job, pricer: Pricer) -> str:
    """How the VAE decodes this job: its tiles and what runs its convolutions."""
    v = job.pipe.vae
    tiles = decode_tiles(v, job.latent_frames, job.latent_height, job.latent_width)
    n = sum(k for k, _ in tiles)
    t, h, w = tiles[0][1]
    if n == 1:
        cut = "the latent whole"
    elif v.tile_mode == "cached":
        cut = f"{n} chunks of {t}x{h}x{w} latent in turn, a cache carrying each to the next"
    else:
        cut = (f"{n} tiles of up to {t}x{h}x{w} latent, each on its own ({v.tile_px} px every "
               f"{v.tile_stride_px or v.tile_px}"
               + (f", {v.tile_frames} frames every {v.tile_stride_frames or v.tile_frames}"
                  if v.tile_frames else "") + "; overlaps decoded twice)")
    eff = cuda_core_class(pricer, v)
    if not v.conv3d:
        conv = "2D convolutions as tensor-core GEMMs"
    elif eff is not None:
        conv = (f"3D convolutions channels-first on the CUDA cores at {100 * eff:.1f}% of the "
                f"FP32 peak ({eff * pricer.hw.fp32_flops / 1e12:.0f} TFLOP/s; "
                "model.diffusion.vae.conv3d_layout=channels_last for tensor cores)")
    elif channels_first_3d(v):
        conv = ("3D convolutions channels-first, priced as tensor-core GEMMs: "
                + (f"no fitted class for hardware calibration {pricer.hw.calibration!r}"
                   if pricer.hw.fp32_flops else f"no fp32_flops for {pricer.hw.name}"))
    else:
        conv = "3D convolutions channels-last as tensor-core GEMMs"
    mask = ("; the frame-causal mask built by a Python loop, one launch per row"
            if runs_mask_loop(v) else "")
    return f"{cut}; {conv}{mask}"


def _header(name: str, job: Job, plan: ParallelPlan, pricer: Pricer, backend: str,
            auto: bool) -> list[str]:
    hw = pricer.hw
    frames = f"x{job.frames} frames" if job.frames > 1 else ""
    how = "the fastest valid plan (plan=auto)" if auto else "plan"
    return [f"{name} on {plan.gpus}x {hw.name}, backend {backend}: one job of {job.images} "
            f"x {job.height}x{job.width}{frames}, {job.steps} steps, guidance {job.guidance} "
            f"({job.passes} DiT pass{'es' if job.passes > 1 else ''} per step)",
            f"latent {job.latent_frames}x{job.latent_height}x{job.latent_width} -> "
            f"{job.image_tokens:,} image tokens + {job.text_tokens} text tokens per sequence",
            f"{how}: {plan.label()} ({plan.gpus} GPUs)",
            f"attention kernel: {attention_line(job.pipe.attention_impl, hw, job.pipe)}",
            f"execution: {execution_line(job.pipe, hw)}",
            f"vae decode: {vae_line(job, pricer)}",
            f"balance point (peak FLOP/s / memory bandwidth): bf16 "
            f"{hw.bf16_flops / hw.hbm_bandwidth:,.0f} FLOP/B (below it an operator is "
            "memory-bound, above it compute-bound; bound is the cost model's verdict)"]


def report(cost: DiffusionCostModel, cfg, shape: JobShape, plan: ParallelPlan,
           auto: bool) -> tuple[str, pd.DataFrame]:
    """The text explain prints, and the step's operator table (for the chart)."""
    job = cost.job(shape)
    timing = cost.timing(shape, plan)
    lines = _header(shape.model, job, plan, cost.pricer, cfg.backend.name, auto)
    step_table = None
    fmt = {"display.width": 160, "display.float_format": "{:,.3f}".format}
    for stage in STAGES:
        table = ops_table(cost.breakdown(shape, plan, stage), cost.pricer.hw)
        if stage == "step":
            step_table = table
        total = table["time_s"].sum()
        lines += ["", f"[{stage}] {STAGE_TITLES[stage]}: {total * 1e3:,.3f} ms"]
        with pd.option_context(*[x for kv in fmt.items() for x in kv]):
            lines.append(table[COLS].to_string(index=False, na_rep="-"))
    comm = step_table[step_table["bound"].isin(["comm", "serial", "host"])]
    lines += ["", f"communication, serial and eager host time of plan {plan.label()} per step: "
              + (", ".join(f"{r.operator} x{r.count} {r.time_ms:.3f} ms" for r in
                           comm.itertuples()) or _no_comm(plan))]
    if plan.pipefusion > 1:
        lines.append("(pipefusion_warmup: the synchronous first step, in which the stages run "
                     "in turn; pipefusion_fill_drain: the patch pipeline's fill and drain; "
                     f"each once per job, shown spread over the {timing.steps} steps)")
    lines.append(f"memory per GPU: {cost.memory(shape, plan).describe()}; stages: VAE "
                 f"decode {'split over the gang' if job.pipe.vae_parallel else 'whole on one GPU'}"
                 f", text encoders on every rank{', FSDP-sharded' if job.pipe.fsdp else ''}")
    lines.append(f"job: encode {timing.encode_s:.3f} s + {timing.steps} steps x "
                 f"{timing.step_s * 1e3:.2f} ms + decode {timing.decode_s:.3f} s = "
                 f"{timing.total_s:.3f} s")
    scale = scaling_table(cost, shape, int(cfg.hardware.gpus_per_node))
    lines += ["", "best plan by GPU count (compute: operators on the roofline; comm: "
              "collectives and sends not hidden; serial: text encoders on one GPU and "
              "PipeFusion's warm-up step and pipeline fill/drain; compute_extra: compute "
              "beyond 1/gpus of one GPU's):"]
    with pd.option_context("display.width", 160, "display.float_format", "{:,.2f}".format):
        lines.append(scale.to_string(index=False))
    fits = scale[scale["plan"] != "does not fit"]
    lines.append(_closing(cost, shape, timing, fits.iloc[0], auto))
    return "\n".join(lines), step_table


def _no_comm(plan: ParallelPlan) -> str:
    if plan.gpus == 1:
        return "none (one GPU)"
    return (f"none (its {plan.data} data-parallel groups each denoise their own images "
            "and exchange nothing within a step)")


def _closing(cost: DiffusionCostModel, shape: JobShape, timing: JobTiming, one_gpu,
             auto: bool) -> str:
    """Why the plan that was asked for (or picked) is not ``gpus`` times one GPU."""
    plan, g = timing.plan, timing.plan.gpus
    parts = split_time(cost, shape, timing)
    which = (f"plan {plan.label()} (the best plan on {g} GPUs)" if auto
             else f"plan {plan.label()} (as asked)")
    comm, serial = (100 * parts[k] / timing.total_s for k in ("comm", "serial"))
    if g == 1:
        return (f"{which} on one GPU: {timing.total_s:.3f} s, {serial:.1f}% of it serial "
                "stages (the text encoders); the table shows what more GPUs gain")
    n = int(one_gpu.gpus)  # the fewest GPUs the job fits on
    on = "one GPU" if n == 1 else f"{n} GPUs (the fewest it fits on)"
    if n == g:
        return f"{which} on {g} GPUs: {timing.total_s:.3f} s; fewer GPUs cannot hold the job"
    extra = 100 * (parts["compute"] - one_gpu.compute_s * n / g) / timing.total_s
    return (f"{which} on {g} GPUs: {one_gpu.total_s / timing.total_s:.2f}x of the best "
            f"plan on {on}, not {g // n}x: {comm:.1f}% of the time is communication, "
            f"{serial:.1f}% serial stages and {extra:.1f}% compute beyond {n}/{g} of that "
            "(smaller, less efficient kernels; work every GPU repeats, such as the "
            "modulation GEMMs; the VAE strips' halos)")


def run(cfg, own: dict[str, str], chart: Path | None) -> int:
    """Explain one diffusion job of ``cfg.model`` (module doc); prints, writes the chart at
    ``chart`` (None: none)."""
    cost = DiffusionCostModel.from_config(cfg)
    name = cfg.model.name
    pipe = cost.pipeline(name)
    shape = parse_shape(name, with_defaults(JobShape(name, 0, 0, 0), pipe), own)
    text = own.get("plan", "auto")
    auto = text == "auto"
    node = int(cfg.hardware.gpus_per_node)
    gpus = _int("gpus", own["gpus"]) if "gpus" in own else None
    if gpus is not None and gpus > node:
        raise ConfigError("gpus", own["gpus"], f"at most hardware.gpus_per_node={node} (a "
                          "job runs on one node's GPUs)")
    try:
        if auto:
            plan = cost.best(shape, gpus or node).plan
        else:
            plan = parse_plan(text)
            if gpus is not None and plan.gpus != gpus:
                raise ConfigError("plan", text, f"its degrees multiply to {plan.gpus}, "
                                  f"not gpus={own['gpus']}")
            if plan.gpus > node:
                raise ConfigError("plan", text, f"its degrees multiply to {plan.gpus} GPUs, "
                                  f"more than hardware.gpus_per_node={node} (a job runs on "
                                  "one node's GPUs)")
            cost.timing(shape, plan)
    except ConfigError as e:
        if e.field.startswith("cluster.parallel"):
            raise ConfigError("plan", text, f"{e.field}={e.value!r}: {e.expected}") from e
        raise
    out, step_table = report(cost, cfg, shape, plan, auto)
    print(out)
    if chart is not None:
        write_roofline_chart(step_table, {"bf16": float(cfg.hardware.bf16_flops)},
                             float(cfg.hardware.hbm_bandwidth), chart,
                             f"{name} on {cfg.hardware.name}: one denoising step, "
                             f"plan {plan.label()}")
        print(f"roofline chart: {chart}")
    return 0
