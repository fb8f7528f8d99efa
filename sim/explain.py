"""``python -m sim.explain``: one engine step on the roofline, operator by operator.

    python -m sim.explain [--decode SEQSxCONTEXT] [--prefill SEQSxTOKENS[+CACHED]] [overrides]

e.g. ``python -m sim.explain --decode 64x2048 --prefill 1x4096 model=llama3_70b
cluster.tensor_parallel_size=4``. Prints each operator's FLOPs, bytes, arithmetic intensity
against the GPU's ridge point (peak FLOP/s ÷ bandwidth), the roof that binds it and its share
of the step time. Overrides are the same Hydra overrides as ``python -m sim``.
"""

from __future__ import annotations

import argparse
import re
import sys

import numpy as np
import pandas as pd

from sim.builders import build_cost_model, check_config, plain
from sim.errors import ConfigError
from sim.preflight import compose_or_exit

SHAPE = re.compile(r"^(\d+)x(\d+)(?:\+(\d+))?$")


def parse_shape(flag: str, text: str | None) -> tuple[int, int, int]:
    """``SEQSxTOKENS[+CACHED]`` → (sequences, tokens, cached tokens)."""
    if not text:
        return 0, 0, 0
    m = SHAPE.match(text)
    if not m:
        raise ConfigError(flag, text, "SEQSxTOKENS or SEQSxTOKENS+CACHED, e.g. 64x2048")
    return int(m[1]), int(m[2]), int(m[3] or 0)


def batch_shape(decode: str | None, prefill: str | None) -> tuple[np.ndarray, np.ndarray]:
    """New and cached tokens per sequence of the step to explain."""
    d_seqs, d_ctx, _ = parse_shape("--decode", decode)
    p_seqs, p_tokens, p_cached = parse_shape("--prefill", prefill)
    if d_seqs + p_seqs == 0:
        raise ConfigError("--decode/--prefill", None, "give at least one sequence")
    new = np.concatenate([np.ones(d_seqs, np.int64), np.full(p_seqs, p_tokens, np.int64)])
    ctx = np.concatenate([np.full(d_seqs, d_ctx, np.int64), np.full(p_seqs, p_cached, np.int64)])
    return new, ctx


def explain(cfg, new: np.ndarray, ctx: np.ndarray) -> tuple[pd.DataFrame, dict]:
    """The step's operators as a table, and the step's totals."""
    cfg = plain(cfg)
    check_config(cfg)
    model = build_cost_model(cfg)
    ops = model.breakdown(new, ctx)
    total = sum(op.time_s for op in ops)
    table = pd.DataFrame({
        "operator": [op.name for op in ops],
        "count": [op.count for op in ops],
        "GFLOP": [op.flops / 1e9 for op in ops],
        "MB": [op.bytes / 1e6 for op in ops],
        "FLOP/B": [op.intensity if op.bytes else np.nan for op in ops],
        "bound": [op.bound for op in ops],
        "time_us": [op.time_s * 1e6 for op in ops],
        "share_%": [100 * op.time_s / total for op in ops],
    })
    hw = cfg.hardware
    peak = hw.fp8_flops if cfg.model.dtype == "fp8" else hw.bf16_flops
    step = model.step_cost(new, ctx)
    totals = {"step_ms": total * 1e3, "ridge_flop_per_byte": peak / hw.hbm_bandwidth,
              "bound": step.bound, "tokens": int(new.sum()), "sequences": len(new)}
    return table, totals


def main(argv: list[str] | None = None) -> int:
    """Parse flags and overrides, print the operator table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decode", help="decode sequences × cached tokens, e.g. 64x2048")
    ap.add_argument("--prefill", help="prefill sequences × chunk tokens [+ cached], e.g. 1x4096")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, as for python -m sim")
    a = ap.parse_args(argv)
    if not a.decode and not a.prefill:
        a.decode = "32x1024"
    cfg = compose_or_exit(a.overrides)
    try:
        new, ctx = batch_shape(a.decode, a.prefill)
        table, t = explain(cfg, new, ctx)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    m, hw, tp = cfg.model, cfg.hardware, cfg.cluster.tensor_parallel_size
    print(f"{m.name} ({m.dtype}) on {tp}× {hw.name}: one step of {t['sequences']} sequences, "
          f"{t['tokens']} new tokens")
    print(f"ridge point {t['ridge_flop_per_byte']:.0f} FLOP/B: below it an operator is "
          "memory-bound, above it compute-bound")
    with pd.option_context("display.width", 120, "display.float_format", "{:,.2f}".format):
        print(table.to_string(index=False))
    print(f"step time {t['step_ms']:.3f} ms, mostly {t['bound']}-bound")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
