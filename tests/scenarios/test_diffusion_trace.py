"""Diffusion workloads from a trace: the Alibaba text-to-image trace replayed (rows, steps,
images, filters, window, scale), its errors, and the real trace against its README."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from scenarios import WorkloadConfig, WorkloadError, check_workload
from scenarios.diffusion import JOB_COLUMNS, build_jobs, check_job_files
from scenarios.diffusion_config import JobShapeConfig
from scenarios.traces import read_job_trace
from tests.scenarios.test_diffusion_workload import ALIBABA, REPO, compose_workload, jobs, write

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
