"""Silicon benchmark rows → the simulator's config: which conf model, backend, scheduler,
parallel layout and dtype each row of a ``silicon_sample``-layout CSV maps to, or the reason it
cannot be simulated (``python -m calibration validate``)."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

import conf
import sim.builders
from sim.config.backend import BACKENDS

# ---- rows → configs ------------------------------------------------------------
SUFFIXES = ("-instruct", "-fp8")  # checkpoint variants that share the architecture
BF16 = ("bf16", "bfloat16")
FP8 = ("fp8", "fp8_block")
FP4 = ("fp4", "nvfp4", "mxfp4")  # the rows' 4-bit labels
_CONCURRENCY = r"silicon_concurrency=(\d+)"
# SemiAnalysis InferenceX exports (``source_file=<date>.csv`` or ``db-dump/...``): their client,
# a fork of vLLM's ``benchmark_serving.py``, draws every prompt and reply length uniformly from
# [int(0.8 L), L] (``--random-range-ratio 0.8``: InferenceX ``benchmark-tmpl.yml``
# ``RANDOM_RANGE_RATIO: 0.8``, ``benchmark_serving.py`` ``sample_uniform``; ``--ignore-eos``
# holds the reply to its drawn length). The other rows' tools (AIPerf with ``--isl-stddev 0
# --osl-stddev 0``) send fixed lengths.
_INFERENCEX = r"^(?:source_file=\d{4}-\d\d-\d\d\.csv|db-dump/)"
INFERENCEX_RANGE_RATIO = 0.8
# Rows of aiconfigurator's own gap analysis (``aic-auto-gap-analysis`` in the source) measured
# deployments that aiconfigurator generated for the row's ``batch_size`` (each such row's
# concurrency is its batch_size × attention DP), as its generator writes them (ai-dynamo/
# aiconfigurator v0.2.0 ``cli/backends/trtllm.py``, v0.3.0-v0.4.0
# ``generator/backends/trtllm.py``, v0.5.0+ ``generator/rule_plugin/{trtllm,vllm}.rule``,
# ``backend_templates/*/run.sh.j2``):
# - engine limits: max batch = batch_size; TensorRT-LLM's ``max_num_tokens`` and vLLM's
#   ``--max-num-batched-tokens`` = batch_size + isl + 1500; TensorRT-LLM's context chunking off
#   (its templates' default). A step holds the batch's decodes and about one new prompt, not
#   the engine default's 8,192 tokens of prompts. CUDA graphs captured for every batch size
#   up to batch_size (``rule_plugin/benchmark/{trtllm,vllm}.rule``: ``cuda_graph_batch_sizes =
#   range(1, max_batch_size + 1)``), so every decode batch replays one. TensorRT-LLM keeps 80%
#   of the free memory for its KV cache, not the engine's 90% (``backend_templates/trtllm/
#   extra_engine_args.<version>.yaml.j2``: ``free_gpu_memory_fraction: {{ ... | default(0.80)
#   }}``, every version from 0.20.0 and 1.0.0rc3 on).
# - the API server is Dynamo's frontend (``python3 -m dynamo.frontend`` in front of the
#   workers; 20 of these rows name a Dynamo image), a Rust server that tokenizes and streams
#   on one Tokio worker thread per core: it does not queue a burst or a step's tokens behind
#   one another as the engines' own single-threaded API servers do (``sim.engine.frontend``).
#   Its costs are in no data here, so these rows run without a frontend (a wire).
# The generator wrote TensorRT-LLM deployments from v0.2.0 (2025-09), vLLM and SGLang ones only
# from v0.5.0 (2025-12); 78 of the 84 SGLang rows ran SGLang 0.5.1.post1 (2025-08), so how the
# SGLang rows were deployed is not known: they keep the engine's defaults and API server.
_GAP_ANALYSIS = "aic-auto-gap-analysis"
GENERATOR_SPARE_TOKENS = 1500
GENERATOR_TRTLLM_KV_FRACTION = 0.8
GENERATED_BACKENDS = ("trtllm", "vllm")
NO_FRONTEND = [f"backend.frontend.{key}=0" for key in
               ("per_request_ms", "per_prompt_token_us", "per_output_token_us", "latency_ms")]


def _norm(hf_id: str) -> str:
    s = str(hf_id).strip().lower()
    while s.endswith(SUFFIXES):
        s = s[: s.rfind("-")]
    return s


def model_index() -> dict[str, dict]:
    """``conf/model`` by normalized ``hf_id`` (lower case, without ``-Instruct``/``-FP8``):
    ``{name, hf_id, num_experts, dtype, moe_dtype}`` (the checkpoint's weight dtypes)."""
    out: dict[str, dict] = {}
    for path in sorted((Path(conf.__file__).parent / "model").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text()) or {}
        if doc.get("hf_id"):
            out.setdefault(_norm(doc["hf_id"]), {"name": path.stem, "hf_id": doc["hf_id"],
                                                 "num_experts": doc.get("num_experts") or 0,
                                                 "dtype": doc.get("dtype", "bfloat16"),
                                                 "moe_dtype": doc.get("moe_dtype") or ""})
    return out


def range_ratio_of(rows: pd.DataFrame) -> pd.Series:
    """Each row's client length spread: the shortest length it drew as a fraction of ``isl`` /
    ``osl`` (``INFERENCEX_RANGE_RATIO`` for InferenceX's rows; 1.0, fixed lengths, else)."""
    src = rows.get("silicon_data_source", pd.Series("", index=rows.index)).astype(str)
    return src.str.contains(_INFERENCEX).map({True: INFERENCEX_RANGE_RATIO, False: 1.0})


def length_overrides(isl: int, osl: int, ratio: float) -> list[str]:
    """The workload's prompt and reply lengths: fixed, or uniform on ``[int(ratio·L), L]`` as
    the InferenceX client draws them (``benchmark_serving.py`` ``sample_uniform``)."""
    if ratio >= 1.0:
        return [f"workload.input_tokens={isl}", f"workload.output_tokens={osl}"]
    out = []
    for side, n in (("input", isl), ("output", osl)):
        out += [f"workload.{side}.dist=uniform", f"workload.{side}.low={max(int(n * ratio), 1)}",
                f"workload.{side}.high={n}"]
    return out


def generated_deployment_overrides(row: dict, backend: str, isl: int, osl: int) -> list[str]:
    """The deployment aiconfigurator's generator wrote for a gap-analysis row (``_GAP_ANALYSIS``
    above): its engine limits and Dynamo's frontend. None for other rows, and none where the
    row's concurrency exceeds its batch size × attention DP (more aggregated workers than the
    row states: the generator's per-worker limits would queue the extra clients)."""
    if _GAP_ANALYSIS not in str(row.get("silicon_data_source", "")) or row["mode"] != "agg" \
            or backend not in GENERATED_BACKENDS:
        return []
    batch = _size(row.get("batch_size"))
    if int(row["concurrency"]) > batch * _size(row.get("attention_dp_size")):
        return []
    limits = [f"scheduler.max_num_batched_tokens={batch + isl + GENERATOR_SPARE_TOKENS}"]
    if backend == "trtllm":
        # unchunked, every prompt must fit the token budget; the row's longest sequence does
        limits += ["scheduler.enable_chunked_prefill=false", f"scheduler.max_model_len={isl + osl}",
                   f"kv_cache.gpu_memory_utilization={GENERATOR_TRTLLM_KV_FRACTION}"]
    graphs = f"backend.cuda_graph_batch_sizes=[{','.join(map(str, range(1, batch + 1)))}]"
    return [f"scheduler.max_num_seqs={batch}", *limits, graphs, *NO_FRONTEND]


def concurrency_of(rows: pd.DataFrame) -> pd.Series:
    """Closed-loop clients per row: ``silicon_concurrency=N`` of ``silicon_data_source`` when
    stated, else, for aggregated rows, ``batch_size × attention_dp_size`` (missing DP counts
    as 1); 0 if neither. A disaggregated row's concurrency must be stated: its pools' batch
    sizes do not give it (``decode_batch_size × decode_num_workers`` contradicts the measured
    TPOT of the rows that lack it)."""
    src = rows.get("silicon_data_source", pd.Series("", index=rows.index)).astype(str)
    stated = src.str.extract(_CONCURRENCY)[0].astype(float)
    dp = rows.get("attention_dp_size", pd.Series(1.0, index=rows.index)).fillna(1.0)
    derived = rows.get("batch_size", pd.Series(np.nan, index=rows.index)).astype(float) * dp
    mode = rows.get("mode", pd.Series("agg", index=rows.index))
    derived = derived.where(mode != "disagg")
    return stated.fillna(derived).fillna(0).round().astype(int)


def _size(v) -> int:
    """A parallel size from the CSV; missing or 0 (not used) is 1."""
    return int(v) if pd.notna(v) and int(v) > 0 else 1


def _quant(v) -> str | None:
    return None if pd.isna(v) or str(v).strip() == "" else str(v).strip().lower()


def dtypes_of(row: dict, num_experts: int, checkpoint: str = "bfloat16",
              checkpoint_moe: str = "") -> tuple[str, str | None, str]:
    """``(model.dtype, model.moe_dtype or None to keep the model's, reason)`` of a CSV row:
    fp8 → fp8, fp8_block (128×128 block scales) → fp8_block; bf16 or unset → bfloat16; 4-bit
    weights are not modelled, but for a checkpoint whose experts are MXFP4 (gpt-oss: 4-bit
    experts, bf16 elsewhere) a 4-bit row is the checkpoint as published, served as it is
    (on Hopper its experts run weight-only 4-bit kernels with bf16 activations: no FP4 tensor
    cores; the rows label it ``nvfp4``).

    The rows' ``fp8`` label does not say whether scales are per tensor or per block. Routed
    experts run the fused-MoE kernel of the checkpoint's own format, so an ``fp8`` row of a
    block-scaled checkpoint (``checkpoint = fp8_block``, e.g. MiniMax-M2.5) gets block-scaled
    experts; the dense GEMMs follow the row's label (per-tensor fp8), as the tables measured for
    that label. (vLLM's measured block-scaled GEMM has a ~60 µs floor at small M that the rows'
    own TPOT rules out for serving.)"""
    q = _quant(row.get("gemm_quant_mode")) or _quant(row.get("precision"))
    if checkpoint_moe == "mxfp4" and q in FP4 and (_quant(row.get("moe_quant_mode")) or q) \
            in FP4:
        return checkpoint, None, ""
    if q is None or q in BF16:
        dtype = "bfloat16"
    elif q in FP8:
        dtype = q
    else:
        return "", None, f"weights gemm_quant_mode={q} ({'4-bit' if '4' in q else 'this quant'}" \
                         " weights) are not modelled; bf16 and fp8 are"
    mq = _quant(row.get("moe_quant_mode"))
    if not num_experts or mq is None:
        return dtype, None, ""
    if mq in FP8:
        if mq == "fp8" and checkpoint == "fp8_block":
            mq = "fp8_block"
        return dtype, "" if dtype == mq else mq, ""
    if mq in BF16:
        return dtype, "" if dtype == "bfloat16" else "bfloat16", ""
    return dtype, None, f"experts moe_quant_mode={mq} are not modelled; bf16 and fp8 are"


def kv_dtype_of(row: dict, dtype: str) -> str:
    """``kv_cache.dtype`` of a row: TensorRT-LLM runs FP8 rows with an FP8 KV cache (the
    default aiconfigurator states for its TensorRT-LLM runs: gemm, KV cache and MoE in fp8);
    vLLM and SGLang keep ``auto`` (bf16 activations and KV cache under fp8 weights)."""
    return "fp8" if row["backend"] == "trtllm" and dtype in FP8 else "auto"


@functools.cache
def hardware_doc(hardware: str) -> dict:
    """``conf/hardware/<hardware>.yaml`` as read (once per name)."""
    path = Path(conf.__file__).parent / "hardware" / f"{hardware}.yaml"
    return yaml.safe_load(path.read_text()) or {}


def calibration_file(hardware: str, backend: str) -> Path:
    """``sim/cost/calibrated/<hardware's calibration>/<backend>.yaml``."""
    hw = hardware_doc(hardware)
    return Path(sim.builders.__file__).parent / "cost" / "calibrated" / \
        str(hw.get("calibration", hardware)) / f"{backend}.yaml"


def layout_of(row: dict, hardware: str) -> tuple[dict, list[str], str]:
    """A row's parallel layout: ``({tp, pp, ep, dp}, cluster overrides, reason)``.

    Aggregated rows: one engine of ``tp_size × pp_size`` GPUs. Disaggregated rows
    (``cluster=disagg``): ``prefill_num_workers`` engines of ``prefill_tp_size`` GPUs and
    ``decode_num_workers`` of ``decode_tp_size``; the KV cache moves between them over the
    NVLink when both pools fit in one node (``hardware.gpus_per_node``), else over the
    inter-node network (``hardware.internode_bandwidth``). Attention data parallelism is not
    modelled (the reason names it); the pools' expert parallelism must agree.
    """
    if row["mode"] == "agg":
        tp, pp = _size(row.get("tp_size")), _size(row.get("pp_size"))
        ep, dp = _size(row.get("moe_ep_size")), _size(row.get("attention_dp_size"))
        return ({"tp": tp, "pp": pp, "ep": ep, "dp": dp},
                [f"cluster.tensor_parallel_size={tp}", f"cluster.pipeline_parallel_size={pp}",
                 f"cluster.expert_parallel_size={ep}", f"cluster.data_parallel_size={dp}"], "")
    if row["mode"] != "disagg":
        return {}, [], f"mode={row['mode']}: not agg or disagg"
    pools = {p: {k: _size(row.get(f"{p}_{k}")) for k in
                 ("num_workers", "tp_size", "pp_size", "attention_dp_size", "moe_ep_size")}
             for p in ("prefill", "decode")}
    for p, v in pools.items():
        if v["attention_dp_size"] > 1:
            return {}, [], f"{p}_attention_dp_size={v['attention_dp_size']}: attention data " \
                           "parallelism is not modelled"
        if v["pp_size"] > 1:
            return {}, [], f"{p}_pp_size={v['pp_size']}: pipeline parallelism inside a " \
                           "disaggregated pool is not modelled"
    if pools["prefill"]["moe_ep_size"] != pools["decode"]["moe_ep_size"]:
        return {}, [], "prefill_moe_ep_size != decode_moe_ep_size: one expert layout for " \
                       "both pools is modelled"
    pf, dc = pools["prefill"], pools["decode"]
    gpus = pf["num_workers"] * pf["tp_size"] + dc["num_workers"] * dc["tp_size"]
    per_node = int(hardware_doc(hardware).get("gpus_per_node", 8))
    link = [] if gpus <= per_node else \
        ["cluster.kv_transfer_bandwidth=${hardware.internode_bandwidth}"]
    ep = pf["moe_ep_size"]
    return ({"tp": dc["tp_size"], "pp": 1, "ep": ep, "dp": 1},
            ["cluster=disagg", f"cluster.prefill_replicas={pf['num_workers']}",
             f"cluster.decode_replicas={dc['num_workers']}",
             f"cluster.tensor_parallel_size={dc['tp_size']}",
             f"cluster.prefill_tensor_parallel_size={pf['tp_size']}",
             f"cluster.decode_tensor_parallel_size={dc['tp_size']}",
             f"cluster.expert_parallel_size={ep}", *link], "")


def _reason(row: dict, hardware: str, model: dict | None) -> str:
    if str(row.get("system", hardware)) != hardware:
        return f"system={row['system']}: not hardware={hardware}"
    if row["backend"] not in BACKENDS:
        return f"backend={row['backend']}: not one of {list(BACKENDS)}"
    if not calibration_file(hardware, row["backend"]).is_file():
        return f"backend={row['backend']}: no calibrated file " \
               f"{calibration_file(hardware, row['backend']).name} for {hardware}"
    if model is None:
        return f"model_path={row['model_path']}: no conf/model/*.yaml with a matching hf_id"
    if row["mode"] == "disagg" and row["concurrency"] < 1:
        return "mode=disagg without silicon_concurrency in silicon_data_source: the clients' " \
               "concurrency of a disaggregated row is not known"
    if row["concurrency"] < 1 or not row["isl"] >= 1 or not row["osl"] >= 1:
        return f"concurrency={row['concurrency']}, isl={row['isl']}, osl={row['osl']}: " \
               "must all be >= 1"
    return ""


def plan_rows(rows: pd.DataFrame, hardware: str, models: list[str] | None = None
              ) -> pd.DataFrame:
    """One plan per CSV row: the measured values, the mapped config (``overrides`` for the
    simulator's Hydra config) and ``reason`` (empty when the row can be simulated). With
    ``models``, only rows of those conf models are kept."""
    index = model_index()
    schedulers = {p.stem for p in (Path(conf.__file__).parent / "scheduler").glob("*.yaml")}
    rows = rows.assign(concurrency=concurrency_of(rows), range_ratio=range_ratio_of(rows))
    plans = []
    for row in rows.to_dict("records"):
        model = index.get(_norm(row["model_path"]))
        if models is not None and (model is None or model["name"] not in models):
            continue
        backend = str(row["backend"])
        reason = _reason(row, hardware, model)
        dtype, moe_dtype, why = dtypes_of(row, model["num_experts"] if model else 0,
                                          model["dtype"] if model else "bfloat16",
                                          model["moe_dtype"] if model else "")
        reason = reason or why
        notes = []
        if model and model["hf_id"] != row["model_path"]:
            notes.append(f"as {model['hf_id']}")
        scheduler = backend if backend in schedulers else "vllm"
        if scheduler != backend:
            notes.append(f"no {backend} scheduler: vllm's")
        size, layout, why = layout_of(row, hardware)
        reason = reason or why
        tp, pp, ep, dp = (size.get(k, 1) for k in ("tp", "pp", "ep", "dp"))
        c, isl, osl = int(row["concurrency"]), int(row["isl"]), int(row["osl"])
        deployment = generated_deployment_overrides(row, backend, isl, osl)
        if deployment:
            notes.append("aiconfigurator's generated deployment: its engine limits, "
                         "Dynamo's frontend (not modelled)")
        if row["range_ratio"] < 1.0:
            notes.append(f"lengths uniform on [{row['range_ratio']:g}·L, L] (InferenceX client)")
        overrides = [] if reason else [
            f"model={model['name']}", f"hardware={hardware}", f"backend={backend}",
            f"scheduler={scheduler}", f"model.dtype={dtype}",
            f"kv_cache.dtype={kv_dtype_of(row, dtype)}",
            *([f"model.moe_dtype='{moe_dtype}'"] if moe_dtype is not None else []),
            *layout, "workload=closed_loop", f"workload.concurrency={c}",
            *length_overrides(isl, osl, float(row["range_ratio"])),
            *deployment,
            "workload.think_time_s=0", "slo=none",
            "plots=false", "progress=false"]
        plans.append({
            "id": row["id"], "model_path": row["model_path"], "backend": backend,
            "mode": row["mode"], "model": model["name"] if model else "", "scheduler": scheduler,
            "tp": tp, "pp": pp, "ep": ep, "dp": dp, "dtype": dtype, "isl": isl, "osl": osl,
            "concurrency": c, "range_ratio": float(row["range_ratio"]),
            "meas_ttft_ms": float(row["silicon_ttft_ms"]),
            "meas_tpot_ms": float(row["silicon_tpot_ms"]), "note": "; ".join(notes),
            "reason": reason, "overrides": overrides})
    return pd.DataFrame(plans, columns=PLAN_COLUMNS)


PLAN_COLUMNS = ["id", "model_path", "backend", "mode", "model", "scheduler", "tp", "pp", "ep",
                "dp", "dtype", "isl", "osl", "concurrency", "range_ratio", "meas_ttft_ms",
                "meas_tpot_ms", "note", "reason", "overrides"]
