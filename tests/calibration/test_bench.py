"""Measured benchmark runs: the readers (gpustack CSV, ``vllm bench serve`` result files),
the replay of a run as its client sent it, and ``python -m calibration from-bench``."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import yaml

from calibration.bench_replay import Replayer, plan_run, run_requests
from calibration.bench_runs import (
    METRICS,
    BenchRun,
    parse_serve_command,
    read_gpustack,
    read_result_file,
)
from calibration.from_bench import main as from_bench
from scenarios import WorkloadError
from sim.errors import ConfigError


def test_serve_commands_of_the_three_engines():
    assert parse_serve_command("vllm serve openai/gpt-oss-120b --max-model-len 32768 "
                               "--async-scheduling -tp 2") == {
        "model": "openai/gpt-oss-120b", "max-model-len": "32768", "async-scheduling": "",
        "tensor-parallel-size": "2"}
    assert parse_serve_command("python3 -m sglang.launch_server --model-path Qwen/Qwen3-8B "
                               "--tp-size 4 --ep-size 4") == {
        "model": "Qwen/Qwen3-8B", "tensor-parallel-size": "4", "expert-parallel-size": "4"}
    assert parse_serve_command("# a note. vllm serve X -tp 8 --enable-expert-parallel") == {
        "model": "X", "tensor-parallel-size": "8", "enable-expert-parallel": ""}
    assert parse_serve_command("trtllm-serve Qwen/Qwen3-32B-FP8 --max_seq_len=40960")[
        "max-seq-len"] == "40960"


def test_gpustack_rows_become_runs(tmp_path):
    note = ("vllm bench serve client; 100 requests; total in/out tokens 23260/22061; "
            "serve cmd: vllm serve Qwen/Qwen3-8B")
    rows = [{"source": "doc.md", "engine": "vLLM [vLLM: v0.11.0 SGLang: v0.5.3]",
             "model": "Qwen/Qwen3-8B", "dataset_or_lengths": "ShareGPT_V3",
             "input_len": "avg 232.6", "output_len": "avg 220.6",
             "request_rate_or_concurrency": "max_concurrency=4", "metric": m, "value": v,
             "notes": note}
            for m, v in (("request_throughput", 2.25), ("mean_ttft", 64.0),
                         ("output_token_throughput", 496.9))]
    path = tmp_path / "runs.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    [run] = read_gpustack(path)
    assert (run.backend, run.model_path, run.num_prompts, run.max_concurrency) == (
        "vllm", "Qwen/Qwen3-8B", 100, 4)
    assert run.input_len == pytest.approx(232.6) and run.output_len == pytest.approx(220.61)
    assert run.measured == {"request_throughput": 2.25, "mean_ttft_ms": 64.0,
                            "output_throughput": 496.9}
    assert run.engine_version == "v0.11.0" and not run.fixed_lengths
    assert run.dataset == "sharegpt" and "drawn to the means" in run.note


def _result(tmp_path, name: str, **over) -> str:
    doc = {"backend": "vllm", "model_id": "meta-llama/Llama-3.1-8B", "num_prompts": 3,
           "request_rate": "inf", "max_concurrency": None, "completed": 3,
           "total_input_tokens": 300, "total_output_tokens": 30, "mean_ttft_ms": 50.0,
           "median_ttft_ms": 48.0, "request_throughput": 10.0, "input_lens": [100, 100, 100],
           "output_lens": [10, 10, 10], "ttfts": [0.05, 0.048, 0.052]} | over
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def test_result_file_reader_takes_vllm_bench_serve_fields(tmp_path):
    run = read_result_file(_result(tmp_path, "a.json", max_concurrency=2), "vllm", "llama3_8b")
    assert (run.num_prompts, run.max_concurrency, run.input_lens) == (3, 2, [100] * 3)
    assert math.isinf(run.request_rate) and run.measured["mean_ttft_ms"] == 50.0
    means = read_result_file(_result(tmp_path, "b.json", input_lens=None, request_rate=4.0),
                             "vllm")
    assert means.input_lens is None and means.input_len == 100 and means.request_rate == 4.0
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="results"):
        read_result_file(bad, "vllm")
    with pytest.raises(ConfigError, match="completed"):
        read_result_file(_result(tmp_path, "c.json", completed=-1), "vllm")


def test_requests_are_sent_as_the_client_sent_them():
    burst = BenchRun("b", "vllm", "Qwen/Qwen3-8B", num_prompts=5, input_len=10, output_len=3)
    assert (run_requests(burst)["arrival_time_s"] == 0).all()
    closed = BenchRun("c", "vllm", "Qwen/Qwen3-8B", 6, 10, 3, max_concurrency=2)
    req = run_requests(closed)
    assert req["client"].tolist() == [0, 1, 0, 1, 0, 1]
    assert req["arrival_time_s"].isna().tolist() == [False, False] + [True] * 4
    poisson = run_requests(BenchRun("p", "vllm", "Qwen/Qwen3-8B", 2000, 10, 3, 50.0))
    assert np.diff(poisson["arrival_time_s"]).mean() == pytest.approx(1 / 50, rel=0.1)
    assert (req["input_tokens"] == 10).all() and (req["output_tokens"] == 3).all()
    sharegpt = run_requests(BenchRun("g", "vllm", "Qwen/Qwen3-8B", 500, 214.5, 199.9,
                                     fixed_lengths=False, dataset="sharegpt"))
    assert sharegpt["output_tokens"].mean() == pytest.approx(199.9, abs=0.5)
    assert sharegpt["output_tokens"].max() > 4 * 199.9  # not every request at the mean
    # the same lengths whatever the client's rate
    at_rate = run_requests(BenchRun("h", "vllm", "Qwen/Qwen3-8B", 500, 214.5, 199.9, 5.0,
                                    fixed_lengths=False, dataset="sharegpt"))
    assert at_rate["output_tokens"].equals(sharegpt["output_tokens"])
    with pytest.raises(WorkloadError, match="cannot keep"):
        run_requests(BenchRun("u", "vllm", "Qwen/Qwen3-8B", 10, 900, 100, fixed_lengths=False,
                              dataset="sharegpt"))


def test_plans_name_what_cannot_be_simulated():
    spec = BenchRun("s", "sglang", "Qwen/Qwen3-8B-FP8", 10, 10, 3,
                    serve_args={"speculative-algorithm": "EAGLE3"})
    assert "speculative decoding" in plan_run(spec)["reason"]
    fp8 = plan_run(BenchRun("f", "vllm", "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8", 10, 10, 3,
                            tp=4))
    assert not fp8["reason"] and "model.dtype=fp8_block" in fp8["overrides"]
    assert "cluster.tensor_parallel_size=4" in fp8["overrides"]
    assert "no conf/model" in plan_run(BenchRun("x", "vllm", "org/unknown", 1, 1, 1))["reason"]


def test_plans_keep_each_engines_default_prefix_caching():
    """vLLM V1, SGLang and TensorRT-LLM cache KV blocks unless the serve command says not to;
    vLLM before V1 (0.8) did not."""
    def caching(backend, version="", **args):
        run = BenchRun("p", backend, "Qwen/Qwen3-8B", 10, 10, 3, engine_version=version,
                       serve_args=args)
        return [o for o in plan_run(run)["overrides"] if o.startswith("kv_cache.prefix_")]

    on, off = ["kv_cache.prefix_caching=true"], ["kv_cache.prefix_caching=false"]
    assert caching("vllm", "v0.11.0") == caching("sglang") == caching("trtllm") == on
    assert caching("vllm", "v0.7.3") == off
    assert caching("vllm", "v0.7.3", **{"enable-prefix-caching": ""}) == on
    assert caching("vllm", "v0.11.0", **{"no-enable-prefix-caching": ""}) == off
    assert caching("sglang", **{"disable-radix-cache": ""}) == off
    assert parse_serve_command("vllm serve X --no-enable-prefix-caching -tp 2") == {
        "model": "X", "no-enable-prefix-caching": "", "tensor-parallel-size": "2"}


DEPLOYMENT = ["model=llama3_8b", "hardware=h100_sxm", "backend=vllm", "scheduler=vllm",
              "cluster.tensor_parallel_size=1", "slo=none", "plots=false", "progress=false"]


def simulated_result_files(tmp_path, runs, output_len: int, truth: list[str]) -> list:
    """``vllm bench serve`` result files of runs ``(num_prompts, max_concurrency or None,
    input_len)`` of Llama-3.1-8B on one H100, their metrics simulated under ``truth``."""
    paths = []
    with Replayer() as rp:
        for i, (n, conc, isl) in enumerate(runs):
            run = BenchRun(f"r{i}", "vllm", "llama3_8b", n, isl, output_len,
                           max_concurrency=conc, overrides=DEPLOYMENT)
            pred = rp.predict(run, plan_run(run), truth)
            doc = {m: pred[f"pred_{m}"] for m in METRICS} | {
                "num_prompts": n, "completed": n, "max_concurrency": conc,
                "request_rate": "inf", "total_input_tokens": n * isl,
                "total_output_tokens": n * output_len}
            paths.append(tmp_path / f"run{i}.json")
            paths[-1].write_text(json.dumps(doc))
    return paths


def predicted_with(calibration, n: int, isl: int, osl: int) -> dict:
    """The predicted metrics of a burst of ``n`` requests under a calibration file."""
    with Replayer() as rp:
        run = BenchRun("r", "vllm", "llama3_8b", n, isl, osl,
                       overrides=[*DEPLOYMENT, f"cost_model.calibration={calibration}"])
        return rp.predict(run, plan_run(run))


def test_from_bench_recovers_a_known_frontend(tmp_path, capsys):
    """Result files made by the simulator with known frontend costs: the fit finds costs
    that predict the held-out run's TTFT within a few percent, and the calibration file it
    writes selects them in a later run."""
    true = ["backend.frontend.per_request_ms=4", "backend.frontend.latency_ms=30",
            "backend.frontend.per_output_token_us=200", "backend.frontend.per_prompt_token_us=1"]
    paths = simulated_result_files(tmp_path, [(200, None, 300), (60, 4, 400), (120, None, 500)],
                                   20, true)
    out = tmp_path / "mine.yaml"
    assert from_bench([f"results=[{','.join(map(str, paths))}]", "model=llama3_8b",
                       "max_evals=20", "n_jobs=2", f"out={out}",
                       f"hydra.run.dir={tmp_path / 'run'}"]) == 0
    text = capsys.readouterr().out
    assert "held_out runs, after the fit" in text
    doc = yaml.safe_load(out.read_text())
    assert doc["frontend"]["fitted"] and doc["frontend"]["split"].startswith("every 3th")
    held = doc["frontend"]["errors"]["held_out"]
    assert held["mean_ttft_ms"]["median_abs_pct"] < 8.0
    pred = predicted_with(out, 120, 500, 20)  # the file selects the fitted costs later
    measured = json.loads(paths[2].read_text())["mean_ttft_ms"]
    assert pred["pred_mean_ttft_ms"] == pytest.approx(measured, rel=0.08)


def test_a_fit_keeps_the_frontend_discipline_it_ran_under(monkeypatch):
    """The admission and streaming a frontend fit runs under: the user's overrides, else the
    calibrated file's, else the engine's; the written block records them."""
    from calibration import frontend_fit
    from calibration.from_bench import user_discipline
    from sim.config.backend import frontend_discipline
    from sim.engine.frontend import FRONTEND_KEYS
    assert frontend_discipline("sglang", {}) == {"admission": "fifo", "streaming": "own_process"}
    assert frontend_discipline("vllm", {"streaming": "own_process"}) == {
        "admission": "interleaved", "streaming": "own_process"}
    given = user_discipline(["model=x", "backend.frontend.streaming=shared"])
    chosen = frontend_discipline("sglang", {"streaming": "own_process"}, given)
    assert chosen == {"admission": "fifo", "streaming": "shared"}
    monkeypatch.setattr(frontend_fit, "split_errors", lambda after: {})
    block = frontend_fit.frontend_block(
        {"costs": dict.fromkeys(FRONTEND_KEYS, 1.0), "discipline": chosen, "after": None,
         "held_out_models": [], "train_models": ["m"]}, "runs.json", 0.3, 0)
    assert (block["admission"], block["streaming"]) == ("fifo", "shared")


def test_from_bench_refuses_bad_input_in_one_line(tmp_path, capsys):
    assert from_bench(["results=[nope.json]", "model=llama3_8b"]) == 2
    assert "error: results='nope.json': not a file" in capsys.readouterr().err
    path = _result(tmp_path, "a.json")
    assert from_bench([f"results=[{path}]", "model=llama3_8b", "backend=tgi"]) == 2
    assert "backend" in capsys.readouterr().err


def test_from_bench_recovers_a_known_compute_speed_jointly_with_the_frontend(tmp_path, capsys):
    """Result files made by the simulator at 60% of the profiled compute speed behind a known
    frontend (prompts long enough for prefill to be compute bound): ``fit_compute=true`` fits
    the scale together with the frontend costs, finds it within a few percent, writes it as
    the file's ``compute:`` block, and the file selects it."""
    paths = simulated_result_files(
        tmp_path, [(150, None, 3000), (40, 4, 3500), (100, None, 4000), (60, None, 300)], 30,
        ["cost_model.compute_scale=0.6", "backend.frontend.per_request_ms=4",
         "backend.frontend.per_output_token_us=100"])
    out = tmp_path / "mine.yaml"
    assert from_bench([f"results=[{','.join(map(str, paths))}]", "model=llama3_8b",
                       "max_evals=40", "n_jobs=2", "fit_compute=true", "held_out_every=4",
                       f"out={out}", f"hydra.run.dir={tmp_path / 'run'}"]) == 0
    assert "held_out runs, after the fit" in capsys.readouterr().out
    doc = yaml.safe_load(out.read_text())
    block = doc["compute"]
    assert block["fitted"] and block["scale"] == pytest.approx(0.6, abs=0.05)
    assert "jointly with the frontend" in block["method"]
    assert "jointly with the compute scale" in doc["frontend"]["method"]
    pred = predicted_with(out, 100, 4000, 30)  # the file selects the fitted scale later
    measured = json.loads(paths[2].read_text())["request_throughput"]
    assert pred["pred_request_throughput"] == pytest.approx(measured, rel=0.06)


def test_throughput_ratio_by_model_groups_by_client_and_drops_runs_without_a_prediction():
    from calibration.bench_replay import format_ratio_table, model_ratio_table
    table = pd.DataFrame({
        "backend": ["vllm"] * 5, "model": ["a", "a", "a", "a", "b"], "tp": [1, 1, 1, 1, 8],
        "max_concurrency": [0, 0, 4, 0, 0],
        "meas_request_throughput": [10.0, 10.0, 5.0, 10.0, 2.0],
        "pred_request_throughput": [20.0, 15.0, 5.5, 0.0, 2.2]})
    got = model_ratio_table(table).set_index(["client", "model"])
    assert got.loc[("burst", "a"), "n"] == 2  # the run predicted at 0 req/s is dropped
    assert got.loc[("burst", "a"), "median"] == pytest.approx(1.75)
    assert got.loc[("burst", "a"), ["min", "max"]].tolist() == [1.5, 2.0]
    assert got.loc[("closed loop", "a"), "median"] == pytest.approx(1.1)
    assert got.loc[("burst", "b"), "n"] == 1
    text = format_ratio_table(model_ratio_table(table), "t")
    assert "| vllm | burst | a | 1 | 2 | 1.75 | 1.50 | 2.00 |" in text
