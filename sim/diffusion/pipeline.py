"""A diffusion pipeline by name, and what a job asks of it: the latent grid and token count of
its output size, its steps and guidance passes.

Latent tokens (docs/diffusion.md): a VAE with spatial factor ``s`` and temporal factor ``t``
and a DiT with patch ``p`` (and temporal patch ``p_t``) turn ``frames × height × width``
pixels into ``F' × (height / s) × (width / s)`` latent pixels, with ``F' = (frames − 1) / t + 1``
(the causal video VAEs keep the first frame on its own; ``F' = 1`` for an image), and into

    tokens = ⌈F' / p_t⌉ · (height / (s·p)) · (width / (s·p))

DiT tokens. ``height`` and ``width`` must be multiples of ``s·p``; a video's ``frames − 1`` a
multiple of ``t``; an image pipeline takes one frame.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

from omegaconf import OmegaConf

import conf
from sim.config.diffusion_model import DiffusionPipelineConfig, check_diffusion_pipeline
from sim.config.model import ModelConfig
from sim.diffusion.job import GUIDANCE_MODES, JobShape
from sim.errors import ConfigError

MODEL_DIR = Path(conf.__file__).resolve().parent / "model"


def load_pipeline(name: str) -> DiffusionPipelineConfig:
    """The pipeline of ``conf/model/<name>.yaml`` (``kind: diffusion``), checked.

    Raises ``ConfigError`` naming ``model`` for a name without a YAML or an LLM's YAML.
    """
    path = MODEL_DIR / f"{name}.yaml"
    if not name or not path.is_file():
        known = sorted(p.stem for p in MODEL_DIR.glob("*.yaml")
                       if "kind: diffusion" in p.read_text())
        raise ConfigError("model", name, f"a diffusion pipeline of conf/model/: one of {known}")
    raw = OmegaConf.load(path)
    raw.pop("defaults", None)
    m: ModelConfig = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), raw))
    if m.kind != "diffusion" or m.diffusion is None:
        raise ConfigError("model", name, "a diffusion pipeline (kind: diffusion), not an LLM")
    check_diffusion_pipeline(m.diffusion, f"model({name}).diffusion")
    return m.diffusion


@dataclass(frozen=True)
class Job:
    """A job shape resolved against its pipeline: defaults filled in, latent grid and tokens."""

    name: str
    pipe: DiffusionPipelineConfig
    height: int
    width: int
    frames: int
    latent_frames: int  # F'
    latent_height: int
    latent_width: int
    image_tokens: int  # DiT tokens of one image or video
    steps: int
    images: int
    guidance: str

    @property
    def passes(self) -> int:
        """DiT passes per step and image: 2 under classifier-free guidance, else 1."""
        return 2 if self.guidance == "cfg" else 1

    @property
    def text_tokens(self) -> int:
        """Text tokens the DiT attends to."""
        return self.pipe.dit.text_tokens

    @property
    def latent_bytes(self) -> int:
        """Bytes of one image's latent (or noise prediction) in bf16."""
        return 2 * self.pipe.dit.latent_channels * (self.latent_frames * self.latent_height
                                                     * self.latent_width)


def latent_frames(frames: int, temporal_compression: int) -> int:
    """Latent frames of ``frames`` output frames: ``(frames − 1) / t + 1``."""
    return (frames - 1) // temporal_compression + 1


def latent_tokens(pipe: DiffusionPipelineConfig, height: int, width: int, frames: int = 1) -> int:
    """DiT tokens of one ``frames × height × width`` output (module doc), unchecked."""
    d, v = pipe.dit, pipe.vae
    side = v.spatial_compression * d.patch_size
    f = latent_frames(frames, v.temporal_compression)
    return math.ceil(f / d.patch_size_t) * (height // side) * (width // side)


# far beyond any pipeline's use (samplers take 1-1,000 steps, videos a few hundred frames):
# bounds that keep a job's FLOP counts finite, not limits of a model
MAX_STEPS = 100_000
MAX_IMAGES = 10_000
MAX_SIDE = 65_536
MAX_FRAMES = 100_000


def check_shape(name: str, pipe: DiffusionPipelineConfig, height: int, width: int, frames: int,
                prefix: str = "job") -> None:
    """Refuse a size the VAE and patching cannot take, naming ``<prefix>.height`` etc."""
    v, d = pipe.vae, pipe.dit
    side = v.spatial_compression * d.patch_size
    for field, value in (("height", height), ("width", width)):
        if value > MAX_SIDE:
            raise ConfigError(f"{prefix}.{field}", value, f"at most {MAX_SIDE:,} pixels")
        if value < 1 or value % side:
            raise ConfigError(f"{prefix}.{field}", value,
                              f"a positive multiple of {side} for {name} (VAE factor "
                              f"{v.spatial_compression} × patch size {d.patch_size})")
    if not 1 <= frames <= MAX_FRAMES:
        raise ConfigError(f"{prefix}.frames", frames, f"a whole number in [1, {MAX_FRAMES:,}]")
    video = pipe.frames > 1 or v.temporal_compression > 1
    if not video and frames != 1:
        raise ConfigError(f"{prefix}.frames", frames, f"1: {name} makes images")
    if (frames - 1) % v.temporal_compression:
        t = v.temporal_compression
        raise ConfigError(f"{prefix}.frames", frames,
                          f"1 + a multiple of {t} for {name} (its VAE compresses time {t}x "
                          "after the first frame), e.g. " + f"{1 + t * ((frames - 1) // t)}")


def resolve(shape: JobShape, pipe: DiffusionPipelineConfig, prefix: str = "job") -> Job:
    """``shape`` against ``pipe``: defaults for steps and guidance, checked size, latent grid."""
    check_shape(shape.model, pipe, shape.height, shape.width, shape.frames, prefix)
    if not 0 <= shape.steps <= MAX_STEPS:
        raise ConfigError(f"{prefix}.steps", shape.steps,
                          f"a whole number in [0, {MAX_STEPS:,}] (0: the default)")
    if not 1 <= shape.images <= MAX_IMAGES:
        raise ConfigError(f"{prefix}.images", shape.images,
                          f"a whole number in [1, {MAX_IMAGES:,}]")
    guidance = shape.guidance or pipe.guidance
    if guidance not in GUIDANCE_MODES:
        raise ConfigError(f"{prefix}.guidance", shape.guidance,
                          f"'' (the pipeline's default) or one of {list(GUIDANCE_MODES)}")
    v = pipe.vae
    return Job(shape.model, pipe, shape.height, shape.width, shape.frames,
               latent_frames(shape.frames, v.temporal_compression),
               shape.height // v.spatial_compression, shape.width // v.spatial_compression,
               latent_tokens(pipe, shape.height, shape.width, shape.frames),
               shape.steps or pipe.steps, shape.images, guidance)


def with_defaults(shape: JobShape, pipe: DiffusionPipelineConfig) -> JobShape:
    """``shape`` with its unset fields taken from ``pipe``: height, width, frames and steps
    where 0, guidance where ``""`` (model and images as given; nothing is checked)."""
    return replace(shape, height=shape.height or pipe.height, width=shape.width or pipe.width,
                   frames=shape.frames or pipe.frames, steps=shape.steps or pipe.steps,
                   guidance=shape.guidance or pipe.guidance)
