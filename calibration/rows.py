"""The row format every reader produces: one DataFrame per operator family.

Every frame has ``latency_s`` (one kernel call, seconds) and ``source`` (the file it came
from, relative to the data folder); the other columns name the shape:

- ``gemm``: ``dtype``, ``m``, ``n``, ``k`` (C[m,n] = A[m,k]·B[k,n]; n, k are the weight's).
- ``attention_prefill``: ``batch_size``, ``q`` (new tokens per sequence), ``ctx`` (tokens
  already cached), ``num_heads``, ``num_kv_heads``, ``head_dim``, ``kv_dtype``, ``window``
  (0 = full attention).
- ``attention_decode``: ``batch_size``, ``ctx`` (cached tokens per sequence), and the same
  head and cache columns.
- ``comm``: ``kind`` (allreduce, allgather, alltoall, reduce_scatter, p2p), ``impl``
  (``custom`` for the framework's own all-reduce, ``nccl``), ``variant`` (graph, eager, …),
  ``num_gpus``, ``nbytes`` (the message, bytes), ``dtype``.
- ``moe``: ``dtype``, ``num_tokens``, ``hidden``, ``inter``, ``topk``, ``num_experts``,
  ``tp``, ``ep``, ``distribution``.
- ``elementwise``: ``op``, ``nbytes``, ``kernels`` (memory-bound kernels: norms, rotary,
  activations, residual adds).
- ``encoder_attention``: ``batch_size``, ``seq`` (tokens per sequence, each attending to all
  of them: non-causal), ``num_heads`` (each with its own K and V), ``head_dim``, ``dtype``.
"""

from __future__ import annotations

import pandas as pd

from sim.errors import ConfigError

COLUMNS = {
    "gemm": ["dtype", "m", "n", "k"],
    "attention_prefill": ["batch_size", "q", "ctx", "num_heads", "num_kv_heads", "head_dim",
                          "kv_dtype", "window"],
    "attention_decode": ["batch_size", "ctx", "num_heads", "num_kv_heads", "head_dim",
                         "kv_dtype", "window"],
    "comm": ["kind", "impl", "variant", "num_gpus", "nbytes", "dtype"],
    "moe": ["dtype", "num_tokens", "hidden", "inter", "topk", "num_experts", "tp", "ep",
            "distribution"],
    "elementwise": ["op", "nbytes", "kernels"],
    "encoder_attention": ["batch_size", "seq", "num_heads", "head_dim", "dtype"],
}
KV_BYTES = {"bfloat16": 2.0, "float16": 2.0, "fp8": 1.0, "int8": 1.0}


def conform(family: str, df: pd.DataFrame, where: str) -> pd.DataFrame:
    """``df`` reduced to the family's columns plus ``latency_s`` and ``source``, with positive
    finite latencies only; a missing column is one clear error naming the file."""
    cols = COLUMNS[family] + ["latency_s", "source"]
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise ConfigError("data_dir", where, f"{family} rows lack columns {missing}")
    out = df[cols].copy()
    ok = out["latency_s"].notna() & (out["latency_s"] > 0)
    return out[ok].reset_index(drop=True)


def empty(family: str) -> pd.DataFrame:
    """A family frame with no rows."""
    return pd.DataFrame(columns=COLUMNS[family] + ["latency_s", "source"])
