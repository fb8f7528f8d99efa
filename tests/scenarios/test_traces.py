"""Trace replay: reading, windowing, scaling, hash_ids, and one clear error per bad trace."""

import numpy as np
import pytest

from scenarios import WorkloadConfig, WorkloadError, build_requests
from scenarios.traces import read_trace, window_trace

TRACE = """arrival_time_s,input_tokens,output_tokens,hash_ids
0.0,10,5,0 1
1.5,20,6,0 2 3
2.0,30,7,
4.0,40,8,9
6.0,50,9,0 1 4
9.0,60,10,5
"""


def write(tmp_path, text: str, name: str = "trace.csv") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def build(**kw):
    w = WorkloadConfig(name="t", arrival="trace", **kw)
    return build_requests(w, np.random.default_rng(0), np.random.default_rng(1))


def test_read_trace_parses_hash_ids(tmp_path):
    df = read_trace(write(tmp_path, TRACE))
    assert list(df.columns) == ["arrival_time_s", "input_tokens", "output_tokens", "hash_ids"]
    assert df["hash_ids"].dtype == object
    assert df["hash_ids"].tolist() == [(0, 1), (0, 2, 3), (), (9,), (0, 1, 4), (5,)]
    assert df["input_tokens"].dtype == np.int64


def test_window_shift_and_scale(tmp_path):
    df = build(
        trace_path=write(tmp_path, TRACE), window_start_s=1.0, window_end_s=6.0, time_scale=0.5
    )
    # rows with raw time in [1, 6): 1.5, 2.0, 4.0 -> shifted 0, 0.5, 2.5 -> scaled by 0.5
    assert df["arrival_time_s"].tolist() == [0.0, 0.25, 1.25]
    assert df["input_tokens"].tolist() == [20, 30, 40]
    assert df["hash_ids"].tolist() == [(0, 2, 3), (), (9,)]
    assert (df["client"] == -1).all() and (df["think_time_s"] == 0.0).all()


def test_max_requests_and_overrides(tmp_path):
    df = build(
        trace_path=write(tmp_path, TRACE), max_requests=2, output_tokens=64, num_requests=1
    )  # num_requests is ignored for traces
    assert len(df) == 2
    assert df["output_tokens"].tolist() == [64, 64] and df["input_tokens"].tolist() == [10, 20]


def test_trace_without_hash_ids_has_no_column(tmp_path):
    df = build(
        trace_path=write(
            tmp_path, "arrival_time_s,input_tokens,output_tokens,x\n3,1,1,a\n5,2,2,b\n"
        )
    )
    assert list(df.columns) == [
        "arrival_time_s",
        "input_tokens",
        "output_tokens",
        "client",
        "think_time_s",
    ]
    assert df["arrival_time_s"].tolist() == [0.0, 2.0]


HEAD = "arrival_time_s,input_tokens,output_tokens\n"


@pytest.mark.parametrize(
    "text,problem",
    [
        (None, "file not found"),
        ("", "cannot read as CSV"),
        (HEAD, "no rows"),
        ("arrival_time_s,input_tokens\n0,1\n", "missing column 'output_tokens'"),
        ("time,input_tokens,output_tokens\n0,1,1\n", "missing column 'arrival_time_s'"),
        (HEAD + "0,1,1\nsoon,1,1\n", "'arrival_time_s' row 1"),
        (HEAD + "0,1,1\n1,,1\n", "'input_tokens' row 1"),
        (HEAD + "0,1,1\n1,1,many\n", "'output_tokens' row 1"),
        (HEAD + "0,1,1\n1,1,1\n2,-4,1\n", "'input_tokens' row 2.*non-negative integers"),
        (HEAD + "0,1,2.5\n", "'output_tokens' row 0.*non-negative integers"),
        (HEAD + "0,1,1\n2,1,1\n1,1,1\n", "not sorted: row 2"),
        ("arrival_time_s,input_tokens,output_tokens,hash_ids\n0,1,1,1 x 3\n", "'hash_ids' row 0"),
    ],
)
def test_bad_trace_gives_one_clear_error(tmp_path, text, problem):
    path = str(tmp_path / "bad.csv") if text is None else write(tmp_path, text, "bad.csv")
    with pytest.raises(WorkloadError, match=problem) as err:
        build(trace_path=path)
    assert err.value.field == "workload.trace_path" and err.value.value == path
    assert str(err.value).startswith(f"workload.trace_path={path!r}: ")


def test_empty_after_window(tmp_path):
    path = write(tmp_path, TRACE)
    with pytest.raises(WorkloadError, match=r"no rows in the window \[20.0, None\)") as err:
        build(trace_path=path, window_start_s=20.0)
    assert err.value.field == "workload.trace_path"
    with pytest.raises(WorkloadError, match="no rows"):
        window_trace(read_trace(path), 2.5, 3.0)


def test_zero_lengths_need_an_override(tmp_path):
    path = write(tmp_path, HEAD + "0,5,0\n1,6,0\n")
    with pytest.raises(WorkloadError, match="output_tokens is 0 at row 0.*workload.output_tokens"):
        build(trace_path=path)
    assert build(trace_path=path, output_tokens=1)["output_tokens"].tolist() == [1, 1]
