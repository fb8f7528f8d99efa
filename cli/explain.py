"""``python -m sim.explain``: read one engine step as operators on the roofline, and the memory
plan that decides how many such steps can run at once.

    python -m sim.explain [batch=PARTS] [context=N] [chart=PATH|none] [any python -m sim override]

e.g. ``python -m sim.explain model=llama3_8b hardware=h100_sxm backend=vllm
batch=prefill:1x4096+decode:64x2000``.

``batch=`` grammar (no commas and no spaces, so it needs no shell quoting and is no Hydra sweep)::

    PARTS := PART ('+' PART)*
    PART  := 'prefill:' SEQS 'x' TOKENS ['@' CACHED]  SEQS sequences, each computing TOKENS new
                                                      tokens over CACHED tokens already in its
                                                      KV cache (a prefill chunk; CACHED 0 if
                                                      left out)
           | 'decode:' SEQS 'x' CONTEXT              SEQS sequences, each generating one token
                                                      over CONTEXT cached tokens

For a diffusion pipeline (``model=flux1_dev`` and the other ``kind: diffusion`` models) it
explains one job instead, e.g. ``python -m sim.explain model=flux1_dev job=1024x1024
plan=ulysses4xcfg2``: ``job=HEIGHTxWIDTH[xFRAMES] steps= images= guidance= plan=auto|single|
DEGREES gpus=`` (``cli.diffusion_explain``).

Default ``prefill:1x4096+decode:64x2000``. ``context=N`` is the sequence length at which the
memory plan counts the maximum concurrent sequences (default: the longest sequence of the batch
after this step, cached + new tokens). ``chart=PATH`` is where the roofline PNG goes; by
default ``roofline.png`` in the output dir ``python -m sim`` would use with the same
overrides (``hydra.run.dir``, ``outputs/<date>/<time>`` unless set), made only when the
chart is written; ``chart=none`` skips it. Every other ``key=value`` is a ``python -m sim``
override.

It prints (1) every operator of the step with its count, FLOPs, bytes, arithmetic intensity,
the GPU's balance point (peak FLOP/s ÷ memory bandwidth) for the dtype it runs in, the binding
roof, its predicted time and share of the step, and whether the step replays a captured CUDA
graph (at which size) or the host launches its kernels one by one; (2) the KV-cache bytes per
token and any fixed per-request state; (3) the memory plan; and writes (4) the roofline chart.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from hydra import compose, initialize_config_module

import cli.diffusion_explain as diffusion_explain
import sim.kv.budget as memory
from analysis.inputs import output_file
from analysis.roofline_chart import write_roofline_chart
from cli.preflight import compose_or_exit
from cli.step_surroundings import cuda_graph_line, frontend_line
from sim.builders import build_cost_model, check_config, plain, replica_memory_budget
from sim.errors import ConfigError, OutputError, report_error
from sim.kv.build import kv_blocks
from sim.kv.manager import state_blocks_for
from sim.kv.rules import sliding_paged_as_full, startup_lines

DEFAULT_BATCH = "prefill:1x4096+decode:64x2000"
LLM_KEYS = ("batch", "context")
OWN_KEYS = LLM_KEYS + ("chart",) + diffusion_explain.OWN_KEYS
PART = re.compile(r"^(prefill|decode):(\d+)x(\d+)(?:@(\d+))?$")
GRAMMAR = ("'+'-joined parts prefill:SEQSxTOKENS[@CACHED] or decode:SEQSxCONTEXT, "
           "e.g. prefill:1x4096+decode:64x2000")
MAX_SEQS = 1_000_000  # sequences in one step: each is a row of the cost model's arrays


@dataclass(frozen=True)
class BatchPart:
    """``seqs`` sequences that each compute ``new`` tokens over ``cached`` ones."""

    kind: str
    seqs: int
    new: int
    cached: int


def parse_batch(text: str) -> list[BatchPart]:
    """Parse ``batch=`` text (grammar in the module doc); one ConfigError naming ``batch``."""
    parts, seqs_so_far = [], 0
    for piece in str(text).split("+"):
        m = PART.match(piece)
        if not m:
            raise ConfigError("batch", text, f"cannot read {piece!r}; expected {GRAMMAR}")
        kind, seqs, tokens, cached = m[1], int(m[2]), int(m[3]), m[4]
        if kind == "decode" and cached is not None:
            raise ConfigError("batch", text, f"{piece!r}: decode:SEQSxCONTEXT takes no @CACHED "
                              "(its context is the cached tokens)")
        if seqs < 1 or tokens < 1:
            raise ConfigError("batch", text, f"{piece!r}: sequences and tokens must be >= 1")
        seqs_so_far += seqs
        if seqs_so_far > MAX_SEQS:
            raise ConfigError("batch", text, f"at most {MAX_SEQS:,} sequences in one step")
        parts.append(BatchPart(kind, seqs, 1, tokens) if kind == "decode"
                     else BatchPart(kind, seqs, tokens, int(cached or 0)))
    return parts


def batch_arrays(parts: list[BatchPart]) -> tuple[np.ndarray, np.ndarray]:
    """New and cached tokens per sequence of the step (the cost model's batch shape)."""
    new = np.concatenate([np.full(p.seqs, p.new, np.int64) for p in parts])
    ctx = np.concatenate([np.full(p.seqs, p.cached, np.int64) for p in parts])
    return new, ctx


def _dtype_label(dtype: str) -> str:
    return "fp8" if dtype in ("fp8", "fp8_block") else "bf16"


def peaks(hw) -> dict[str, float]:
    """Dense peak FLOP/s per dtype label of a GPU (fp8 only where it has FP8 tensor cores)."""
    out = {"bf16": float(hw.bf16_flops)}
    if hw.fp8_flops:
        out["fp8"] = float(hw.fp8_flops)
    return out


def operator_table(cfg, new: np.ndarray, ctx: np.ndarray) -> tuple[pd.DataFrame, dict]:
    """Every operator of the step with its roofline numbers, and the step's totals.

    ``cfg`` holds plain config groups (``sim.builders.plain``). An operator with FLOPs runs
    against the peak of the dtype the cost model reports for it (``OperatorCost.dtype``), or
    of the model's layer dtype when the cost model does not say; one without FLOPs has no
    balance point.
    """
    model = build_cost_model(cfg)
    ops = model.breakdown(new, ctx)
    roofs = peaks(model.hw)  # the cost model's roofs (cost_model.compute_scale applied)
    bw = float(model.hw.hbm_bandwidth)
    # operators without FLOPs (copies, collectives, host) have no compute roof to meet
    reported = [getattr(op, "dtype", None) for op in ops if op.flops > 0]
    dtypes = [_dtype_label(getattr(op, "dtype", None) or cfg.model.dtype) if op.flops > 0
              else "-" for op in ops]
    t = pd.DataFrame({
        "operator": [op.name for op in ops],
        "count": [op.count for op in ops],
        "flops": [float(op.flops) for op in ops],
        "bytes": [float(op.bytes) for op in ops],
        "time_s": [float(op.time_s) for op in ops],
        "bound": [op.bound for op in ops],
        "dtype": dtypes,
    })
    total = t["time_s"].sum()
    t["GFLOP"] = t["flops"] / 1e9
    t["MB"] = t["bytes"] / 1e6
    t["FLOP/B"] = t["flops"] / t["bytes"].where(t["bytes"] > 0)
    t["balance"] = [roofs[d] / bw if d in roofs else np.nan for d in dtypes]
    t["TFLOP/s"] = (t["flops"] / t["time_s"].where(t["time_s"] > 0)).fillna(0.0) / 1e12
    t["time_us"] = t["time_s"] * 1e6
    t["share_%"] = 100 * t["time_s"] / total if total > 0 else 0.0
    step = model.step_cost(new, ctx)
    totals = {"step_ms": total * 1e3, "bound": step.bound, "tokens": int(new.sum()),
              "graph": cuda_graph_line(model, new, ctx),
              "frontend": frontend_line(cfg, len(new)),
              "sequences": len(new), "balance": {d: p / bw for d, p in roofs.items()},
              "peaks": roofs, "bandwidth": bw, "dtypes_reported": all(reported)}
    return t, totals


def kv_footprint(cfg) -> dict:
    """KV-cache bytes per token on one GPU, and the fixed per-request state where the memory
    model has one (hybrid linear-attention and sliding-window models)."""
    tp, pp = cfg.cluster.tensor_parallel_size, cfg.cluster.pipeline_parallel_size
    full = sliding_paged_as_full(cfg.backend.name, cfg.model, cfg.kv_cache)
    return {
        "kv_bytes_per_token": memory.kv_bytes_per_token(cfg.model, cfg.kv_cache, tp, pp=pp,
                                                        sliding_full=full),
        "state_bytes_per_request": int(memory.state_bytes_per_request(
            cfg.model, cfg.kv_cache, tp, pp=pp, sliding_full=full)),
    }


def memory_plan(cfg, context: int) -> dict:
    """Where one GPU's memory goes and how many sequences of ``context`` tokens fit at once.

    A sequence holds ceil(context / block_size) blocks plus its state blocks (fixed, and its
    sliding-window layers' up to the window: ``sim.kv.manager.state_blocks_for``); one of
    ``num_gpu_blocks`` is vLLM's reserved null block. ``kv_cache.num_gpu_blocks`` overrides
    the memory-derived count, as it sizes the simulated cache (``memory_num_gpu_blocks``
    keeps the derived one). The engine also caps concurrency at ``scheduler.max_num_seqs``.
    """
    b = replica_memory_budget(cfg)
    override = getattr(cfg.kv_cache, "num_gpu_blocks", None)
    blocks = kv_blocks(cfg.kv_cache, b)
    state_blocks = int(state_blocks_for(context, b.block_size, b.fixed_state_blocks, b.window)
                       if b.window else b.state_blocks_per_request)
    per_seq = -(-context // b.block_size) + state_blocks
    kv_limit = (blocks - 1) // per_seq
    return {
        "usable_gib": b.usable_bytes / memory.GIB, "weights_gib": b.weight_bytes / memory.GIB,
        "activations_gib": b.activation_bytes / memory.GIB,
        "other_gib": b.other_bytes / memory.GIB, "kv_cache_gib": b.kv_cache_bytes / memory.GIB,
        "num_gpu_blocks": blocks, "memory_num_gpu_blocks": b.num_gpu_blocks,
        "override": override is not None, "block_size": b.block_size,
        "max_tokens": blocks * b.block_size, "context": context, "blocks_per_seq": per_seq,
        "state_blocks_per_request": state_blocks, "kv_limited_seqs": kv_limit,
        "max_num_seqs": cfg.scheduler.max_num_seqs,
        "max_concurrent_seqs": min(kv_limit, cfg.scheduler.max_num_seqs),
        "rule": b.rule, "memory_fraction": b.memory_fraction,
        "engine_log": startup_lines(
            b, b.block_bytes // b.block_size,
            cfg.scheduler.max_model_len or cfg.model.max_position_embeddings,
            cfg.model.max_position_embeddings, cfg.scheduler.max_num_batched_tokens),
    }


def check_batch(cfg, parts: list[BatchPart], text: str) -> None:
    """No sequence of the batch may be longer than the model's context window."""
    limit = cfg.scheduler.max_model_len or cfg.model.max_position_embeddings
    longest = max(p.new + p.cached for p in parts)
    if longest > limit:
        raise ConfigError("batch", text, f"a sequence of {longest} tokens exceeds "
                          f"max_model_len={limit}")


def split_args(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """Explain's own ``key=value`` arguments, and the overrides left for Hydra."""
    own, rest = {}, []
    for a in argv:
        key, eq, value = a.partition("=")
        if eq and key in OWN_KEYS:
            own[key] = value
        else:
            rest.append(a)
    return own, rest


def context_of(cfg, text: str) -> int:
    """``context=``: a number of tokens from 1 to the context window."""
    limit = cfg.scheduler.max_model_len or cfg.model.max_position_embeddings
    if not text.isdigit() or not 1 <= int(text) <= limit:
        raise ConfigError("context", text, f"a whole number of tokens in [1, {limit}] "
                          "(max_model_len)")
    return int(text)


def run_dir(overrides: list[str]) -> Path:
    """The output dir ``python -m sim`` would use with ``overrides`` (``hydra.run.dir``)."""
    own = [o for o in overrides if o.lstrip("+").startswith("hydra.run.dir=")]
    with initialize_config_module("conf", version_base=None):
        return Path(compose("config", overrides=own, return_hydra_config=True).hydra.run.dir)


def chart_path(own: dict[str, str], overrides: list[str]) -> Path | None:
    """Where the roofline PNG goes (None: ``chart=none``): ``chart=``, else ``roofline.png``
    in the run's output dir; a path that is a folder or lies under a file is an error
    before any work."""
    chart = own.get("chart", str(run_dir(overrides) / "roofline.png"))
    if chart.lower() in ("none", "null", "false", ""):
        return None
    return output_file(chart, "chart")


def format_report(cfg, table: pd.DataFrame, totals: dict, kv: dict, plan: dict | None) -> str:
    """The text ``python -m sim.explain`` prints."""
    m, hw, c = cfg.model, cfg.hardware, cfg.cluster
    tp, pp = c.tensor_parallel_size, c.pipeline_parallel_size
    gpus = f"{tp * pp}x {hw.name} (TP{tp} × PP{pp})" if pp > 1 else f"{tp}x {hw.name}"
    bal = ", ".join(f"{d} {v:,.0f}" for d, v in totals["balance"].items())
    lines = [f"{m.name} ({m.dtype}) on {gpus}, backend {cfg.backend.name}: one step "
             f"of {totals['sequences']} sequences, {totals['tokens']} new tokens (per GPU)",
             f"balance point (peak FLOP/s / memory bandwidth): {bal} FLOP/B",
             "(on the roofline an operator below its balance is memory-bound, above it "
             "compute-bound; bound below is the cost model's verdict with efficiencies)", ""]
    cols = ["operator", "count", "GFLOP", "MB", "FLOP/B", "dtype", "balance", "bound",
            "TFLOP/s", "time_us", "share_%"]
    if not totals["dtypes_reported"] and _dtype_label(m.dtype) != "bf16":
        lines.insert(-1, f"note: the cost model reports no per-operator dtype, so every operator "
                     f"is placed against the {m.dtype} balance (attention and LM head run bf16)")
    with pd.option_context("display.width", 140, "display.float_format", "{:,.2f}".format):
        lines.append(table[cols].to_string(index=False, na_rep="-"))
    lines.append(f"step time {totals['step_ms']:.3f} ms, mostly {totals['bound']}-bound")
    lines += [totals[k] for k in ("graph", "frontend") if totals.get(k)]
    lines += ["", f"KV cache: {kv['kv_bytes_per_token']:,} bytes per token per GPU"]
    if kv.get("state_bytes_per_request"):
        lines.append(f"per-request state: at most {kv['state_bytes_per_request']:,} bytes per "
                     "GPU (sliding-window layers' window, linear-attention state: does not "
                     "grow past that)")
    if plan:
        lines += ["", f"memory plan per GPU ({plan['rule']}'s rule, memory fraction "
                  f"{plan['memory_fraction']}): {plan['usable_gib']:.2f} GiB usable, "
                  f"{plan['weights_gib']:.2f} weights, {plan['activations_gib']:.2f} "
                  f"activations, {plan['other_gib']:.2f} other, {plan['kv_cache_gib']:.2f} "
                  "KV cache (sim/kv/rules.py)",
                  f"as {plan['rule']} would log it: " + "; ".join(plan["engine_log"]),
                  f"KV cache: {plan['num_gpu_blocks']:,} blocks"
                  + (f" (override; memory gives {plan['memory_num_gpu_blocks']:,})"
                     if plan["override"] else "")
                  + f" of {plan['block_size']} tokens = {plan['max_tokens']:,} tokens",
                  f"at context {plan['context']:,}: {plan['blocks_per_seq']} blocks per sequence"
                  f" -> {plan['kv_limited_seqs']:,} sequences fit; max concurrent "
                  f"{plan['max_concurrent_seqs']:,} (scheduler.max_num_seqs="
                  f"{plan['max_num_seqs']})"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, print the step's operators and memory plan, write the chart."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    flags = [a for a in argv if a.startswith("-")]
    if flags:
        print(f"error: {flags[0]}: explain takes key=value arguments only, e.g. "
              f"batch={DEFAULT_BATCH} (see --help)", file=sys.stderr)
        return 2
    own, overrides = split_args(argv)
    cfg = plain(compose_or_exit(overrides))
    try:
        chart = chart_path(own, overrides)
        if getattr(cfg.model, "kind", "llm") == "diffusion":
            return _explain_diffusion(cfg, own, chart)
        return _explain_step(cfg, own, chart)
    except (ConfigError, OutputError) as e:
        return report_error(e)


def _explain_step(cfg, own: dict[str, str], chart: Path | None) -> int:
    """One LLM engine step: print its operators and memory plan, write the chart."""
    text = own.get("batch", DEFAULT_BATCH)
    wrong = [k for k in diffusion_explain.OWN_KEYS if k in own]
    if wrong:
        raise ConfigError(wrong[0], own[wrong[0]], f"only for a diffusion model "
                          f"(model.kind=diffusion); {cfg.model.name} is an LLM")
    check_config(cfg)
    parts = parse_batch(text)
    check_batch(cfg, parts, text)
    new, ctx = batch_arrays(parts)
    context = context_of(cfg, own["context"]) if "context" in own else int((new + ctx).max())
    table, totals = operator_table(cfg, new, ctx)
    kv = kv_footprint(cfg)
    try:
        plan, plan_error = memory_plan(cfg, context), None
    except ConfigError as e:  # the model does not fit: still show the step, then say so
        plan, plan_error = None, e
    print(format_report(cfg, table, totals, kv, plan))
    if chart is not None:
        write_roofline_chart(table, totals["peaks"], totals["bandwidth"], chart,
                             f"{cfg.model.name} on {cfg.hardware.name}: {text}")
        print(f"roofline chart: {chart}")
    if plan_error is not None:
        raise plan_error
    return 0


def _explain_diffusion(cfg, own: dict[str, str], chart: Path | None) -> int:
    """A diffusion pipeline's job, stage by stage (``cli.diffusion_explain``)."""
    wrong = [k for k in LLM_KEYS if k in own]
    if wrong:
        raise ConfigError(wrong[0], own[wrong[0]], f"only for an LLM; {cfg.model.name} is "
                          "a diffusion pipeline: use job=, plan=, gpus=, steps=, images=, "
                          "guidance= (see --help)")
    return diffusion_explain.run(cfg, own, chart)


if __name__ == "__main__":
    raise SystemExit(main())
