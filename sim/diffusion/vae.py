"""The operators of a VAE decode, and its split over a job's GPUs.

Every convolution is an implicit GEMM: ``m`` = output pixels (voxels for the 3D causal
convolutions of the video VAEs) of that layer, ``n`` = output channels, ``k`` = input
channels × kernel volume (9, or 27 in 3D). Its FLOPs are ``2·m·n·k``; its traffic is what an
implicit-GEMM kernel moves: the input and output feature maps once each and the weights,
not the ``m × k`` unfolded matrix (``gemm_work`` would count that ``k / C_in`` times over). Its
time is the roofline of those numbers with the calibrated dense-GEMM efficiencies at the
``(m, n, k)`` shape. The decoder's layout (``VAEConfig``): ``conv_in``; a mid block of two
ResNet blocks around one single-head self-attention over each latent frame's pixels; per up
level ``resnets_per_level`` ResNet blocks (two convolutions, a 1×1 shortcut where channels
change, GroupNorm + SiLU before each convolution), then a ×2 up-sampling in space (and in
time where flagged: ``T → 2T − 1``, causal) followed by a convolution at the new size;
``conv_out``.

On ``g`` GPUs the decode splits by images when the job has at least ``g`` of them, else each
image into ``g / images`` horizontal strips that each decode ``HALO_LATENT_ROWS`` extra latent
rows on each inner edge (the receptive field they need; recomputed, not exchanged), then
the strips are all-gathered.
"""

from __future__ import annotations

import math

from sim.config.diffusion_model import VAEConfig
from sim.cost.base import OperatorCost
from sim.cost.eta import evaluate
from sim.cost.gemm import gemm_axes, roofline
from sim.cost.pricing import ACT_BYTES, Pricer

HALO_LATENT_ROWS = 4  # latent rows a strip decodes beyond each inner edge (an estimate)
DTYPE = "bfloat16"


def conv_op(pricer: Pricer, name: str, m: float, c_in: int, c_out: int,
            volume: int) -> OperatorCost:
    """One convolution as an implicit GEMM on the roofline (module doc)."""
    e = pricer.eff.gemm[DTYPE]
    k = c_in * volume
    flops = 2.0 * m * c_out * k
    nbytes = ACT_BYTES * (m * c_in + m * c_out + k * c_out)
    eta_c, eta_m = evaluate((e.compute, e.memory), gemm_axes(float(m), float(c_out), float(k),
                                                             e.align_m))
    t, cb = roofline(flops, nbytes, pricer.peak(DTYPE), pricer.hw.hbm_bandwidth, eta_c, eta_m,
                     e.launch_s)
    return OperatorCost(name, 1, flops, nbytes, float(t), "compute" if cb else "memory", DTYPE)


def merge(ops: list[OperatorCost]) -> list[OperatorCost]:
    """Operators of one name summed into one row (in first-seen order); the bound is the
    one of the runs that take the most time."""
    out: dict[str, list[OperatorCost]] = {}
    for op in ops:
        out.setdefault(op.name, []).append(op)
    rows = []
    for name, group in out.items():
        bound = max(group, key=lambda o: o.time_s).bound
        rows.append(OperatorCost(name, sum(o.count for o in group),
                                 sum(o.flops for o in group), sum(o.bytes for o in group),
                                 sum(o.time_s for o in group), bound, group[0].dtype))
    return rows


def decode_ops(pricer: Pricer, v: VAEConfig, frames: int, height: int,
               width: int) -> list[OperatorCost]:
    """Decode of one latent of ``frames × height × width`` on one GPU, one row per kind of
    layer."""
    vol = 27 if v.conv3d else 9
    ops: list[OperatorCost] = []
    t, h, w = frames, height, width

    def conv(name: str, c_in: int, c_out: int, volume: int = vol) -> None:
        ops.append(conv_op(pricer, name, t * h * w, c_in, c_out, volume))

    def norm(name: str, c: int) -> None:  # GroupNorm + SiLU: read and write the map
        ops.append(pricer.elementwise(name, 2 * ACT_BYTES * t * h * w * c, 2))

    def resnet(prefix: str, c_in: int, c_out: int) -> None:
        norm("vae.group_norm_silu", c_in)
        conv(f"{prefix}_conv", c_in, c_out)
        norm("vae.group_norm_silu", c_out)
        conv(f"{prefix}_conv", c_out, c_out)
        if c_in != c_out:
            conv(f"{prefix}_shortcut", c_in, c_out, 1)

    c = v.mid_channels
    conv("vae.conv_in", v.latent_channels, c)
    resnet("vae.mid", c, c)
    if v.mid_attention:
        ops.append(pricer.gemm("vae.mid_attn_proj", t * h * w, 3 * c, c, DTYPE))
        ops.append(pricer.encoder_attention("vae.mid_attention", t, h * w, h * w, 1, c))
        ops.append(pricer.gemm("vae.mid_attn_proj", t * h * w, c, c, DTYPE))
    resnet("vae.mid", c, c)
    for i, c_out in enumerate(v.up_channels):
        for j in range(v.resnets_per_level):
            resnet(f"vae.up{i}", c if j == 0 else c_out, c_out)
        c = c_out
        if v.spatial_upsample[i] or v.temporal_upsample[i]:
            if v.spatial_upsample[i]:
                h, w = 2 * h, 2 * w
            if v.temporal_upsample[i]:
                t = 2 * t - 1
            conv(f"vae.up{i}_upsample_conv", c, c)
    norm("vae.group_norm_silu", c)
    conv("vae.conv_out", c, v.out_channels)
    return merge(ops)


def split_factor(images: int, gpus: int, latent_height: int) -> float:
    """Share of the job's decode work the busiest of ``gpus`` GPUs does (module doc)."""
    if images >= gpus:
        return float(math.ceil(images / gpus))
    strips = gpus // images
    if strips <= 1:
        return 1.0
    return min(1.0, 1.0 / strips + 2.0 * HALO_LATENT_ROWS / latent_height)


def output_bytes(v: VAEConfig, height: int, width: int, frames: int) -> float:
    """Bytes of one decoded image or video in bf16."""
    return ACT_BYTES * v.out_channels * height * width * frames
