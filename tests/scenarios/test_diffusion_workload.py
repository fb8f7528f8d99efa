"""Diffusion workloads: the schema, fixed shapes, mixes, classes, seeds, the mixed workload,
and LLM workloads left as they were (trace replay: ``test_diffusion_trace.py``)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf
from scipy import stats

from scenarios import WorkloadConfig, WorkloadError, build_requests, check_workload
from scenarios.diffusion import JOB_COLUMNS, build_jobs
from scenarios.diffusion_config import (
    GUIDANCE_MODES,
    JobShapeConfig,
    PriorityClassConfig,
    entry_key_error,
)
from sim.diffusion import job as sim_job

CONF = Path(__file__).resolve().parents[2] / "conf"
REPO = CONF.parent
ALIBABA = "alibaba_t2i_diffusion.csv"
P_MIN = 1e-3  # fixed seeds: a chi-square test at this level fails only on a real bias


def jobs(seed: int = 0, run_model: str = "flux1_dev", **kw) -> pd.DataFrame:
    return build_jobs(WorkloadConfig(name="d", kind="diffusion", **kw), run_model, seed)


def compose_workload(name: str, *overrides: str):
    ConfigStore.instance().store(group="workload", name="base_workload", node=WorkloadConfig)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(overrides=[f"+workload={name}", *overrides]).workload


def write(tmp_path, text: str) -> str:
    path = tmp_path / "jobs.csv"
    path.write_text(text)
    return str(path)


# --- schema -------------------------------------------------------------------------------


def test_schema_defaults_are_an_llm_workload_with_the_pipelines_default_shape():
    # 0 size, frames and steps: the pipeline's defaults (a video pipeline makes its video)
    w = WorkloadConfig(name="w")
    assert w.kind == "llm"
    assert (w.model, w.height, w.width, w.frames, w.steps, w.images, w.guidance) == (
        "", 0, 0, 0, 0, 1, "")
    assert w.mix == [] and w.priority_classes == [] and w.diffusion_num_jobs is None
    assert w.trace_types == ["TXT_2_IMG", "IMG_2_IMG"]
    assert w.trace_statuses == ["SUCCEED", "FAILED"]
    entry = JobShapeConfig()
    assert entry.model == "" and entry.height is None and entry.weight == 1.0
    check_workload(w)


def test_job_columns_and_guidance_modes_mirror_the_sim_seam():
    assert JOB_COLUMNS == sim_job.JOB_COLUMNS
    assert GUIDANCE_MODES == sim_job.GUIDANCE_MODES
    shape_fields = {f.name for f in dataclasses.fields(sim_job.JobShape)}
    assert shape_fields == {f.name for f in dataclasses.fields(JobShapeConfig)} - {"weight"}


@pytest.mark.parametrize("kw, field, value", [
    ({"kind": "video"}, "workload.kind", "video"),
    ({"height": -1}, "workload.height", -1),
    ({"width": -8}, "workload.width", -8),
    ({"frames": -1}, "workload.frames", -1),
    ({"steps": -1}, "workload.steps", -1),
    ({"images": 0}, "workload.images", 0),
    ({"height": 512.5}, "workload.height", 512.5),
    ({"guidance": "cfg2"}, "workload.guidance", "cfg2"),
    ({"mix": [JobShapeConfig(weight=0.0)]}, "workload.mix[0].weight", 0.0),
    ({"mix": [JobShapeConfig(), JobShapeConfig(frames=-1)]}, "workload.mix[1].frames", -1),
    ({"mix": [JobShapeConfig(guidance="two")]}, "workload.mix[0].guidance", "two"),
    ({"mix": [JobShapeConfig(weight=math.inf)]}, "workload.mix[0].weight", math.inf),
    ({"priority_classes": [PriorityClassConfig("a"), PriorityClassConfig("a")]},
     "workload.priority_classes[1].name", "a"),
    ({"priority_classes": [PriorityClassConfig("a", weight=-1.0)]},
     "workload.priority_classes[0].weight", -1.0),
    ({"priority_classes": [PriorityClassConfig("a", priority=1.5)]},
     "workload.priority_classes[0].priority", 1.5),
    ({"diffusion_rate": 0.0}, "workload.diffusion_rate", 0.0),
    ({"diffusion_num_jobs": 0}, "workload.diffusion_num_jobs", 0),
    ({"trace_types": ["TXT2IMG"]}, "workload.trace_types[0]", "TXT2IMG"),
    ({"trace_statuses": ["SUCCEED", "OK"]}, "workload.trace_statuses[1]", "OK"),
    ({"kind": "mixed"}, "workload.model", ""),
    ({"kind": "mixed", "model": "flux1_dev", "arrival": "closed_loop"},
     "workload.diffusion_num_jobs", None),
    ({"kind": "mixed", "model": "flux1_dev", "diffusion_rate": 1e-10},
     "workload.diffusion_rate", 1e-10),
])
def test_bad_diffusion_fields_name_the_field(kw, field, value):
    with pytest.raises(WorkloadError) as e:
        check_workload(WorkloadConfig(name="d", **kw))
    assert (e.value.field, e.value.value) == (field, value)
    assert "\n" not in str(e.value)


def test_a_wrong_type_fails_at_compose_time():
    with pytest.raises(Exception, match="height"):
        compose_workload("diffusion", "workload.height=large")


def test_zero_sizes_mean_the_pipelines_defaults_and_pass_the_range_checks():
    check_workload(WorkloadConfig(name="d", kind="diffusion", height=0, width=0, frames=0,
                                  mix=[JobShapeConfig(frames=0, height=0)]))
    df = jobs(num_requests=3, height=0, width=0, frames=0)
    assert (df[["height", "width", "frames"]] == 0).all().all()  # filled in by the simulator


@pytest.mark.parametrize("override, line", [
    ("workload.mix=[{foo: 1}]", "workload.mix[0]: unknown key 'foo'"),
    ("workload.mix=[{steps: 28}, {height: 512, hight: 1}]", "workload.mix[1]: unknown key "
                                                             "'hight'"),
    ("workload.priority_classes=[{name: a, prio: 1}]",
     "workload.priority_classes[0]: unknown key 'prio'"),
])
def test_an_unknown_key_in_an_entry_is_named_with_its_entry(override, line):
    with pytest.raises(Exception) as e:
        compose_workload("diffusion", override)
    text = entry_key_error(e.value, ["workload=diffusion", override])
    assert text.startswith(line) and "; an entry has " in text
    assert entry_key_error(ValueError("other"), [override]) is None
    # a mix set in a YAML (no override to find it in): named as an entry of the list
    assert entry_key_error(e.value, []).startswith("an entry of workload.")


# --- fixed shapes, mixes, classes ---------------------------------------------------------


def test_fixed_shape_every_job_alike_poisson_in_jobs_per_second():
    df = jobs(num_requests=2000, rate=2.0, steps=28, guidance="distilled")
    assert tuple(df.columns) == JOB_COLUMNS
    assert df.dtypes["arrival_time_s"] == np.float64
    assert all(df.dtypes[c] == np.int64 for c in ("height", "width", "frames", "steps",
                                                   "images", "priority"))
    assert (df["model"] == "flux1_dev").all() and (df["guidance"] == "distilled").all()
    assert df[["height", "width", "frames", "steps", "images", "priority"]].drop_duplicates() \
        .values.tolist() == [[0, 0, 0, 28, 1, 0]]  # 0: the pipeline's default, filled in by sim
    gaps = np.diff(df["arrival_time_s"].to_numpy(), prepend=0.0)
    assert (gaps >= 0).all()
    # exponential gaps of mean 1/rate: KS test against the exact distribution
    assert stats.kstest(gaps, "expon", args=(0, 0.5)).pvalue > P_MIN


def test_the_workload_model_overrides_the_runs_model():
    assert set(jobs(num_requests=5, run_model="sd35_large")["model"]) == {"sd35_large"}
    assert set(jobs(num_requests=5, run_model="sd35_large",
                    model="flux1_schnell")["model"]) == {"flux1_schnell"}


def test_mix_proportions_and_inherited_fields():
    mix = [JobShapeConfig(steps=28, weight=6.0),
           JobShapeConfig(steps=50, weight=3.0),
           JobShapeConfig(model="wan21_t2v_14b", height=720, width=1280, frames=81, steps=50,
                          guidance="cfg", weight=1.0)]
    df = jobs(num_requests=5000, mix=mix, height=768, width=768, images=2)
    video = df["model"] == "wan21_t2v_14b"
    images = df.loc[~video]
    assert (images["model"] == "flux1_dev").all() and (images["height"] == 768).all()
    assert (images["frames"] == 0).all() and (images["images"] == 2).all()
    assert (images["guidance"] == "").all()
    assert (df.loc[video, ["height", "width", "frames", "steps", "images"]].values
            == [720, 1280, 81, 50, 2]).all()
    observed = [int((~video & (df["steps"] == steps)).sum()) for steps in (28, 50)]
    observed.append(int(video.sum()))
    assert sum(observed) == 5000
    assert stats.chisquare(observed, np.array([0.6, 0.3, 0.1]) * 5000).pvalue > P_MIN


def test_a_mix_is_drawn_not_cycled():
    df = jobs(num_requests=400, mix=[JobShapeConfig(steps=28), JobShapeConfig(steps=50)])
    runs = 1 + int((np.diff(df["steps"].to_numpy()) != 0).sum())
    # runs test: alternating or blocked assignment would be far outside this
    assert 150 < runs < 250


def test_priority_classes_by_weight():
    classes = [PriorityClassConfig("interactive", weight=1.0, priority=0),
               PriorityClassConfig("batch", weight=3.0, priority=2)]
    df = jobs(num_requests=4000, priority_classes=classes)
    assert list(df.columns) == [*JOB_COLUMNS, "class"]
    assert set(zip(df["class"], df["priority"], strict=True)) == {("interactive", 0),
                                                                   ("batch", 2)}
    observed = df["class"].value_counts()[["interactive", "batch"]].to_numpy()
    assert stats.chisquare(observed, [1000, 3000]).pvalue > P_MIN


def test_gamma_and_closed_loop_arrivals():
    bursty = jobs(num_requests=3000, arrival="gamma", rate=1.0, cv=3.0)
    gaps = np.diff(bursty["arrival_time_s"].to_numpy())
    assert 2.0 < gaps.std() / gaps.mean() < 4.0
    loop = jobs(num_requests=10, arrival="closed_loop", concurrency=3)
    assert list(loop.columns) == [*JOB_COLUMNS, "client", "think_time_s"]
    assert loop["client"].tolist() == [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]
    assert (loop["arrival_time_s"].iloc[:3] == 0.0).all()
    assert loop["arrival_time_s"].iloc[3:].isna().all()


# --- randomness ---------------------------------------------------------------------------


def test_same_seed_same_jobs_other_seed_other_jobs():
    kw = {"num_requests": 300, "mix": [JobShapeConfig(steps=28), JobShapeConfig(steps=50)],
          "priority_classes": [PriorityClassConfig("a"), PriorityClassConfig("b", priority=1)]}
    pd.testing.assert_frame_equal(jobs(seed=11, **kw), jobs(seed=11, **kw))
    a, b = jobs(seed=11, **kw), jobs(seed=12, **kw)
    assert not np.allclose(a["arrival_time_s"], b["arrival_time_s"])
    assert not a["steps"].equals(b["steps"])


def test_a_mix_or_classes_leave_the_arrivals_unchanged():
    plain = jobs(seed=3, num_requests=200)
    mixed = jobs(seed=3, num_requests=200, mix=[JobShapeConfig(steps=4), JobShapeConfig()],
                 priority_classes=[PriorityClassConfig("a"), PriorityClassConfig("b")])
    np.testing.assert_array_equal(plain["arrival_time_s"], mixed["arrival_time_s"])


# --- shipped YAMLs, mixed workload, LLM workloads -----------------------------------------


@pytest.mark.parametrize("name", ["diffusion", "diffusion_mix"])
def test_synthetic_diffusion_yamls_build(name):
    w = compose_workload(name, "workload.num_requests=300")
    assert OmegaConf.get_type(w) is WorkloadConfig
    assert (w.name, w.kind) == (name, "diffusion")
    df = build_jobs(w, "flux1_dev", 0)
    assert len(df) == 300 and tuple(df.columns) == JOB_COLUMNS
    if name == "diffusion":  # the pipeline's defaults, filled in by the simulator
        assert (df[["height", "width", "frames", "steps"]] == 0).all().all()
    if name == "diffusion_mix":
        assert set(df["model"]) == {"flux1_dev", "wan21_t2v_14b"}
        assert set(df["steps"]) == {28, 50}
        video = df["model"] == "wan21_t2v_14b"
        assert (df.loc[video, ["height", "width", "frames"]].values == [720, 1280, 33]).all()
        assert (df.loc[~video, ["height", "width", "frames"]] == 0).all().all()


def test_the_issues_single_video_job_composes():
    w = compose_workload("diffusion", "workload.height=720", "workload.width=1280",
                         "workload.frames=129", "workload.steps=50", "workload.num_requests=1")
    df = build_jobs(w, "hunyuan_video", 0)
    assert df[["model", "height", "width", "frames", "steps", "images"]].values.tolist() == [
        ["hunyuan_video", 720, 1280, 129, 50, 1]]


def test_mixed_workload_yields_requests_and_jobs():
    w = compose_workload("mixed", "workload.num_requests=400")
    assert w.kind == "mixed"
    requests = build_requests(w, np.random.default_rng(0), np.random.default_rng(1))
    assert len(requests) == 400 and "model" not in requests
    df = build_jobs(w, "llama3_8b", 0)
    assert len(df) == math.ceil(400 * w.diffusion_rate / w.rate) == 16
    assert set(df["model"]) == {"flux1_dev"}
    # the job stream is independent of the requests' arrivals (other spawn keys)
    assert not np.allclose(np.diff(df["arrival_time_s"]) * w.diffusion_rate,
                           np.diff(requests["arrival_time_s"].to_numpy()[:16]) * w.rate)
    explicit = build_jobs(OmegaConf.merge(w, {"diffusion_num_jobs": 7}), "llama3_8b", 0)
    assert len(explicit) == 7


def test_llm_requests_ignore_the_diffusion_fields():
    base = {"name": "w", "num_requests": 300}
    plain = WorkloadConfig(**base)
    loaded = WorkloadConfig(**base, kind="mixed", model="flux1_dev", height=720, width=1280,
                            frames=33, steps=50, images=4, guidance="cfg",
                            mix=[JobShapeConfig(steps=4)], diffusion_rate=3.0,
                            priority_classes=[PriorityClassConfig("a")])
    check_workload(loaded)
    pd.testing.assert_frame_equal(
        build_requests(plain, np.random.default_rng(5), np.random.default_rng(6)),
        build_requests(loaded, np.random.default_rng(5), np.random.default_rng(6)))


@pytest.mark.parametrize("name", ["chat", "poisson", "trace", "two_classes"])
def test_llm_workloads_are_kind_llm_without_jobs(name):
    w = compose_workload(name)
    assert w.kind == "llm" and len(w.mix) == 0
    df = build_jobs(w, "llama3_8b", 0)
    assert df.empty and tuple(df.columns) == JOB_COLUMNS


def test_a_diffusion_workload_has_no_llm_requests():
    w = WorkloadConfig(kind="diffusion", num_requests=50)
    df = build_requests(w, np.random.default_rng(0), np.random.default_rng(1))
    assert len(df) == 0
    assert list(df.columns) == ["arrival_time_s", "input_tokens", "output_tokens", "client",
                                "think_time_s"]
    assert df["input_tokens"].dtype == np.int64
    assert len(build_jobs(w, "flux1_dev", 0)) == 50
