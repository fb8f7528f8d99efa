"""Fuzzing the inputs: malformed traces and nasty config overrides end in one clean line of
error or in a run whose summary is sound, never in a traceback, a hang or a NaN where a
number belongs.

(a) hypothesis writes malformed trace CSVs (random columns, types, NaN, negatives, unsorted
rows, empty files, huge numbers, no header) and feeds each to the validation layer; (b) it
draws overrides (a real field × a nasty value) and composes them as ``python -m sim`` does
(``cli.preflight``), then validates them (``cli.validation.validate_config``); (c) it spoils
a model ``config.json`` (``sim.hf_config``). Whatever is accepted is simulated (at most 30
requests). Examples are derandomized under ``CI``.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import signal
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_module
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

import conf.schema  # noqa: F401  (registers the config schemas)
from analysis.metrics import summarize
from cli.preflight import compose_or_exit
from cli.validation import validate_config
from scenarios import WorkloadError, requests_for_seed
from sim.engine.run import simulate
from sim.errors import ConfigError
from sim.hf_config import READERS, model_fields

MAX_REQUESTS = 30
TIME_LIMIT_S = 60  # one example; a hang fails the test instead of stalling the suite
SETTINGS = dict(deadline=None, derandomize=bool(os.environ.get("CI")),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
# summary values that must be finite numbers once a request completed
FINITE = ("duration_s", "request_throughput", "output_throughput", "total_token_throughput",
          *(f"{s}_{m}" for m in ("ttft_ms", "e2el_ms") for s in ("mean", "median", "p90", "p99")))


@contextlib.contextmanager
def time_limit(seconds: int):
    """Fail (``TimeoutError``) instead of hanging when a run does not end in ``seconds``."""
    def _raise(signum, frame):
        raise TimeoutError(f"no result within {seconds} s: a hang")

    old = signal.signal(signal.SIGALRM, _raise)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def assert_one_line(message: str) -> None:
    """An error message fit for the CLI's single ``error:`` line."""
    assert message.strip(), "empty error message"
    assert "\n" not in message.strip(), message
    assert "Traceback" not in message, message


def assert_sound_run(cfg) -> None:
    """Simulate an accepted config and check its summary: every request accounted for, and
    finite latencies and throughputs once any completed. Drawing the requests may still
    refuse what only the draws reveal (a session whose first turn never fits), in one line."""
    try:
        requests = requests_for_seed(cfg.workload, cfg.seed)
    except WorkloadError as e:
        assert_one_line(str(e))
        return
    assert 1 <= len(requests) <= MAX_REQUESTS
    summary = summarize(simulate(cfg, requests), cfg.slo)
    ended = summary["completed"] + summary["rejected"] + summary.get("failed", 0)
    assert ended == len(requests), summary
    if summary["completed"]:
        bad = {k: summary[k] for k in FINITE if not math.isfinite(summary[k])}
        assert not bad, (bad, summary)
        assert summary["mean_ttft_ms"] >= 0 and summary["duration_s"] > 0, summary


# ---- (a) malformed traces ---------------------------------------------------------------------
COLUMNS = ("arrival_time_s", "input_tokens", "output_tokens", "hash_ids")
NUMBERS = st.one_of(
    st.integers(-5, 3000), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, 0.5, 1e30, -1e30, 2**31, 1e9, 1e10]),
)
CELLS = st.one_of(NUMBERS.map(str), st.sampled_from(["", "abc", "nan", "inf", "-inf", "1 2 3",
                                                    "NaN", "1e400", "0x10", " 7 ", '"5"']))


# the column names of each layout read as published (scenarios.trace_formats)
LAYOUTS = (COLUMNS, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
           ("Timestamp", "Request tokens", "Response tokens", "Model"),
           ("arrived_at", "num_prefill_tokens", "num_decode_tokens"))


@st.composite
def trace_csvs(draw) -> str:
    """The text of a trace CSV in one of the layouts, often malformed, sometimes valid."""
    layout = draw(st.sampled_from(LAYOUTS))
    columns = draw(st.lists(st.sampled_from([*layout, "extra"]), max_size=5, unique=True)
                   | st.just(list(layout[:3])))
    n = draw(st.integers(0, 8))
    rows = []
    for _ in range(n):
        row = [draw(CELLS) for _ in columns]
        rows.append(row)
    if layout[0] in columns and draw(st.booleans()):  # often valid, sorted times
        i = columns.index(layout[0])
        times = sorted(draw(st.lists(st.floats(0, 1e4), min_size=n, max_size=n)))
        for row, t in zip(rows, times, strict=True):
            row[i] = (str(pd.Timestamp("2023-11-16 18:15") + pd.to_timedelta(t, "s"))
                      if layout[0] == "TIMESTAMP" else repr(t))
    for name in layout[1:3]:
        if name in columns and draw(st.booleans()):
            i = columns.index(name)
            for row in rows:
                row[i] = str(draw(st.integers(1, 5000)))
    lines = [",".join(row) for row in rows]
    if draw(st.integers(0, 9)):  # one file in ten has no header
        lines.insert(0, ",".join(columns))
    return "\n".join(lines) + ("\n" if draw(st.booleans()) else "")


@pytest.fixture(scope="module")
def trace_cfg(tmp_path_factory):
    """A composed trace-replay config whose trace file each example rewrites."""
    path = tmp_path_factory.mktemp("fuzz_trace") / "trace.csv"
    with initialize_config_module("conf", version_base=None):
        cfg = compose("config", overrides=[
            "workload=trace", f"workload.trace_path={path}",
            f"workload.max_requests={MAX_REQUESTS}", "plots=false"])
    return cfg, Path(path)


def assert_clean_trace_error_or_sound_run(cfg) -> None:
    """The trace the config names is refused in one workload line, or runs soundly."""
    with time_limit(TIME_LIMIT_S):
        try:
            validate_config(cfg)
        except (ConfigError, WorkloadError) as e:
            assert_one_line(str(e))
            assert str(e).startswith("workload."), str(e)
            return
        assert_sound_run(cfg)


@settings(max_examples=80, **SETTINGS)
@given(text=trace_csvs())
def test_malformed_trace_is_one_clean_error_or_a_sound_run(trace_cfg, text):
    cfg, path = trace_cfg
    path.write_text(text)
    assert_clean_trace_error_or_sound_run(cfg)


MOONCAKE_VALUES = st.one_of(NUMBERS, st.text(max_size=4), st.none(), st.booleans(),
                            st.lists(st.integers(-3, 2**40), max_size=4))
# lines Python's JSON parser cannot read: too deep, an integer of 5,000 digits
UNREADABLE_JSON = ("[" * 100_000 + "]" * 100_000, '{"timestamp": ' + "9" * 5000 + "}")


@st.composite
def mooncake_jsonl(draw) -> str:
    """Mooncake-style JSON lines, often malformed, sometimes valid."""
    lines, t = [], 0
    for _ in range(draw(st.integers(0, 8))):
        if draw(st.integers(0, 9)) == 0:  # a line that is not JSON
            lines.append(draw(st.sampled_from(["{", "[1, 2]", "nan", '{"timestamp": }',
                                               *UNREADABLE_JSON])))
            continue
        t += draw(st.integers(0, 5000))
        rec = {"timestamp": t, "input_length": draw(st.integers(1, 5000)),
               "output_length": draw(st.integers(1, 500)),
               "hash_ids": draw(st.lists(st.integers(0, 50), max_size=4))}
        for key in draw(st.lists(st.sampled_from(sorted(rec)), max_size=2, unique=True)):
            if draw(st.booleans()):
                del rec[key]
            else:
                rec[key] = draw(MOONCAKE_VALUES)
        lines.append(json.dumps(rec))
    return "\n".join(lines) + "\n"


@settings(max_examples=40, **SETTINGS)
@given(text=mooncake_jsonl())
def test_malformed_json_lines_trace_is_one_clean_error_or_a_sound_run(trace_cfg, text):
    cfg, path = trace_cfg
    jsonl = path.with_suffix(".jsonl")
    jsonl.write_text(text)
    cfg = cfg.copy()
    cfg.workload.trace_path = str(jsonl)
    assert_clean_trace_error_or_sound_run(cfg)


# ---- (b) nasty config overrides ---------------------------------------------------------------
FIELDS = (
    "seed",
    "model.num_hidden_layers", "model.hidden_size", "model.num_attention_heads",
    "model.num_key_value_heads", "model.head_dim", "model.intermediate_size", "model.vocab_size",
    "model.max_position_embeddings", "model.dtype", "model.num_experts",
    "model.num_experts_per_tok", "model.sliding_window", "model.layer_types",
    "hardware.bf16_flops", "hardware.fp8_flops", "hardware.hbm_bandwidth", "hardware.hbm_bytes",
    "hardware.cuda_total_bytes",
    "hardware.nvlink_bandwidth", "hardware.pcie_bandwidth", "hardware.gpus_per_node",
    "hardware.num_sms", "hardware.internode_latency_us", "hardware.calibration", "backend.name",
    "scheduler.name", "scheduler.max_num_seqs", "scheduler.max_num_batched_tokens",
    "scheduler.enable_chunked_prefill", "scheduler.long_prefill_token_threshold",
    "scheduler.max_model_len", "scheduler.policy", "scheduler.max_queue_delay_ms",
    "scheduler.chunk_size",
    "kv_cache.block_size", "kv_cache.gpu_memory_utilization", "kv_cache.dtype",
    "kv_cache.preemption", "kv_cache.other_memory_gib", "kv_cache.num_gpu_blocks",
    "kv_cache.prefix_caching", "kv_cache.swap_space_gib", "kv_cache.cpu_offload_gb",
    "cluster.tensor_parallel_size", "cluster.pipeline_parallel_size",
    "cluster.expert_parallel_size", "cluster.replicas", "cluster.router",
    "cluster.router_load_cap", "cluster.prefix_block_tokens", "cluster.failure.mtbf_s",
    "cluster.failure.mttr_s",
    "cost_model.host_overhead_ms", "cost_model.host_overhead_per_seq_us",
    "cost_model.calibration",
    "workload.arrival", "workload.rate", "workload.cv", "workload.num_requests",
    "workload.concurrency", "workload.think_time_s", "workload.ramp_up_s",
    "workload.input_tokens", "workload.output_tokens", "workload.input.dist",
    "workload.input.value", "workload.input.low", "workload.input.high", "workload.input.mu",
    "workload.input.sigma", "workload.output.dist", "workload.output.value",
    "workload.prefill_fraction", "workload.total_length", "workload.system_prompt.count",
    "workload.system_prompt.tokens", "workload.multi_turn.enabled",
    "workload.hash_block_tokens", "workload.multi_turn.max_input_tokens",
    "workload.multi_turn.turns.value",
    "slo.ttft_ms", "slo.tpot_ms", "slo.e2el_ms",
)
NASTY = ("0", "-1", "1e30", "nan", "inf", "-inf", "''", "abc", "null", "1.5", "2",
         "1000000000000", "[]", "{}")
BASES = {
    "chat": ["workload.num_requests=20"],
    "closed_loop": ["workload=closed_loop", "workload.num_requests=20"],
    "sarathi": ["scheduler=sarathi", "workload.num_requests=20"],
    "constant": ["cost_model=constant", "workload.num_requests=20"],
    "system_prompt": ["workload=system_prompt", "kv_cache=prefix", "workload.num_requests=20"],
    "multi_turn": ["workload=multi_turn", "kv_cache=prefix", "workload.num_requests=20"],
}


def test_every_fuzzed_field_exists():
    with initialize_config_module("conf", version_base=None):
        cfg = compose("config")
    missing = [f for f in FIELDS if OmegaConf.select(cfg, f, default="<absent>") == "<absent>"]
    assert missing == []


@settings(max_examples=60, **SETTINGS)
@given(base=st.sampled_from(sorted(BASES)),
       overrides=st.lists(st.tuples(st.sampled_from(FIELDS), st.sampled_from(NASTY)),
                          min_size=1, max_size=2))
def test_nasty_override_is_one_clean_error_or_a_sound_run(base, overrides):
    args = [*BASES[base], "plots=false", *(f"{f}={v}" for f, v in overrides)]
    stderr = io.StringIO()
    with time_limit(TIME_LIMIT_S):
        with contextlib.redirect_stderr(stderr):
            try:
                cfg = compose_or_exit(args)
            except SystemExit as e:
                assert e.code == 2
                line = stderr.getvalue()
                assert_one_line(line)
                assert line.startswith("error: "), line
                return
        try:
            validate_config(cfg)
        except (ConfigError, WorkloadError) as e:
            assert_one_line(str(e))
            return
        if cfg.workload.num_requests > MAX_REQUESTS:
            return  # a valid size, too many requests to simulate here
        assert_sound_run(cfg)


# ---- (c) malformed model config.json -----------------------------------------------------------
LLAMA = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 256,
         "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 512,
         "vocab_size": 1000, "max_position_embeddings": 2048}
HF_KEYS = (*LLAMA, "torch_dtype", "quantization_config", "layer_types", "sliding_window",
           "use_sliding_window", "full_attention_interval", "head_dim", "num_local_experts")
JSON_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 2**40), st.floats(-1e3, 1e3),
                        st.text(max_size=5), st.lists(st.integers(0, 3), max_size=3),
                        st.sampled_from([{}, {"quant_method": "fp8"}, ["full_attention"],
                                         ["LlamaForCausalLM"], ["Nope"], 10**12]))


@settings(max_examples=150, **SETTINGS)
@given(changes=st.dictionaries(st.sampled_from(HF_KEYS), JSON_VALUES, min_size=1, max_size=3))
def test_malformed_model_config_is_one_clean_error_or_fields(changes):
    with time_limit(TIME_LIMIT_S):
        try:
            fields = model_fields({**LLAMA, **changes}, "fuzzed")
        except ConfigError as e:
            assert_one_line(str(e))
            assert str(e).startswith("model="), str(e)
            return
    assert fields["architecture"] in READERS
