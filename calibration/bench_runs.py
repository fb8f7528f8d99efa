"""Measured serving benchmarks as runs the simulator can replay: one ``BenchRun`` per
``vllm bench serve`` (or SGLang ``bench_serving``) run, read from

- the gpustack H100 CSV (``../shared/data/gpustack_h100/``: one row per run and metric, the
  engine's serve command in ``notes``; ``read_gpustack``), or
- the result files the tools write with ``--save-result`` (vLLM's
  ``vllm/benchmarks/serve.py``: ``num_prompts``, ``request_rate``, ``max_concurrency``,
  ``total_input_tokens``, ``mean_ttft_ms`` …, and with ``--save-detailed`` the per-request
  ``input_lens``, ``output_lens``, ``ttfts``, ``itls``; SGLang's ``bench_serving`` writes the
  same names; ``read_result_file``).

A run records how the client sent its requests: ``request_rate`` (``inf``: every request at
t=0; otherwise Poisson at that rate, ``burstiness`` 1) and ``max_concurrency`` (at most that
many in flight: N closed-loop clients), the lengths (per request when the file has them, else
the means; for a ShareGPT run known only by its means, lengths drawn to them by
``scenarios.sharegpt_dataset``), and the measured metrics under the tool's names
(``METRICS``).
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from analysis.inputs import fields_of, read_csv, read_json
from sim.errors import ConfigError

# vllm bench serve's metric names (ms for latencies, per second for throughputs)
METRICS = ("request_throughput", "output_throughput", "total_token_throughput",
           "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms",
           "p99_tpot_ms", "mean_itl_ms", "median_itl_ms")
_GPUSTACK_METRIC = {"output_token_throughput": "output_throughput"}  # the CSV's other names
ENGINES = {"vllm": "vllm", "sglang": "sglang", "tensorrt-llm": "trtllm"}


@dataclass
class BenchRun:
    """One measured benchmark run and how its client sent the requests."""

    id: str
    backend: str  # vllm | sglang | trtllm
    model_path: str  # the checkpoint the engine served (Hugging Face id)
    num_prompts: int
    input_len: float  # mean prompt tokens (fixed when ``fixed_lengths``)
    output_len: float  # mean generated tokens
    request_rate: float = math.inf
    max_concurrency: int | None = None
    fixed_lengths: bool = True
    dataset: str = ""  # "sharegpt": lengths vary around the means (scenarios.sharegpt_dataset)
    input_lens: list[int] | None = None  # per request, when the result file has them
    output_lens: list[int] | None = None
    measured: dict[str, float] = field(default_factory=dict)
    engine_version: str = ""
    serve_args: dict[str, str] = field(default_factory=dict)  # the serve command's flags
    tp: int = 1
    pp: int = 1
    ep: bool = False
    source: str = ""
    note: str = ""
    # the simulator's overrides for this run when they are known (``from-bench``: the
    # deployment named on the command line), instead of looking the model up by its id
    overrides: list[str] | None = None


# ---- the serve command ----------------------------------------------------------
_FLAG_ALIASES = {"-tp": "tensor-parallel-size", "--tp": "tensor-parallel-size",
                 "--tp-size": "tensor-parallel-size", "-pp": "pipeline-parallel-size",
                 "--pp-size": "pipeline-parallel-size", "--ep-size": "expert-parallel-size",
                 "--model-path": "model", "--model": "model"}
_SWITCHES = {"--enable-expert-parallel", "--async-scheduling", "--enable-torch-compile",
             "--enable_chunked_prefill", "--enforce-eager", "--disable-cuda-graph",
             "--enable-prefix-caching", "--no-enable-prefix-caching", "--disable-radix-cache",
             "--disable-hybrid-kv-cache-manager", "--disable-hybrid-swa-memory"}


def parse_serve_command(cmd: str) -> dict[str, str]:
    """The flags of a ``vllm serve`` / ``sglang.launch_server`` / ``trtllm-serve`` command as
    ``{flag name without dashes (underscores as dashes): value}`` ("" for a switch); the
    model, positional or ``--model(-path)``, under ``model``."""
    starts = [cmd.find(k) for k in ("vllm serve", "sglang.launch_server", "trtllm-serve")
              if k in cmd]
    words = shlex.split(cmd[min(starts, default=0):].replace("\\", " "))
    while words and words[0] in ("vllm", "serve", "sglang.launch_server", "trtllm-serve"):
        words = words[1:]
    out: dict[str, str] = {}
    if words and not words[0].startswith("-"):
        out["model"], words = words[0], words[1:]
    i = 0
    while i < len(words):
        w = words[i]
        if w.startswith("-"):
            name, _, value = w.partition("=")
            key = _FLAG_ALIASES.get(name, name.lstrip("-").replace("_", "-"))
            if value:
                out[key] = value
            elif name in _SWITCHES or i + 1 >= len(words) or words[i + 1].startswith("-"):
                out[key] = ""
            else:
                out[key] = words[i + 1]
                i += 1
        i += 1
    return out


# ---- gpustack CSV ----------------------------------------------------------------
def _number(text: str) -> float:
    m = re.search(r"[-+]?\d+(\.\d+)?", str(text))
    return float(m.group()) if m else math.nan


def _model_path(args: dict[str, str], fallback: str) -> str:
    path = args.get("model") or fallback
    return path if "/" in path else {"GLM-4.5-Air": "zai-org/GLM-4.5-Air"}.get(
        path, f"Qwen/{path}" if path.lower().startswith("qwen") else path)


def read_gpustack(path: str | Path) -> list[BenchRun]:
    """The runs of the gpustack CSV (README of ``../shared/data/gpustack_h100``): one per
    (source block, engine, serve command, lengths, client), its 11 metrics measured."""
    path = Path(path)
    df = read_csv(path, "gpustack_csv", "a gpustack benchmark CSV (one row per run and "
                  "metric)", ("source", "engine", "model", "dataset_or_lengths", "input_len",
                              "output_len", "request_rate_or_concurrency", "metric", "value",
                              "notes"))
    keys = ["source", "engine", "model", "dataset_or_lengths", "input_len", "output_len",
            "request_rate_or_concurrency", "notes"]
    runs = []
    # a block measured twice under one header has each metric twice: the k-th of each is run k
    df = df.assign(_k=df.groupby([*keys, "metric"], sort=False).cumcount())
    for i, (key, group) in enumerate(df.groupby([*keys, "_k"], sort=False)):
        source, engine, model, dataset, isl, osl, client, notes, _ = key
        is_random = str(dataset).startswith("random")
        name = str(engine).split(" ")[0].lower()
        cmd = str(notes).split("serve cmd:", 1)[-1].strip()
        args = parse_serve_command(cmd)
        totals = re.search(r"total in/out tokens (\d+)/(\d+)", str(notes))
        count = re.search(r"(\d+) requests", str(notes))
        n = int(count.group(1)) if count else 1000
        input_len, output_len = _number(isl), _number(osl)
        observed = re.search(r"observed avg ([\d.]+)", str(osl))
        if totals:
            input_len, output_len = int(totals.group(1)) / n, int(totals.group(2)) / n
        elif observed:
            output_len = float(observed.group(1))
        conc = re.search(r"max_concurrency=(\d+)", str(client))
        version = re.search(rf"{re.escape(str(engine).split(' ')[0])}: (v[\w.]+)", str(engine))
        measured = {_GPUSTACK_METRIC.get(m, m if m.endswith("throughput") else f"{m}_ms"):
                    float(v) for m, v in zip(group["metric"], group["value"], strict=True)}
        runs.append(BenchRun(
            id=f"gpustack_{i:03d}", backend=ENGINES.get(name, name),
            model_path=_model_path(args, str(model)), num_prompts=n, input_len=input_len,
            output_len=output_len, max_concurrency=int(conc.group(1)) if conc else None,
            fixed_lengths=is_random, dataset="random" if is_random else "sharegpt",
            measured=measured,
            engine_version=version.group(1) if version else "", serve_args=args,
            tp=int(args.get("tensor-parallel-size", 1)),
            pp=int(args.get("pipeline-parallel-size", 1)),
            ep="enable-expert-parallel" in args or int(args.get("expert-parallel-size", 1)) > 1,
            source=str(source), note="" if is_random else
            "ShareGPT: lengths drawn to the means (an approximation)"))
    return runs


# ---- result files ------------------------------------------------------------------
def read_result_file(path: str | Path, backend: str, model_path: str = "") -> BenchRun:
    """A ``vllm bench serve --save-result`` (or SGLang ``bench_serving``) JSON file."""
    path = Path(path)
    what = "a vllm bench serve --save-result file (a JSON object)"
    doc = read_json(path, "results", what)
    with fields_of(path, "results", what):
        return _result_run(doc, path, backend, model_path)


def _result_run(doc: dict, path: Path, backend: str, model_path: str) -> BenchRun:
    """The run of one result file's JSON object."""
    for key in ("completed", "total_input_tokens", "total_output_tokens"):
        if not isinstance(doc.get(key), int | float) or doc[key] < 0:
            raise ConfigError(key, doc.get(key), "a number >= 0, as vllm bench serve writes it")
    n = int(doc.get("num_prompts") or doc["completed"])
    completed = max(int(doc["completed"]), 1)
    rate = doc.get("request_rate", "inf")
    rate = math.inf if rate in ("inf", None) or float(rate) == math.inf else float(rate)
    conc = doc.get("max_concurrency")
    input_lens = doc.get("input_lens")
    output_lens = doc.get("output_lens")
    if input_lens is not None and (len(input_lens) != n or output_lens is None
                                   or len(output_lens) != n):
        input_lens = output_lens = None  # not one length per prompt: use the means
    measured = {m: float(doc[m]) for m in METRICS if isinstance(doc.get(m), int | float)}
    return BenchRun(
        id=path.stem, backend=backend, model_path=model_path or str(doc.get("model_id", "")),
        num_prompts=n, input_len=doc["total_input_tokens"] / completed,
        output_len=doc["total_output_tokens"] / completed, request_rate=rate,
        max_concurrency=int(conc) if conc else None, fixed_lengths=input_lens is not None,
        input_lens=[int(x) for x in input_lens] if input_lens is not None else None,
        output_lens=[int(x) for x in output_lens] if output_lens is not None else None,
        measured=measured, source=str(path),
        note="" if input_lens is not None else "no per-request lengths: the means")
