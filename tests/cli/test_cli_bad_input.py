"""Bad input to ``python -m sim``: one line on stderr that starts with ``error:`` and names the
field and the value, exit code 2, no traceback, and no results written."""

from __future__ import annotations

import pytest

HEADER = "arrival_time_s,input_tokens,output_tokens\n"
TRACES = {
    "no_output_col.csv": "arrival_time_s,input_tokens\n0.0,10\n0.5,20\n",
    "negative_len.csv": HEADER + "0.0,10,5\n0.1,-5,5\n",
    "fractional_len.csv": HEADER + "0.0,10,5\n0.1,12.5,5\n",
    "unsorted.csv": HEADER + "0.0,10,5\n0.5,10,5\n0.2,10,5\n",
}
SMALL = ["workload.num_requests=20", "plots=false"]

# name → (overrides, substrings the error line must contain)
CASES = {
    "rate_zero": (["workload.rate=0"], ["workload.rate=0"]),
    "rate_negative": (["workload.rate=-3"], ["workload.rate=-3"]),
    "trace_missing": (["workload=trace", "workload.trace_path=missing.csv"],
                      ["workload.trace_path", "missing.csv", "not found"]),
    "trace_no_output_col": (["workload=trace", "workload.trace_path=no_output_col.csv"],
                            ["workload.trace_path", "no_output_col.csv", "output_tokens"]),
    "trace_negative_len": (["workload=trace", "workload.trace_path=negative_len.csv"],
                           ["workload.trace_path", "negative_len.csv", "input_tokens", "-5"]),
    "trace_fractional_len": (["workload=trace", "workload.trace_path=fractional_len.csv"],
                             ["workload.trace_path", "fractional_len.csv", "input_tokens",
                              "12.5"]),
    "trace_unsorted": (["workload=trace", "workload.trace_path=unsorted.csv"],
                       ["workload.trace_path", "unsorted.csv", "arrival_time_s", "0.2", "0.5"]),
    "model_unknown": (["model=nonexistent"], ["model", "nonexistent"]),
    "scheduler_unknown": (["scheduler=nonexistent"], ["scheduler", "nonexistent"]),
    "model_does_not_fit": (["model=llama3_70b"], ["cluster.tensor_parallel_size=1", "llama3_70b"]),
    "max_num_seqs_zero": (["scheduler.max_num_seqs=0"], ["scheduler.max_num_seqs=0"]),
    "hidden_size_not_int": (["model.hidden_size=abc"], ["model.hidden_size", "abc"]),
    "model_unknown_key": (["model.foo=1"], ["model.foo"]),
    "gpu_mem_util_too_big": (["kv_cache.gpu_memory_utilization=1.5"],
                             ["kv_cache.gpu_memory_utilization=1.5"]),
    "constant_step_time_zero": (["cost_model=constant", "cost_model.step_time_ms=0"],
                                ["cost_model.step_time_ms=0"]),
    "calibration_unknown": (["cost_model.calibration=nope"],
                            ["cost_model.calibration", "nope"]),
    "chunk_over_budget": (["scheduler=sarathi", "scheduler.chunk_size=4096"],
                          ["scheduler.chunk_size=4096"]),
    "queue_delay_negative": (["scheduler=dynamic", "scheduler.max_queue_delay_ms=-1"],
                             ["scheduler.max_queue_delay_ms=-1"]),
    "policy_unknown": (["scheduler.policy=lifo"], ["scheduler.policy", "lifo"]),
    "router_unknown": (["cluster.replicas=2", "cluster.router=nope"], ["cluster.router", "nope"]),
    "backend_unknown": (["backend.name=tgi"], ["backend.name", "tgi"]),
    "key_inside_null_field": (["workload.total_length.dist=fixed"],
                              ["workload.total_length.dist", "whole field"]),
}
@pytest.fixture(scope="module")
def bad_runs(tmp_path_factory, sim_cli):
    """Every bad-input run of this module, run once, in parallel."""
    cwd = tmp_path_factory.mktemp("cli_bad_input")
    for name, text in TRACES.items():
        (cwd / name).write_text(text)
    return sim_cli.run_many({name: [*SMALL, *args] for name, (args, _) in CASES.items()}, cwd)


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_clear_line(bad_runs, name):
    run = bad_runs[name]
    _, expected = CASES[name]
    assert run.returncode == 2, run.describe()
    assert "Traceback" not in run.stdout, run.describe()
    assert "Traceback" not in run.stderr, run.describe()
    lines = run.stderr.splitlines()
    assert len(lines) == 1, run.describe()
    line = lines[0]
    assert line.startswith("error: "), line
    for text in expected:
        assert text in line, (text, line)
    assert not (run.outdir / "summary.json").exists()
    assert not (run.outdir / "requests.parquet").exists()


def test_unsorted_trace_message_shows_plain_numbers(bad_runs):
    line = bad_runs["trace_unsorted"].stderr.strip()
    assert "np.float64" not in line, line
