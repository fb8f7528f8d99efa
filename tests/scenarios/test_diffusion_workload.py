"""Diffusion workloads: the schema, fixed shapes, mixes, classes, seeds, the Alibaba trace
replay and its errors, the mixed workload, and LLM workloads left as they were."""

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
from scenarios.diffusion import JOB_COLUMNS, build_jobs, check_job_files
from scenarios.diffusion_config import (
    GUIDANCE_MODES,
    JobShapeConfig,
    PriorityClassConfig,
    entry_key_error,
)
from scenarios.traces import read_job_trace
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


# --- Alibaba trace ------------------------------------------------------------------------

TRACE = """arrival_time_s,input_tokens,output_tokens,num_inference_steps,num_images,type,status
0.0,63,0,30,1,TXT_2_IMG,SUCCEED
10.0,93,0,40,8,IMG_2_IMG,SUCCEED
12.0,0,0,,,TXT_2_IMG,PENDING
20.0,50,0,30,4,INPAINTING,SUCCEED
30.0,70,0,28,2,TXT_2_IMG,FAILED
35.0,70,0,30,4,TXT_2_IMG,PROCESSING
50.0,12,0,50,1,TXT_2_IMG,SUCCEED
"""


def trace_jobs(tmp_path, text: str = TRACE, **kw) -> pd.DataFrame:
    return jobs(arrival="trace", trace_path=write(tmp_path, text), **kw)


def test_alibaba_rows_steps_and_images(tmp_path):
    df = trace_jobs(tmp_path, height=768, width=1344)
    assert tuple(df.columns) == JOB_COLUMNS
    # PENDING (no steps), PROCESSING and INPAINTING rows are left out by default
    assert df["arrival_time_s"].tolist() == [0.0, 10.0, 30.0, 50.0]
    assert df["steps"].tolist() == [30, 40, 28, 50]
    assert df["images"].tolist() == [1, 8, 2, 1]
    assert (df["height"] == 768).all() and (df["width"] == 1344).all()
    assert (df["model"] == "flux1_dev").all() and (df["frames"] == 0).all()


def test_alibaba_filters_window_scale_and_steps_override(tmp_path):
    df = trace_jobs(tmp_path, trace_types=["TXT_2_IMG", "INPAINTING"],
                    trace_statuses=["SUCCEED", "FAILED", "PROCESSING"],
                    window_start_s=15.0, window_end_s=50.0, time_scale=0.5, steps=4)
    assert df["arrival_time_s"].tolist() == [0.0, 5.0, 7.5]
    assert df["images"].tolist() == [4, 2, 4] and (df["steps"] == 4).all()
    capped = trace_jobs(tmp_path, max_requests=2)
    assert capped["arrival_time_s"].tolist() == [0.0, 10.0]


def test_a_mix_gives_trace_jobs_their_resolution(tmp_path):
    mix = [JobShapeConfig(height=512, width=512), JobShapeConfig(steps=10)]
    df = trace_jobs(tmp_path, mix=mix)
    small = (df["height"] == 512).to_numpy()
    assert 0 < small.sum() < 4  # both entries drawn (fixed seed)
    trace_steps = np.array([30, 40, 28, 50])
    np.testing.assert_array_equal(df["steps"], np.where(small, trace_steps, 10))
    np.testing.assert_array_equal(df["images"], [1, 8, 2, 1])


@pytest.mark.parametrize("text, kw, expected", [
    ("arrival_time_s,num_inference_steps,type,status\n0,30,TXT_2_IMG,SUCCEED\n", {},
     "missing column 'num_images'"),
    ("arrival_time_s,num_images,type,status\n0,1,TXT_2_IMG,SUCCEED\n", {},
     "missing column 'num_inference_steps'"),
    ("arrival_time_s,input_tokens,output_tokens\n0,5,5\n", {}, "not a diffusion job trace"),
    ("arrival_time_s,num_inference_steps,num_images\n0,30,1\n", {},
     "missing column 'type', which workload.trace_types"),
    (TRACE.replace("50.0,12,0,50,1", "50.0,12,0,2.5,1"), {},
     "column 'num_inference_steps' row 6 (line 8) is '2.5'; must be an integer >= 1"),
    (TRACE.replace("30.0,70,0,28,2", "30.0,70,0,28,0"), {},
     "column 'num_images' row 4 (line 6) is '0'"),
    (TRACE.replace("30.0,70,0,28,2", "30.0,70,0,28,many"), {},
     "column 'num_images' row 4 (line 6) is 'many'; expected a finite number"),
    (TRACE.replace("50.0,12", "5.0,12"), {},
     "arrival_time_s is not sorted: row 6 (line 8) is 5.0"),
    (TRACE.replace("0.0,63", "-1.0,63"), {}, "column 'arrival_time_s' row 0 (line 2)"),
    (TRACE, {"trace_statuses": ["PENDING"]},
     "column 'num_inference_steps' row 2 (line 4) is nan"),
    (TRACE, {"trace_types": ["IMG_2_IMG"], "trace_statuses": ["FAILED"]}, "no rows of type"),
    (TRACE, {"window_start_s": 100.0}, "no rows in the window"),
    ("arrival_time_s,num_inference_steps,num_images,type,status\n", {},
     "the trace has no rows"),
])
def test_a_malformed_trace_is_one_clear_error(tmp_path, text, kw, expected):
    w = WorkloadConfig(name="d", kind="diffusion", arrival="trace",
                       trace_path=write(tmp_path, text), **kw)
    for call in (lambda: check_job_files(w), lambda: build_jobs(w, "flux1_dev", 0)):
        with pytest.raises(WorkloadError) as e:
            call()
        assert e.value.field == "workload.trace_path" and e.value.value == w.trace_path
        assert expected in str(e.value) and "\n" not in str(e.value)


def test_a_missing_trace_file_is_named(tmp_path):
    with pytest.raises(WorkloadError, match="file not found"):
        read_job_trace(str(tmp_path / "absent.csv"))


def test_real_alibaba_trace_distributions_match_the_readme(shared_traces):
    df = read_job_trace(str(shared_traces / ALIBABA), ["TXT_2_IMG", "IMG_2_IMG"],
                        ["SUCCEED", "FAILED"])
    # README: TXT_2_IMG 24,438 + IMG_2_IMG 2,199 rows, less 25 + 1 PENDING, 2 + 1 PROCESSING
    assert len(df) == 26_609
    steps, images = df["steps"].to_numpy(), df["images"].to_numpy()
    assert np.percentile(steps, 50) == 30 and np.percentile(steps, 99) == 50
    assert steps.max() == 100
    assert images.mean() == pytest.approx(2.69, abs=0.01)
    assert np.isin(images, [1, 2, 4, 8]).mean() > 0.999
    everything = read_job_trace(str(shared_traces / ALIBABA), [], ["SUCCEED", "FAILED",
                                                                   "PROCESSING"])
    assert len(everything) == 26_823 - 30  # every row but the PENDING ones


def test_alibaba_yaml_replays_one_day(shared_traces, monkeypatch):
    w = compose_workload("alibaba_t2i")
    if not (REPO / w.trace_path).is_file():
        pytest.skip(f"trace {w.trace_path} not found relative to {REPO}")
    monkeypatch.chdir(REPO)
    assert OmegaConf.get_type(w) is WorkloadConfig and w.kind == "diffusion"
    check_workload(w)
    check_job_files(w)
    df = build_jobs(w, "llama3_8b", 0)
    assert len(df) == 2_654
    assert df["arrival_time_s"].iloc[0] == 0.0 and df["arrival_time_s"].iloc[-1] < 86_400
    assert set(df["model"]) == {"sd35_large"} and set(df["height"]) == {1024}
    assert df["steps"].median() == 30 and 2.0 < df["images"].mean() < 3.5


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
