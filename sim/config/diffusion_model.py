"""Schema and checks of a diffusion pipeline under ``model=`` (``kind: diffusion``): its text
encoders, its diffusion transformer (DiT) and its VAE, with the fields of the published
Hugging Face configs (``transformer/config.json``, ``vae/config.json``, the text encoders')."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from sim.config.common import positive
from sim.errors import ConfigError

GUIDANCE = ("cfg", "distilled", "none")  # sim.diffusion.job.GUIDANCE_MODES
ENCODER_KINDS = ("encoder", "decoder")


@dataclass
class TextEncoderConfig:
    """One text encoder: a transformer run once over the prompt's tokens.

    ``kind: encoder`` is a bidirectional encoder (T5, umT5, CLIP's text tower);
    ``decoder`` an LLM whose hidden states serve as the text embedding (HunyuanVideo's
    LLaVA-Llama-3-8B). ``gated`` FFNs have two input projections (gated-GELU, SwiGLU).
    """

    name: str = "???"
    hf_id: str = ""
    kind: str = "encoder"
    layers: int = 24
    hidden: int = 4096
    heads: int = 64
    kv_heads: int = 0  # 0: as many as heads
    head_dim: int = 64
    ffn: int = 10240
    gated: bool = True
    tokens: int = 512  # tokens the encoder runs over (padded prompt length)


@dataclass
class DiTConfig:
    """The diffusion transformer, by block kind (their operators: ``sim.diffusion.dit``).

    - ``double_layers``: joint attention over image and text tokens with a weight set per
      stream (MMDiT; Flux and HunyuanVideo "double-stream" blocks);
    - ``single_layers``: single-stream blocks over the joined tokens, attention and MLP in
      parallel from one fused input projection (Flux, HunyuanVideo);
    - ``cross_layers``: self-attention over the latent, cross-attention to the text (Wan);
    - ``shared_layers``: joint attention with one weight set for both streams (CogVideoX).
    """

    hf_id: str = ""
    architecture: str = ""  # transformer/config.json "_class_name"
    double_layers: int = 0
    single_layers: int = 0
    cross_layers: int = 0
    shared_layers: int = 0
    heads: int = 24
    head_dim: int = 128
    ffn: int = 12288  # MLP inner width
    patch_size: int = 2  # latent pixels per token side
    patch_size_t: int = 1  # latent frames per token
    latent_channels: int = 16
    text_tokens: int = 512  # text tokens the DiT attends to (joint or cross)
    text_dim: int = 4096  # width of the text embedding the context embedder maps
    modulation_dim: int = 0  # input width of the adaLN modulation GEMMs (0: the hidden size)
    shared_modulation: bool = False  # one modulation GEMM per pass (Wan), not one per block

    @property
    def hidden(self) -> int:
        """Width of the residual stream: heads × head dim."""
        return self.heads * self.head_dim

    @property
    def layers(self) -> int:
        """Transformer blocks of every kind."""
        return self.double_layers + self.single_layers + self.cross_layers + self.shared_layers


@dataclass
class VAEConfig:
    """The VAE's compression and its decoder's layout (``vae/config.json``).

    The decoder is ``conv_in`` (latent → ``mid_channels``), a mid block (two ResNet blocks
    around one self-attention), then one up level per entry of ``up_channels`` (deepest first)
    of ``resnets_per_level`` ResNet blocks (two 3×3 convolutions each, 3×3×3 causal ones when
    ``conv3d``; a 1×1 shortcut where the channels change), each level followed, where its
    flags say, by a ×2 spatial and/or temporal up-sampling and a convolution; then
    ``conv_out``.
    """

    hf_id: str = ""
    architecture: str = ""
    spatial_compression: int = 8
    temporal_compression: int = 1
    latent_channels: int = 16
    out_channels: int = 3
    conv3d: bool = False
    mid_channels: int = 512
    mid_attention: bool = True  # the mid block's self-attention (per latent frame)
    up_channels: list[int] = field(default_factory=lambda: [512, 512, 256, 128])
    resnets_per_level: int = 3
    spatial_upsample: list[bool] = field(default_factory=lambda: [True, True, True, False])
    temporal_upsample: list[bool] = field(default_factory=lambda: [False, False, False, False])
    # tiled decode (sim.diffusion.vae.decode_tiles): tiles of tile_px x tile_px pixels every
    # tile_stride_px pixels, and of tile_frames frames every tile_stride_frames frames, as the
    # reference code cuts the latent (0: untiled; a stride of 0: the tile, no overlap)
    tile_px: int = 0
    tile_stride_px: int = 0
    tile_frames: int = 0
    tile_stride_frames: int = 0
    # independent: every tile decoded on its own, the overlaps twice (HunyuanVideo); cached:
    # chunks of frames decoded in turn with a causal feature cache, the work of the whole
    # latent (Wan, CogVideoX), the memory of a chunk
    tile_mode: str = "independent"
    # the 3D convolutions' memory layout (sim.diffusion.vae): channels_first (PyTorch's
    # default NCDHW, what the reference VAEs run: cuDNN's CUDA-core kernels, the calibrated
    # class of kernels/conv3d.yaml) or channels_last (NDHWC: tensor-core implicit GEMMs)
    conv3d_layout: str = "channels_first"
    # the channels-first class's efficiency, a fraction of hardware.fp32_flops; null: the
    # fitted one (python -m calibration fit-vae-conv3d)
    conv3d_efficiency: float | None = None
    # the mid block's attention over every latent frame of the decoded tile under a
    # frame-causal mask (the causal 3D VAEs), not over each frame alone
    mid_attention_joint: bool = False
    # the frame-causal mask built by a Python loop of one indexed fill per query row (the
    # official HunyuanVideo VAE's prepare_causal_attention_mask); each row costs a kernel
    # launch of host time
    causal_mask_loop: bool = False


EXECUTION_MODES = ("eager", "compiled")


@dataclass
class DiffusionPipelineConfig:
    """A text-to-image or text-to-video pipeline: encoders → ``steps`` × guidance passes of the
    DiT → VAE decode, with the defaults its model card and diffusers pipeline use."""

    text_encoders: list[TextEncoderConfig] = field(default_factory=list)
    dit: DiTConfig = field(default_factory=DiTConfig)
    vae: VAEConfig = field(default_factory=VAEConfig)
    height: int = 1024  # default output size
    width: int = 1024
    frames: int = 1  # 1: an image pipeline
    steps: int = 50
    guidance: str = "cfg"  # cfg: 2 DiT passes per step; distilled / none: 1
    # the DiT's attention kernel (sim.cost.attention_kernels): fa2, fa3, sdpa_flash, ...;
    # calibrated: the backend's fitted encoder-attention tables
    attention_impl: str = "calibrated"
    # the kernel's SM part on the GPU it was measured on (sim.cost.attention_kernels); null:
    # the fitted one (python -m calibration fit-attention-split)
    attention_sm_share: float | None = None
    # eager (PyTorch ops dispatched one by one from Python) or compiled (torch.compile):
    # sim.diffusion.execution
    execution: str = "eager"
    # eager costs (sim.diffusion.execution); null: the hardware calibration's fitted ones
    eager_launch_us: float | None = None  # host dispatch time per kernel launch
    eager_unfused: float | None = None  # eager elementwise kernels and passes per fused one
    # stages as the reference code runs them (sim.diffusion.memory, sim.diffusion.cost):
    vae_parallel: bool = False  # the decode split over the gang (xDiT --use_parallel_vae)
    fsdp: bool = False  # DiT and text encoders sharded over the gang (Wan --dit/--t5_fsdp)
    offload: str = "none"  # none | model: one sub-model on the GPU at a time (CPU offload)


def _non_negative_ints(prefix: str, obj) -> None:
    for f in fields(obj):
        v = getattr(obj, f.name)
        if isinstance(v, int) and not isinstance(v, bool) and v < 0:
            raise ConfigError(f"{prefix}.{f.name}", v, "must be >= 0")


def check_diffusion_pipeline(p: DiffusionPipelineConfig, prefix: str = "model.diffusion") -> None:
    """Range and cross-field checks of a pipeline, each naming its field: every count, width
    and factor the cost divides by or shapes a tensor with is positive, the VAE's levels
    match its compression, the guidance mode is known, and the default output size is one
    the VAE and the patching can make. (No text encoder at all is valid: the encode stage
    then takes no time.)"""
    for i, e in enumerate(p.text_encoders):
        pre = f"{prefix}.text_encoders[{i}]"
        _non_negative_ints(pre, e)
        if e.kind not in ENCODER_KINDS:
            raise ConfigError(f"{pre}.kind", e.kind, f"one of {list(ENCODER_KINDS)}")
        for f in ("layers", "hidden", "heads", "head_dim", "ffn", "tokens"):
            positive(f"{pre}.{f}", getattr(e, f))
        if e.kv_heads and e.heads % e.kv_heads:
            raise ConfigError(f"{pre}.kv_heads", e.kv_heads, f"must divide heads={e.heads}")
    from sim.cost.attention_kernels import check_impl, check_sm_share  # sim.cost imports sim.config

    check_impl(f"{prefix}.attention_impl", p.attention_impl)
    check_sm_share(f"{prefix}.attention_sm_share", p.attention_sm_share)
    if p.execution not in EXECUTION_MODES:
        raise ConfigError(f"{prefix}.execution", p.execution, f"one of {list(EXECUTION_MODES)}")
    if p.offload not in ("none", "model"):
        raise ConfigError(f"{prefix}.offload", p.offload, "one of ['none', 'model']")
    if p.eager_launch_us is not None and not p.eager_launch_us >= 0:
        raise ConfigError(f"{prefix}.eager_launch_us", p.eager_launch_us, "must be >= 0")
    if p.eager_unfused is not None and not p.eager_unfused >= 1:
        raise ConfigError(f"{prefix}.eager_unfused", p.eager_unfused, "must be >= 1")
    d, v = p.dit, p.vae
    _non_negative_ints(f"{prefix}.dit", d)
    _non_negative_ints(f"{prefix}.vae", v)
    if d.layers < 1:
        raise ConfigError(f"{prefix}.dit.double_layers", d.double_layers,
                          "the DiT needs at least one block (double, single, cross or shared)")
    for f in ("heads", "head_dim", "ffn", "patch_size", "patch_size_t", "latent_channels",
              "text_tokens", "text_dim"):
        positive(f"{prefix}.dit.{f}", getattr(d, f))
    for f in ("spatial_compression", "temporal_compression", "latent_channels", "out_channels",
              "mid_channels", "resnets_per_level"):
        positive(f"{prefix}.vae.{f}", getattr(v, f))
    n = len(v.up_channels)
    if n < 1 or any(c < 1 for c in v.up_channels):
        raise ConfigError(f"{prefix}.vae.up_channels", list(v.up_channels),
                          "one positive channel count per up level")
    for f in ("spatial_upsample", "temporal_upsample"):
        flags = list(getattr(v, f))
        if len(flags) != n:
            raise ConfigError(f"{prefix}.vae.{f}", flags, f"one flag per up level ({n})")
    _check_tiles(v, f"{prefix}.vae")
    if 2 ** sum(map(bool, v.spatial_upsample)) != v.spatial_compression:
        raise ConfigError(f"{prefix}.vae.spatial_upsample", list(v.spatial_upsample),
                          f"2^(levels that up-sample) must equal spatial_compression="
                          f"{v.spatial_compression}")
    if 2 ** sum(map(bool, v.temporal_upsample)) != v.temporal_compression:
        raise ConfigError(f"{prefix}.vae.temporal_upsample", list(v.temporal_upsample),
                          f"2^(levels that up-sample in time) must equal temporal_compression="
                          f"{v.temporal_compression}")
    if p.guidance not in GUIDANCE:
        raise ConfigError(f"{prefix}.guidance", p.guidance, f"one of {list(GUIDANCE)}")
    for f in ("height", "width", "frames", "steps"):
        positive(f"{prefix}.{f}", getattr(p, f))
    _check_default_size(p, prefix)


CONV3D_LAYOUTS = ("channels_first", "channels_last")
TILE_MODES = ("independent", "cached")


def _check_tiles(v: VAEConfig, prefix: str) -> None:
    """A tile is whole latent pixels (frames) and its stride no longer than the tile; the mid
    attention's flags agree; the 3D convolutions' layout and efficiency are ones the cost model
    knows."""
    for tile, stride, unit in (("tile_px", "tile_stride_px", v.spatial_compression),
                               ("tile_frames", "tile_stride_frames", v.temporal_compression)):
        size, step = getattr(v, tile), getattr(v, stride)
        if size % unit:
            raise ConfigError(f"{prefix}.{tile}", size, f"a multiple of the compression {unit}")
        if step % unit or step > size or (step and not size):
            raise ConfigError(f"{prefix}.{stride}", step, f"a multiple of {unit} of at most "
                              f"{tile}={size} (0: the tile)")
    if v.mid_attention_joint and not v.mid_attention:
        raise ConfigError(f"{prefix}.mid_attention_joint", v.mid_attention_joint,
                          "needs mid_attention=true (the attention it shapes)")
    if v.causal_mask_loop and not v.mid_attention_joint:
        raise ConfigError(f"{prefix}.causal_mask_loop", v.causal_mask_loop,
                          "needs mid_attention_joint=true (the mask is the joint attention's)")
    if v.tile_mode not in TILE_MODES:
        raise ConfigError(f"{prefix}.tile_mode", v.tile_mode, f"one of {list(TILE_MODES)}")
    if v.conv3d_layout not in CONV3D_LAYOUTS:
        raise ConfigError(f"{prefix}.conv3d_layout", v.conv3d_layout,
                          f"one of {list(CONV3D_LAYOUTS)}")
    if v.conv3d_efficiency is not None and not 0 < v.conv3d_efficiency <= 1:
        raise ConfigError(f"{prefix}.conv3d_efficiency", v.conv3d_efficiency,
                          "a fraction of the FP32 peak in (0, 1]")


def _check_default_size(p: DiffusionPipelineConfig, prefix: str) -> None:
    """The default job's size must be one the pipeline can make (``sim.diffusion.pipeline``'s
    ``check_shape`` for a job's own size)."""
    side = p.vae.spatial_compression * p.dit.patch_size
    for f in ("height", "width"):
        if getattr(p, f) % side:
            raise ConfigError(f"{prefix}.{f}", getattr(p, f),
                              f"a multiple of {side} (VAE factor {p.vae.spatial_compression} "
                              f"× patch size {p.dit.patch_size})")
    t = p.vae.temporal_compression
    if (p.frames - 1) % t:
        raise ConfigError(f"{prefix}.frames", p.frames,
                          f"1 + a multiple of {t} (the VAE compresses time {t}x after the "
                          "first frame)")
