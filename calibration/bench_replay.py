"""Replay measured benchmark runs (``calibration.bench_runs``) in the simulator, as their
client ran them, and compare every metric.

A run maps to the simulator's config (``plan_run``): the conf model whose ``hf_id`` matches
the served checkpoint (``-FP8`` checkpoints: block-scaled FP8 weights), the engine as backend
and scheduler, the serve command's tensor/pipeline/expert parallelism and limits
(``--max-model-len``, ``--max-num-batched-tokens``, ``--gpu-memory-utilization``) and the
engine's default prefix caching (on, unless the command turns it off), or the reason it cannot
be simulated (speculative decoding, a model without a conf file). Its requests
(``run_requests``) are sent as ``vllm bench serve`` sends them: with ``request_rate=inf`` every
request at t=0; with ``max_concurrency=N`` by N clients, each sending its next request when its
previous one ends; at a finite rate as Poisson arrivals.
Lengths are the run's own per request when known; for a ShareGPT run known only by its means,
drawn to those means under the client's filter (``scenarios.sharegpt_dataset``, an
approximation); else the means (fixed-length ``random`` runs).
"""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
from hydra import compose

import conf.schema  # noqa: F401  (registers the config schemas)
import sim.builders
from analysis.metrics import summarize
from calibration.bench_runs import METRICS, BenchRun
from calibration.config import SimConfigContext
from calibration.silicon_rows import calibration_file, model_index
from scenarios import WorkloadError
from scenarios.sharegpt_dataset import sharegpt_lengths
from sim import simulate
from sim.errors import ConfigError

UNSUPPORTED_FLAGS = {
    "speculative-algorithm": "speculative decoding is not modelled",
    "speculative-model": "speculative decoding is not modelled",
    "speculative-config": "speculative decoding is not modelled",
    "enable-dp-attention": "attention data parallelism is not modelled",
}
# serve-command flags → the simulator's keys (the same meaning)
LIMIT_FLAGS = {"max-model-len": "scheduler.max_model_len",
               "max-seq-len": "scheduler.max_model_len",
               "max-num-batched-tokens": "scheduler.max_num_batched_tokens",
               "max-num-seqs": "scheduler.max_num_seqs",
               "gpu-memory-utilization": "kv_cache.gpu_memory_utilization",
               "mem-fraction-static": "kv_cache.mem_fraction_static",
               "free-gpu-memory-fraction": "kv_cache.gpu_memory_utilization",
               "cuda-graph-max-bs": "backend.cuda_graph_max_bs"}
SWITCH_FLAGS = {"enforce-eager": "backend.enforce_eager=true",
                "disable-cuda-graph": "backend.enforce_eager=true",
                "async-scheduling": "backend.async_scheduling=true",
                # sliding-window layers keep every token (sim.kv.rules)
                "disable-hybrid-kv-cache-manager": "kv_cache.sliding_window_paging=full",
                "disable-hybrid-swa-memory": "kv_cache.sliding_window_paging=full"}
_VARIANTS = ("-fp8", "-instruct-2507", "-instruct", "-thinking-2507")
# Every engine of these runs caches KV blocks by default, so a request preempted by recompute
# restarts from whatever of its blocks are still cached: vLLM V1 (vLLM >= 0.8;
# tests/v1/engine/test_engine_args.py, "V1 turns on prefix caching by default"), SGLang's radix
# cache (server_args.py: disable_radix_cache = False), TensorRT-LLM's block reuse
# (llmapi/llm_args.py: KvCacheConfig.enable_block_reuse = True). These flags turn it off.
PREFIX_CACHE_OFF_FLAGS = ("no-enable-prefix-caching", "disable-radix-cache")


def normalize_id(hf_id: str) -> str:
    """A Hugging Face id without its checkpoint variants (``-FP8``, ``-Instruct-2507``...)."""
    s = str(hf_id).strip().lower()
    changed = True
    while changed:
        changed = False
        for v in _VARIANTS:
            if s.endswith(v):
                s, changed = s[: -len(v)], True
    return s


def prefix_caching_by_default(backend: str, version: str) -> bool:
    """Whether ``backend`` at ``version`` (``v0.11.0``; "" when unknown: a current one) caches
    KV blocks unless told not to (``PREFIX_CACHE_OFF_FLAGS``): vLLM from V1 (0.8) on, SGLang
    and TensorRT-LLM always."""
    if backend != "vllm":
        return True
    parts = re.findall(r"\d+", version)[:2]
    return len(parts) < 2 or (int(parts[0]), int(parts[1])) >= (0, 8)


def prefix_caching_override(backend: str, version: str = "",
                            serve_args: dict[str, str] | None = None) -> str:
    """``kv_cache.prefix_caching=...`` as the engine ran: its default, unless the serve
    command's flags turn it on or off."""
    args = serve_args or {}
    caches = (prefix_caching_by_default(backend, version)
              or "enable-prefix-caching" in args) and not any(
        flag in args for flag in PREFIX_CACHE_OFF_FLAGS)
    return f"kv_cache.prefix_caching={str(caches).lower()}"


def plan_run(run: BenchRun, hardware: str = "h100_sxm") -> dict:
    """The run's simulator overrides, or its ``reason`` (and ``note``s) when it cannot run."""
    notes = [run.note] if run.note else []
    if run.overrides is not None:  # the deployment is known: no look-up
        return {"id": run.id, "backend": run.backend, "model_path": run.model_path,
                "model": run.model_path, "tp": run.tp, "pp": run.pp, "reason": "",
                "overrides": list(run.overrides), "note": "; ".join(notes)}
    models = {normalize_id(v["hf_id"]): v for v in model_index().values()}
    model = models.get(normalize_id(run.model_path))
    reason = ""
    for flag, why in UNSUPPORTED_FLAGS.items():
        if flag in run.serve_args:
            reason = reason or f"--{flag}: {why}"
    if model is None:
        reason = reason or f"model {run.model_path}: no conf/model/*.yaml with that hf_id"
    if not calibration_file(hardware, run.backend).is_file():
        reason = reason or f"backend {run.backend}: not calibrated for {hardware}"
    if not run.num_prompts >= 1 or not run.input_len >= 1 or not run.output_len >= 1:
        reason = reason or "no requests, prompt or output tokens"
    plan = {"id": run.id, "backend": run.backend, "model_path": run.model_path,
            "model": model["name"] if model else "", "tp": run.tp, "pp": run.pp,
            "reason": reason, "overrides": []}
    if reason:
        return plan | {"note": "; ".join(notes)}
    fp8 = run.model_path.lower().endswith("-fp8")
    dtype = "fp8_block" if fp8 else "bfloat16"
    if fp8 and model["num_experts"]:
        notes.append("FP8 checkpoint: block-scaled FP8 weights and experts")
    ep = run.tp if run.ep else 1
    overrides = [f"model={model['name']}", f"hardware={hardware}", f"backend={run.backend}",
                 f"scheduler={run.backend}", f"model.dtype={dtype}",
                 *([f"model.moe_dtype={dtype}"] if fp8 and model["num_experts"] else []),
                 f"cluster.tensor_parallel_size={run.tp}",
                 f"cluster.pipeline_parallel_size={run.pp}",
                 f"cluster.expert_parallel_size={ep}", "slo=none", "plots=false",
                 "progress=false"]
    for flag, key in LIMIT_FLAGS.items():
        if flag in run.serve_args:
            overrides.append(f"{key}={run.serve_args[flag]}")
    overrides += [o for flag, o in SWITCH_FLAGS.items() if flag in run.serve_args]
    overrides.append(prefix_caching_override(run.backend, run.engine_version, run.serve_args))
    for flag in ("attention-backend", "enable-torch-compile"):
        if flag in run.serve_args:
            notes.append(f"--{flag} {run.serve_args[flag]}".strip() + ": not modelled")
    return plan | {"overrides": overrides, "note": "; ".join(notes)}


def run_requests(run: BenchRun, seed: int = 0) -> pd.DataFrame:
    """The request table of ``run`` as its client sent it (module doc)."""
    n = run.num_prompts
    if run.input_lens is not None and run.output_lens is not None:
        inputs = np.asarray(run.input_lens, np.int64)
        outputs = np.maximum(np.asarray(run.output_lens, np.int64), 1)
    elif run.dataset == "sharegpt":
        try:  # a stream of their own: lengths independent of a finite rate's arrival gaps
            inputs, outputs = sharegpt_lengths(n, run.input_len, run.output_len,
                                               np.random.default_rng([seed, 1]))
        except ValueError as e:
            raise WorkloadError("mean lengths", f"{run.input_len:g}/{run.output_len:g}",
                                str(e)) from None
    else:
        inputs = np.full(n, max(1, round(run.input_len)), np.int64)
        outputs = np.full(n, max(1, round(run.output_len)), np.int64)
    if math.isinf(run.request_rate):
        sends = np.zeros(n)
    else:
        gaps = np.random.default_rng(seed).exponential(1.0 / run.request_rate, n)
        sends = np.concatenate([[0.0], np.cumsum(gaps[:-1])])
    client = np.full(n, -1, np.int64)
    if run.max_concurrency and run.max_concurrency < n:
        # N clients: the first N requests go out as sent, each later one when a client is
        # free (vllm bench serve's semaphore); at rate=inf that is a closed loop
        c = run.max_concurrency
        client = np.arange(n) % c
        if math.isinf(run.request_rate):
            sends[c:] = np.nan
    return pd.DataFrame({"arrival_time_s": sends, "input_tokens": inputs,
                         "output_tokens": outputs, "client": client,
                         "think_time_s": np.zeros(n)})


class Replayer(SimConfigContext):
    """Composes and simulates planned runs inside one Hydra context."""

    def compose(self, plan: dict, extra: list[str] = ()):
        """The checked config of a plan (``ConfigError`` if the simulator refuses it)."""
        cfg = compose("config", overrides=[*plan["overrides"], *extra])
        sim.builders.check_config(cfg)
        return cfg

    def predict(self, run: BenchRun, plan: dict, extra: list[str] = ()) -> dict:
        """The run's metrics as simulated (``METRICS`` names), or ``reason`` if refused."""
        try:
            cfg = self.compose(plan, extra)
            records = simulate(cfg, run_requests(run, int(cfg.seed)))
        except (ConfigError, WorkloadError) as e:
            return {"reason": f"refused by the simulator: {e}"}
        s = summarize(records)
        out = {f"pred_{m}": float(s.get(m, math.nan)) for m in METRICS}
        out["sim_rejected"] = int(s["rejected"])
        out["sim_preemptions"] = int(s["num_preemptions"])
        out["sim_engine"] = str(records.meta.get("engine", ""))
        return out


def replay(runs: list[BenchRun], hardware: str = "h100_sxm", extra: dict | None = None
           ) -> pd.DataFrame:
    """One row per run: its plan, measured (``meas_<metric>``) and predicted
    (``pred_<metric>``) metrics and the signed error ``err_<metric>`` = (pred − meas) / meas.
    ``extra``: per backend, overrides added to its runs (a fit's trial parameters)."""
    rows = []
    with Replayer() as rp:
        for run in runs:
            plan = plan_run(run, hardware)
            row = {k: v for k, v in plan.items() if k != "overrides"}
            row |= {"num_prompts": run.num_prompts, "input_len": run.input_len,
                    "output_len": run.output_len, "max_concurrency": run.max_concurrency or 0,
                    "engine_version": run.engine_version}
            row |= {f"meas_{m}": run.measured.get(m, math.nan) for m in METRICS}
            if not plan["reason"]:
                res = rp.predict(run, plan, (extra or {}).get(run.backend, []))
                row["reason"] = res.pop("reason", "")
                row |= res
            rows.append(row)
    return add_errors(pd.DataFrame(rows))


def add_errors(table: pd.DataFrame) -> pd.DataFrame:
    """``err_<metric>`` = (pred − meas) / meas for every metric both sides have."""
    for m in METRICS:
        pred = table.get(f"pred_{m}", pd.Series(np.nan, index=table.index)).astype(float)
        meas = table[f"meas_{m}"].astype(float)
        table[f"err_{m}"] = (pred - meas) / meas
    return table


def error_table(table: pd.DataFrame, metrics=METRICS) -> pd.DataFrame:
    """Per backend and metric: n, median and p90 absolute % error, signed median %."""
    out = []
    for backend, g in table.groupby("backend"):
        for m in metrics:
            e = g[f"err_{m}"].dropna().to_numpy() * 100
            if len(e):
                out.append({"backend": backend, "metric": m, "n": len(e),
                            "median_abs_pct": float(np.median(np.abs(e))),
                            "p90_abs_pct": float(np.percentile(np.abs(e), 90)),
                            "signed_median_pct": float(np.median(e))})
    return pd.DataFrame(out, columns=["backend", "metric", "n", "median_abs_pct",
                                      "p90_abs_pct", "signed_median_pct"])


def format_error_table(errors: pd.DataFrame, title: str) -> str:
    """``error_table`` as a Markdown table under ``title``."""
    lines = [f"### {title}", "", "| backend | metric | n | median abs % | p90 abs % | "
             "signed median % |", "|---|---|---:|---:|---:|---:|"]
    for r in errors.itertuples():
        lines.append(f"| {r.backend} | {r.metric} | {r.n} | {r.median_abs_pct:.1f} | "
                     f"{r.p90_abs_pct:.1f} | {r.signed_median_pct:+.1f} |")
    return "\n".join(lines)


def format_split_tables(tables: dict[str, pd.DataFrame], title: str) -> str:
    """Per split (train, then held_out) and named table (e.g. before / after a fit): the
    ``error_table`` of its simulated runs under "<split> runs, <name> <title>"; a split
    without a run prints nothing."""
    out = []
    for split in ("train", "held_out"):
        for name, t in tables.items():
            part = t[(t["split"] == split) & (t["reason"] == "")]
            if len(part):
                out.append(format_error_table(error_table(part),
                                              f"{split} runs, {name} {title}"))
    return "\n".join(out)


def model_ratio_table(table: pd.DataFrame) -> pd.DataFrame:
    """Per backend, client (burst or closed loop), model and tensor-parallel size: n and
    the median, min and max of predicted ÷ measured request throughput. Where the error
    lives: a gap that one model has and another not is no single cost of the engine."""
    t = table.assign(ratio=table["pred_request_throughput"] / table["meas_request_throughput"],
                     client=np.where(table["max_concurrency"] > 0, "closed loop", "burst"))
    t = t[np.isfinite(t["ratio"]) & (t["ratio"] > 0)]
    cols = ["backend", "client", "model", "tp"]
    if t.empty:
        return pd.DataFrame(columns=[*cols, "n", "median", "min", "max"])
    return (t.groupby(cols)["ratio"].agg(n="size", median="median", min="min", max="max")
            .reset_index())


def format_ratio_table(ratios: pd.DataFrame, title: str) -> str:
    """``model_ratio_table`` as a Markdown table under ``title``."""
    lines = [f"### {title}", "", "| backend | client | model | TP | n | median | min | max |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in ratios.itertuples():
        lines.append(f"| {r.backend} | {r.client} | {r.model} | {r.tp} | {r.n} | "
                     f"{r.median:.2f} | {r.min:.2f} | {r.max:.2f} |")
    return "\n".join(lines)
