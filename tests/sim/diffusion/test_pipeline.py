"""Diffusion pipelines as models: the shipped YAMLs, the latent-token formula checked by hand
against each model's published config, and the size checks."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from sim.config.diffusion_model import check_diffusion_pipeline
from sim.diffusion.job import JobShape
from sim.diffusion.pipeline import MODEL_DIR, check_shape, load_pipeline, resolve, with_defaults
from sim.errors import ConfigError

# (model, height, width, frames): tokens by hand = latent frames × (H / (8·2)) × (W / (8·2))
# with latent frames = (frames − 1) / 4 + 1 for the video VAEs (temporal factor 4)
HAND_TOKENS = {
    "flux1_dev": ((1024, 1024, 1), (1024 // 16) * (1024 // 16)),  # 4096
    "flux1_schnell": ((1024, 1024, 1), 64 * 64),
    "sd35_large": ((1024, 1024, 1), 64 * 64),
    "hunyuan_video": ((720, 1280, 129), 45 * 80 * 33),  # 118,800
    "wan21_t2v_14b": ((720, 1280, 81), 45 * 80 * 21),  # 75,600
    "cogvideox_5b": ((480, 720, 49), 30 * 45 * 13),  # 17,550
}
# published transformer configs: blocks, heads × head dim (hidden)
PUBLISHED = {
    "flux1_dev": (19 + 38, 24 * 128), "flux1_schnell": (19 + 38, 3072),
    "sd35_large": (38, 38 * 64), "hunyuan_video": (20 + 40, 24 * 128),
    "wan21_t2v_14b": (40, 5120), "cogvideox_5b": (42, 48 * 64),
}


@pytest.mark.parametrize("name", sorted(HAND_TOKENS))
def test_default_latent_tokens_by_hand(name):
    pipe = load_pipeline(name)
    (h, w, f), tokens = HAND_TOKENS[name]
    assert (pipe.height, pipe.width, pipe.frames) == (h, w, f)
    job = resolve(JobShape(name, h, w, f), pipe)
    assert job.image_tokens == tokens
    layers, hidden = PUBLISHED[name]
    assert (pipe.dit.layers, pipe.dit.hidden) == (layers, hidden)


def test_hunyuan_worked_example():
    job = resolve(JobShape("hunyuan_video", 720, 1280, 129), load_pipeline("hunyuan_video"))
    assert (job.latent_frames, job.latent_height, job.latent_width) == (33, 90, 160)
    assert job.image_tokens == 118_800


def test_defaults_for_steps_and_guidance():
    schnell = resolve(JobShape("flux1_schnell", 1024, 1024), load_pipeline("flux1_schnell"))
    assert (schnell.steps, schnell.guidance, schnell.passes) == (4, "none", 1)
    assert schnell.steps <= 8  # a few-step model
    sd = resolve(JobShape("sd35_large", 1024, 1024), load_pipeline("sd35_large"))
    assert (sd.steps, sd.guidance, sd.passes) == (28, "cfg", 2)
    dev = resolve(JobShape("flux1_dev", 512, 768, steps=20, guidance="cfg"),
                  load_pipeline("flux1_dev"))
    assert (dev.steps, dev.passes, dev.image_tokens) == (20, 2, 32 * 48)


def test_with_defaults_fills_only_unset_fields():
    wan = load_pipeline("wan21_t2v_14b")
    assert with_defaults(JobShape("wan21_t2v_14b", 0, 0, 0, images=2), wan) == JobShape(
        "wan21_t2v_14b", 720, 1280, 81, 50, 2, "cfg")
    own = JobShape("wan21_t2v_14b", 480, 832, 33, 30, 1, "none")
    assert with_defaults(own, wan) == own


@pytest.mark.parametrize("field,value,named", [
    ("height", 1000, "height"), ("frames", 2, "frames"), ("steps", 0, "steps"),
])
def test_pipeline_default_job_must_be_makeable(field, value, named):
    pipe = load_pipeline("hunyuan_video")
    setattr(pipe, field, value)
    with pytest.raises(ConfigError) as e:
        check_diffusion_pipeline(pipe)
    assert e.value.field == f"model.diffusion.{named}" and e.value.value == value


@pytest.mark.parametrize("name,h,w,f,field", [
    ("flux1_dev", 1000, 1024, 1, "job.height"),  # not a multiple of 8 × 2
    ("sd35_large", 1024, 1032, 1, "job.width"),
    ("hunyuan_video", 720, 1280, 128, "job.frames"),  # 128 − 1 is no multiple of 4
    ("flux1_dev", 1024, 1024, 5, "job.frames"),  # an image pipeline
    ("wan21_t2v_14b", 0, 1280, 81, "job.height"),
])
def test_bad_sizes_name_the_field(name, h, w, f, field):
    with pytest.raises(ConfigError) as e:
        check_shape(name, load_pipeline(name), h, w, f)
    assert e.value.field == field
    assert "VAE factor" in str(e.value) or "frames" in field


def test_bad_guidance_and_images():
    pipe = load_pipeline("flux1_dev")
    with pytest.raises(ConfigError) as e:
        resolve(JobShape("flux1_dev", 1024, 1024, guidance="double"), pipe)
    assert e.value.field == "job.guidance"
    with pytest.raises(ConfigError) as e:
        resolve(JobShape("flux1_dev", 1024, 1024, images=0), pipe)
    assert e.value.field == "job.images"


def test_load_pipeline_refuses_unknown_and_llm_names():
    with pytest.raises(ConfigError) as e:
        load_pipeline("no_such_model")
    assert e.value.field == "model" and "flux1_dev" in str(e.value)
    with pytest.raises(ConfigError, match="not an LLM"):
        load_pipeline("llama3_8b")


def test_pipeline_checks_name_fields():
    pipe = load_pipeline("flux1_dev")
    pipe.vae.spatial_upsample = [True, True, False, False]  # 4x, not the 8x it compresses
    with pytest.raises(ConfigError) as e:
        check_diffusion_pipeline(pipe)
    assert e.value.field == "model.diffusion.vae.spatial_upsample"
    pipe = load_pipeline("sd35_large")
    pipe.guidance = "double"
    with pytest.raises(ConfigError) as e:
        check_diffusion_pipeline(pipe)
    assert e.value.field == "model.diffusion.guidance"


def test_models_compose_under_hydra_and_llms_are_unchanged(compose_cfg):
    flux = OmegaConf.to_object(compose_cfg("model=flux1_dev").model)
    assert flux.kind == "diffusion" and flux.diffusion == load_pipeline("flux1_dev")
    llama = OmegaConf.to_object(compose_cfg("model=llama3_8b").model)
    assert llama.kind == "llm" and llama.diffusion is None
    assert (llama.num_hidden_layers, llama.hidden_size) == (32, 4096)


def test_every_diffusion_yaml_cites_its_source():
    for name in HAND_TOKENS:
        text = (MODEL_DIR / f"{name}.yaml").read_text()
        assert "kind: diffusion" in text and "config.json" in text


def test_a_model_kind_must_be_known_and_a_pipeline_needs_its_block():
    from sim.config.model import ModelConfig, check_model
    with pytest.raises(ConfigError, match="model.kind"):
        check_model(ModelConfig(kind="gan"))
    with pytest.raises(ConfigError, match="model.diffusion"):
        check_model(ModelConfig(kind="diffusion"))
