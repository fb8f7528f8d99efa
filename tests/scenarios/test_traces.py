"""Trace replay: reading, windowing, scaling, hash_ids, and one clear error per bad trace."""

import os
import signal
import threading

import numpy as np
import pytest

from scenarios import WorkloadConfig, WorkloadError, build_requests
from scenarios.traces import read_job_trace, read_trace, window_trace
from scenarios.workload import check_workload_files

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


@pytest.mark.parametrize("text, line", [
    (HEAD + "0,1,1\n\n\n1,-4,1\n", 5),  # blank lines
    ("\n\n" + HEAD + "0,1,1\n1,-4,1\n", 5),  # blank lines before the header
    ("arrival_time_s,input_tokens,output_tokens,note\n0,1,1,\"two\nlines\"\n1,-4,1,x\n", 4),
    (HEAD.replace("\n", "\r\n") + "0,1,1\r\n\r\n1,-4,1\r\n", 4),
])
def test_csv_errors_name_the_line_of_the_file(tmp_path, text, line):
    """The line an editor shows: blank lines and a quoted cell's line breaks count."""
    with pytest.raises(WorkloadError, match=rf"'input_tokens' row 1 \(line {line}\) is '-4'"):
        read_trace(write(tmp_path, text))


@pytest.fixture
def no_hang():
    """Fail, rather than hang, when reading a FIFO blocks (a second read finds no writer)."""
    def _raise(signum, frame):
        raise TimeoutError("reading the FIFO blocked: it was read twice")

    old = signal.signal(signal.SIGALRM, _raise)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _validated_and_built(path: str):
    """The request table of a trace replay after ``check_workload_files`` read the trace
    first, as ``python -m sim`` does (validation, then the run)."""
    w = WorkloadConfig(name="t", arrival="trace", trace_path=path)
    check_workload_files(w)
    return build_requests(w, np.random.default_rng(0), np.random.default_rng(1))


def test_a_fifo_trace_is_read_once(tmp_path, no_hang):
    path = tmp_path / "trace.fifo"
    os.mkfifo(path)
    writer = threading.Thread(target=lambda: path.write_text(TRACE), daemon=True)
    writer.start()
    df = _validated_and_built(str(path))
    writer.join()
    assert df["input_tokens"].tolist() == [10, 20, 30, 40, 50, 60]


def test_a_piped_trace_is_read_once():
    """``workload.trace_path=<(zcat trace.csv.gz)``: the shell passes ``/dev/fd/N``, a pipe."""
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, TRACE.encode())
        os.close(write_fd)
        df = _validated_and_built(f"/dev/fd/{read_fd}")
    finally:
        os.close(read_fd)
    assert df["hash_ids"].tolist() == [(0, 1), (0, 2, 3), (), (9,), (0, 1, 4), (5,)]


def test_a_piped_job_trace_is_read_once():
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, b"arrival_time_s,num_inference_steps,num_images\n0,28,1\n2,50,4\n")
        os.close(write_fd)
        first = read_job_trace(f"/dev/fd/{read_fd}")
        again = read_job_trace(f"/dev/fd/{read_fd}")
    finally:
        os.close(read_fd)
    assert first.equals(again) and again["steps"].tolist() == [28, 50]
