"""check_workload: every range and cross-field error names the full dotted field."""

import pytest
from omegaconf import OmegaConf

from scenarios import LengthConfig, WorkloadConfig, WorkloadError, check_workload


def test_defaults_and_shipped_shapes_are_valid():
    check_workload(WorkloadConfig(name="x"))
    check_workload(OmegaConf.structured(WorkloadConfig(name="x")))
    check_workload(WorkloadConfig(name="x", arrival="trace", trace_path="t.csv", num_requests=0))


BAD = [
    ({"arrival": "uniform"}, "workload.arrival"),
    ({"rate": 0.0}, "workload.rate"),
    ({"rate": -1.0}, "workload.rate"),
    ({"rate": float("nan")}, "workload.rate"),
    ({"rate": float("-inf")}, "workload.rate"),
    ({"cv": 0.0}, "workload.cv"),
    ({"num_requests": 0}, "workload.num_requests"),
    ({"arrival": "trace", "trace_path": "t.csv", "num_requests": -1}, "workload.num_requests"),
    ({"concurrency": 0}, "workload.concurrency"),
    ({"think_time_s": -0.1}, "workload.think_time_s"),
    ({"think_time_dist": "gamma"}, "workload.think_time_dist"),
    ({"time_scale": 0.0}, "workload.time_scale"),
    ({"window_start_s": float("nan")}, "workload.window_start_s"),
    ({"window_start_s": 5.0, "window_end_s": 5.0}, "workload.window_end_s"),
    ({"window_end_s": -1.0}, "workload.window_end_s"),
    ({"max_requests": 0}, "workload.max_requests"),
    ({"input_tokens": 0}, "workload.input_tokens"),
    ({"output_tokens": -3}, "workload.output_tokens"),
    ({"arrival": "trace"}, "workload.trace_path"),
    ({"arrival": "trace", "trace_path": ""}, "workload.trace_path"),
    ({"input": LengthConfig(dist="normal")}, "workload.input.dist"),
    ({"output": LengthConfig(dist="fixed", value=0)}, "workload.output.value"),
    ({"input": LengthConfig(dist="uniform", low=0)}, "workload.input.low"),
    ({"input": LengthConfig(dist="uniform", low=10, high=9)}, "workload.input.high"),
    ({"output": LengthConfig(dist="lognormal", low=5, high=4)}, "workload.output.high"),
    ({"input": LengthConfig(dist="lognormal", sigma=0.0)}, "workload.input.sigma"),
    ({"output": LengthConfig(dist="lognormal", mu=float("inf"))}, "workload.output.mu"),
    ({"output": LengthConfig(dist="empirical")}, "workload.output.path"),
]


@pytest.mark.parametrize("overrides,field", BAD, ids=[f for _, f in BAD])
def test_each_bad_value_names_its_field(overrides, field):
    w = WorkloadConfig(name="x", **overrides)
    with pytest.raises(WorkloadError) as err:
        check_workload(w)
    assert err.value.field == field
    assert str(err.value).startswith(f"{field}=")
    with pytest.raises(WorkloadError) as err2:  # same through a DictConfig
        check_workload(OmegaConf.structured(w))
    assert err2.value.field == field


def test_error_message_format():
    err = WorkloadError("workload.input.sigma", -1.0, "must be a finite number > 0")
    assert str(err) == "workload.input.sigma=-1.0: must be a finite number > 0"
    assert isinstance(err, ValueError)


def test_lengths_not_checked_for_traces():
    w = WorkloadConfig(
        name="x", arrival="trace", trace_path="t.csv", input=LengthConfig(dist="empirical")
    )
    check_workload(w)
