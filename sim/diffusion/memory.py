"""Memory of a diffusion job on a parallel plan, per GPU, and CPU offload's PCIe traffic.

What one GPU holds (bf16 throughout):

- **weights**: the DiT's, split by tensor parallelism and PipeFusion stages (Ulysses, ring,
  CFG and data parallelism replicate it), or sharded over the whole gang with
  ``model.diffusion.fsdp`` (Wan's ``--dit_fsdp --t5_fsdp``: FSDP ``FULL_SHARD``, one block
  gathered at a time); the text encoders' (on every rank, as HunyuanVideo and xDiT load the
  whole pipeline per rank; sharded too under ``fsdp``); the VAE's;
- **DiT activations**: one block's live tensors for this GPU's tokens (the residual stream,
  its normed copy, Q/K/V, the attention output, the MLP's hidden layer);
- **the attention working set**: Q, K, V and the output of this GPU's heads over the whole
  sequence (Ulysses gathers it) or its ring share (FlashAttention keeps no score matrix;
  ``sdpa_math`` adds its scores and their softmax);
- **the VAE decode working set**: three feature maps of the largest decoder level (input,
  output, norm), over the largest tile when the pipeline tiles (``sim.diffusion.vae.decode_tiles``).

``offload: none`` keeps every model resident; ``offload: model`` (diffusers'
``enable_model_cpu_offload``, Wan's ``--offload_model``) keeps one sub-model on the GPU at a
time: each is copied in over PCIe before its stage and back out after it, once per job
(``offload_s``), and the peak is the largest stage's weights plus its working set.
A plan whose peak exceeds the GPU's memory (``hardware.cuda_total_bytes``, else
``hbm_bytes``) is refused, naming the plan and the GiB.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.config.diffusion_model import DiTConfig, TextEncoderConfig, VAEConfig
from sim.diffusion.job import ParallelPlan
from sim.diffusion.pipeline import Job
from sim.diffusion.vae import HALO_LATENT_ROWS, decode_tiles, upsampled_frames
from sim.errors import ConfigError

BYTES = 2  # bf16 weights and activations
GiB = float(2**30)
OFFLOAD_MODES = ("none", "model")


def dit_params(d: DiTConfig) -> float:
    """Weights of the DiT's blocks (their GEMMs; norms and embedders are small)."""
    h, f = d.hidden, d.ffn
    mod = d.modulation_dim or h
    double = 2 * (4 * h * h + 2 * h * f + 6 * h * mod)  # per stream: QKV, out, MLP, adaLN
    single = (3 * h + f) * h + h * (h + f) + 3 * h * mod
    cross = 4 * h * h + 2 * h * h + 2 * h * h + 2 * h * f  # self, q/out, text K/V, MLP
    shared = 4 * h * h + 2 * h * f + 12 * h * mod
    return float(d.double_layers * double + d.single_layers * single + d.cross_layers * cross
                 + d.shared_layers * shared)


def encoder_params(e: TextEncoderConfig) -> float:
    """Weights of a text encoder's layers."""
    kv = (e.kv_heads or e.heads) * e.head_dim
    attn = e.hidden * e.heads * e.head_dim * 2 + 2 * e.hidden * kv
    ffn = (3 if e.gated else 2) * e.hidden * e.ffn
    return float(e.layers * (attn + ffn))


def vae_params(v: VAEConfig) -> float:
    """Weights of the VAE decoder's convolutions."""
    vol = 27 if v.conv3d else 9
    c, total = v.mid_channels, 4 * vol * v.mid_channels ** 2
    for c_out in v.up_channels:
        total += v.resnets_per_level * 2 * vol * c_out * c_out + vol * c * c_out
        c = c_out
    return float(total)


@dataclass(frozen=True)
class PlanMemory:
    """Per-GPU bytes of a job on a plan (module doc), and what offload moves over PCIe."""

    dit_weights: float
    encoder_weights: float
    vae_weights: float
    dit_activations: float
    attention: float
    vae_working: float
    offload: str
    capacity: float

    @property
    def peak(self) -> float:
        step = self.dit_activations + self.attention
        if self.offload == "model":
            return max(self.encoder_weights, self.dit_weights + step,
                       self.vae_weights + self.vae_working)
        return (self.dit_weights + self.encoder_weights + self.vae_weights
                + max(step, self.vae_working))

    @property
    def fits(self) -> bool:
        return self.peak <= self.capacity

    def describe(self) -> str:
        g = {k: getattr(self, k) / GiB for k in ("dit_weights", "encoder_weights",
                                                  "vae_weights", "dit_activations",
                                                  "attention", "vae_working")}
        return (f"{self.peak / GiB:.1f} GiB of {self.capacity / GiB:.1f} GiB per GPU "
                f"(weights: DiT {g['dit_weights']:.1f}, text encoders "
                f"{g['encoder_weights']:.1f}, VAE {g['vae_weights']:.2f}; DiT activations "
                f"{g['dit_activations']:.1f}, attention {g['attention']:.1f}, VAE decode "
                f"{g['vae_working']:.1f}; offload {self.offload})")


def plan_memory(job: Job, plan: ParallelPlan, capacity: float) -> PlanMemory:
    """What one GPU of ``plan`` holds for ``job`` (module doc)."""
    p = job.pipe
    d, v = p.dit, p.vae
    dit_w, enc_w = (w / s for w, s in zip(weights(job), shards(job, plan), strict=True))
    vae_w = vae_params(v) * BYTES
    batch = math.ceil(job.images / plan.data) * job.passes / plan.cfg
    seq = job.image_tokens + d.text_tokens
    local = math.ceil(seq / (plan.ulysses * plan.ring * plan.pipefusion))
    h, t = d.hidden, plan.tensor
    acts = batch * local * (2 * h + 4 * h / t + d.ffn / t) * BYTES
    heads_share = h / (plan.ulysses * t)
    keys = math.ceil(seq / plan.ring)
    attention = batch * keys * heads_share * 4 * BYTES
    if p.attention_impl == "sdpa_math":
        # the math kernel materialises the scores and their softmax for this GPU's heads and
        # queries (all of them under Ulysses; its ring share under ring attention)
        queries = math.ceil(seq / (plan.ring * plan.pipefusion))
        attention += batch * (heads_share / d.head_dim) * queries * keys * 2 * BYTES
    return PlanMemory(dit_w, enc_w, vae_w, acts, attention, vae_working_set(job, plan),
                      p.offload, capacity)


def weights(job: Job) -> tuple[float, float]:
    """Bytes of the whole DiT and of all text encoders."""
    p = job.pipe
    return (dit_params(p.dit) * BYTES,
            sum(encoder_params(e) for e in p.text_encoders) * BYTES)


def pipeline_bytes(pipe) -> float:
    """Bytes of a whole pipeline (``DiffusionPipelineConfig``): its DiT, text encoders and VAE
    decoder; what each GPU of a new node reads from storage before it serves the pipeline
    (sequence and CFG parallelism replicate the DiT; an FSDP pipeline loads the whole
    checkpoint on every rank before sharding it)."""
    return (dit_params(pipe.dit) + sum(encoder_params(e) for e in pipe.text_encoders)
            + vae_params(pipe.vae)) * BYTES


def shards(job: Job, plan: ParallelPlan) -> tuple[int, int]:
    """Into how many parts one GPU's DiT and text encoders are split: FSDP shards both over
    the gang; otherwise tensor parallelism and PipeFusion stages split the DiT."""
    if job.pipe.fsdp:
        return plan.gpus, plan.gpus
    return plan.tensor * plan.pipefusion, 1


def vae_working_set(job: Job, plan: ParallelPlan) -> float:
    """Three feature maps of the decoder's largest level, over its largest tile (or chunk) if
    it tiles, for the images this GPU decodes (its data-parallel group's, or its share of a
    split decode: whole images, or one strip of an image, tiled in turn)."""
    v = job.pipe.vae
    height = job.latent_height
    images = math.ceil(job.images / plan.data)
    if job.pipe.vae_parallel:
        group = plan.gpus // plan.data
        if images >= group:
            images = math.ceil(images / group)
        else:  # one strip of an image, with its halo rows (sim.diffusion.vae.split_factor)
            strips = group // max(images, 1)
            height = min(height, math.ceil(height / strips) + 2 * HALO_LATENT_ROWS)
            images = 1
    # the first tile is the largest along every axis (decode_tiles)
    _, (t, h, w) = decode_tiles(v, job.latent_frames, height, job.latent_width)[0]
    c = v.mid_channels
    biggest = t * h * w * c
    for i, c_out in enumerate(v.up_channels):
        if v.spatial_upsample[i]:
            h, w = 2 * h, 2 * w
        if v.temporal_upsample[i]:
            t = upsampled_frames(v, t)
        biggest = max(biggest, t * h * w * c_out)
    return 3.0 * biggest * BYTES * images


def offload_seconds(job: Job, plan: ParallelPlan, pcie_bandwidth: float
                    ) -> tuple[float, float]:
    """``offload: model``'s PCIe time per job on one GPU of ``plan``, each copying its own
    share of the weights: before the steps (text encoders in and out, the DiT in) and after
    them (the DiT out, the VAE in and out)."""
    if job.pipe.offload != "model":
        return 0.0, 0.0
    dit, enc = (w / s for w, s in zip(weights(job), shards(job, plan), strict=True))
    vae = vae_params(job.pipe.vae) * BYTES
    return (2 * enc + dit) / pcie_bandwidth, (dit + 2 * vae) / pcie_bandwidth


def check_fits(job: Job, plan: ParallelPlan, capacity: float, gpu: str) -> PlanMemory:
    """The plan's memory, or ``ConfigError`` naming the plan and the GiB if it does not fit."""
    m = plan_memory(job, plan, capacity)
    if not m.fits:
        hint = ("" if job.pipe.offload == "model" else
                "; model.diffusion.offload=model keeps one model on the GPU at a time")
        raise ConfigError("plan", plan.label(), f"{job.name} needs {m.describe()} on "
                          f"{gpu}: it does not fit{hint}")
    return m
