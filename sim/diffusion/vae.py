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

A tiled decode (``tile_px``, ``tile_frames``: ``decode_tiles``) runs the decoder once per tile
of the latent, cut as the reference code cuts it: tiles of ``tile_px / compression`` latent
pixels starting every ``tile_stride_px / compression`` along each axis (the last ones cut at
the edge), and of ``tile_frames / compression`` latent frames plus the causal one before them
starting every ``tile_stride_frames / compression``; the overlaps are decoded twice and
blended (the blend's few elementwise passes are not priced).

A 3D convolution in channels-first layout (``conv3d_layout``, the reference VAEs') is priced
by its calibrated CUDA-core class (``sim.cost.conv3d``): ``flops / (fp32_flops ×
efficiency)`` against the same traffic; channels-last ones as tensor-core GEMMs. The causal
3D VAEs' mid-block attention runs over every latent frame of the tile at once under a
frame-causal additive mask (``mid_attention_joint``: all scores computed), and the official
HunyuanVideo VAE builds that mask with a Python loop of one indexed fill per query row
(``causal_mask_loop``: the ``vae.causal_mask_loop`` operator, ``rows × launch_s`` of host
time, the eager per-launch dispatch time of ``sim.cost.eager``).

On ``g`` GPUs the decode splits by images when the job has at least ``g`` of them, else each
image into ``g / images`` horizontal strips that each decode ``HALO_LATENT_ROWS`` extra latent
rows on each inner edge (the receptive field they need; recomputed, not exchanged), then
the strips are all-gathered.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections import Counter

from sim.config.diffusion_model import VAEConfig
from sim.cost.base import OperatorCost
from sim.cost.conv3d import conv3d_efficiency
from sim.cost.eta import evaluate
from sim.cost.gemm import gemm_axes, roofline
from sim.cost.pricing import ACT_BYTES, Pricer

HALO_LATENT_ROWS = 4  # latent rows a strip decodes beyond each inner edge (an estimate)
DTYPE = "bfloat16"


def conv_op(pricer: Pricer, name: str, m: float, c_in: int, c_out: int,
            volume: int, cuda_core_eta: float | None = None) -> OperatorCost:
    """One convolution as an implicit GEMM on the roofline (module doc): on the tensor cores,
    or with ``cuda_core_eta`` on the CUDA cores at that fraction of ``hardware.fp32_flops``
    (the channels-first 3D class)."""
    e = pricer.eff.gemm[DTYPE]
    k = c_in * volume
    flops = 2.0 * m * c_out * k
    nbytes = ACT_BYTES * (m * c_in + m * c_out + k * c_out)
    eta_c, eta_m = evaluate((e.compute, e.memory), gemm_axes(float(m), float(c_out), float(k),
                                                             e.align_m))
    peak = pricer.peak(DTYPE)
    if cuda_core_eta is not None:
        peak, eta_c = fp32_peak(pricer), cuda_core_eta
    t, cb = roofline(flops, nbytes, peak, pricer.hw.hbm_bandwidth, eta_c, eta_m, e.launch_s)
    return OperatorCost(name, 1, flops, nbytes, float(t), "compute" if cb else "memory",
                        "fp32" if cuda_core_eta is not None else DTYPE)


def fp32_peak(pricer: Pricer) -> float:
    """The CUDA cores' FP32 FMA rate (``hardware.fp32_flops``; 0 where unknown)."""
    return float(getattr(pricer.hw, "fp32_flops", 0.0) or 0.0)


def channels_first_3d(v: VAEConfig) -> bool:
    """Whether the VAE's convolutions are channels-first 3D ones (the CUDA-core class)."""
    return v.conv3d and v.conv3d_layout == "channels_first"


def runs_mask_loop(v: VAEConfig) -> bool:
    """Whether the decode builds a frame-causal mask with the Python loop (module doc)."""
    return v.mid_attention and v.mid_attention_joint and v.causal_mask_loop


def cuda_core_class(pricer: Pricer, v: VAEConfig) -> float | None:
    """The CUDA-core efficiency the VAE's convolutions run at (None: tensor-core GEMMs):
    channels-first 3D convolutions on a GPU whose FP32 peak is known (else tensor-core GEMMs,
    with a warning once)."""
    if not channels_first_3d(v):
        return None
    if not fp32_peak(pricer):
        _warn_no_fp32(pricer.hw.name)
        return None
    return conv3d_efficiency(pricer.hw.calibration, v.conv3d_efficiency)


@functools.cache
def _warn_no_fp32(gpu: str) -> None:
    warnings.warn(f"hardware {gpu!r} has no fp32_flops: its channels-first 3D convolutions "
                  "are priced as tensor-core GEMMs (hardware.fp32_flops sets the CUDA cores' "
                  "rate)", stacklevel=3)


def axis_tiles(length: int, tile: int, stride: int, extra: int = 0) -> list[int]:
    """Sizes of the tiles the reference code cuts an axis of ``length`` latent units into:
    one every ``stride`` from 0, ``tile + extra`` long, the last ones cut at the edge."""
    return [min(tile + extra, length - start) for start in range(0, length, stride or tile)]


def decode_tiles(v: VAEConfig, frames: int, height: int, width: int
                 ) -> list[tuple[int, tuple[int, int, int]]]:
    """``(count, (frames, height, width))`` of the latent tiles the decoder runs on (module
    doc), largest first: time is tiled where the latent has more frames than a tile, space
    where either side is longer than a tile (then both axes), as HunyuanVideo's
    ``temporal_tiled_decode`` and ``spatial_tiled_decode`` do; an independent temporal tile of a
    causal video VAE also decodes the latent frame before it. An untiled VAE decodes the
    latent whole; a ``cached`` one in chunks whose work adds up to the whole latent's
    (``compute_tiles``)."""
    sc, tc = v.spatial_compression, v.temporal_compression
    ts, tt = v.tile_px // sc, v.tile_frames // tc
    times = [frames]
    if tt and frames > tt:
        extra = 1 if tc > 1 and v.tile_mode == "independent" else 0
        times = axis_tiles(frames, tt, v.tile_stride_frames // tc, extra)
    rows, cols = [height], [width]
    if ts and (height > ts or width > ts):
        rows = axis_tiles(height, ts, v.tile_stride_px // sc)
        cols = axis_tiles(width, ts, v.tile_stride_px // sc)
    tiles = Counter((t, h, w) for t in times for h in rows for w in cols)
    return sorted(((n, shape) for shape, n in tiles.items()), key=lambda x: x[1], reverse=True)


def upsampled_frames(v: VAEConfig, frames: int) -> int:
    """Frames one temporal ×2 up-sampling makes of ``frames``: ``2t − 1`` for a causal decode
    of its own (the first frame alone), ``2t`` for a cached chunk (its cache holds the
    frames before it)."""
    return 2 * frames if v.tile_mode == "cached" and v.tile_frames else 2 * frames - 1


def compute_tiles(v: VAEConfig, frames: int, height: int, width: int
                  ) -> list[tuple[int, tuple[int, int, int]]]:
    """The tiles whose decoder work a decode costs: ``decode_tiles``, or the whole latent
    where a cache carries the chunks (``tile_mode: cached``)."""
    if v.tile_mode == "cached":
        return [(1, (frames, height, width))]
    return decode_tiles(v, frames, height, width)


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


def decode_ops(pricer: Pricer, v: VAEConfig, frames: int, height: int, width: int,
               launch_s: float = 0.0) -> list[OperatorCost]:
    """Decode of one latent of ``frames × height × width`` on one GPU, tile by tile
    (``decode_tiles``), one row per kind of layer; ``launch_s`` prices the host's mask loop."""
    eta = cuda_core_class(pricer, v)
    ops: list[OperatorCost] = []
    for n, (t, h, w) in compute_tiles(v, frames, height, width):
        ops += [op.scaled(n) for op in _decoder_ops(pricer, v, t, h, w, eta, launch_s)]
    return merge(ops)


def _decoder_ops(pricer: Pricer, v: VAEConfig, frames: int, height: int, width: int,
                 eta: float | None, launch_s: float) -> list[OperatorCost]:
    """One decoder call on a latent of ``frames × height × width``."""
    vol = 27 if v.conv3d else 9
    ops: list[OperatorCost] = []
    t, h, w = frames, height, width

    def conv(name: str, c_in: int, c_out: int, volume: int = vol) -> None:
        ops.append(conv_op(pricer, name, t * h * w, c_in, c_out, volume, eta))

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
        if v.mid_attention_joint:  # every frame's pixels at once, the causal mask added
            ops.append(pricer.encoder_attention("vae.mid_attention", 1, t * h * w, t * h * w,
                                                1, c))
            if runs_mask_loop(v):
                rows = t * h * w
                ops.append(OperatorCost("vae.causal_mask_loop", rows, 0.0, 0.0,
                                        rows * launch_s, "host"))
        else:
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
    return ops


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
