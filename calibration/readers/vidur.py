"""Reader of Vidur's profiling CSVs (microsoft/vidur ``data/profiling``) into the row format.

- ``compute/<device>/<org>/<model>/mlp.csv``: per-layer op times (``time_stats.<op>.median``,
  milliseconds) for ``num_tokens`` tokens at tensor parallelism ``num_tensor_parallel_workers``.
  The four projections become GEMM rows (fp16, filed as ``bfloat16``: the same tensor-core
  rate), ``m`` = tokens: QKV ``n = (H + 2·Hkv)·d/tp, k = hidden``; output ``n = hidden,
  k = H·d/tp``; gate/up ``n = (2 if gated else 1)·ffn/tp, k = hidden``; down ``n = hidden,
  k = ffn/tp``. Norms, rotary, the activation and the residual add become elementwise rows.
- ``attention.csv`` (prefill chunks over ``kv_cache_size`` cached tokens, and decode batches);
  Vidur's main tree lacks them, so every ``attention.csv`` under the folder whose path names
  the device (or a proxy: A800 for A100) is read.
- ``network/<device>_dgx/{all_reduce,send_recv}.csv``: intra-node rows only
  (``num_workers ≤ devices_per_node``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis.inputs import fields_of, read_csv
from calibration.rows import conform, empty
from sim.errors import ConfigError

PROFILE = "a Vidur profiling CSV (a header row, then rows)"
DEVICES = {"a100_80g_sxm": ("a100", ("a100", "a800")), "h100_sxm": ("h100", ("h100",)),
           "a40": ("a40", ("a40",))}


def _t(df: pd.DataFrame, op: str) -> pd.Series:
    return df[f"time_stats.{op}.median"].astype(float) * 1e-3


def _mlp(path: Path, root: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    df = read_csv(path, "data_dir", PROFILE)
    src = str(path.relative_to(root))
    T, tp = df["num_tokens"].astype(float), df["num_tensor_parallel_workers"].astype(float)
    H, Hkv, h = (df[c].astype(float) for c in ("n_head", "n_kv_head", "n_embd"))
    ffn, d = df["n_expanded_embd"].astype(float), h / H
    gated = df["use_gated_mlp"].astype(str).str.lower().eq("true").astype(float) + 1.0
    shapes = {"attn_pre_proj": ((H + 2 * Hkv) * d / tp, h), "attn_post_proj": (h, H * d / tp),
              "mlp_up_proj": (gated * ffn / tp, h), "mlp_down_proj": (h, ffn / tp)}
    gemm = pd.concat([pd.DataFrame({"dtype": "bfloat16", "m": T, "n": n, "k": k,
                                    "latency_s": _t(df, op), "source": f"{src}:{op}"})
                      for op, (n, k) in shapes.items()], ignore_index=True)
    moved = {"input_layernorm": 4 * T * h, "post_attention_layernorm": 4 * T * h,
             "attn_rope": 4 * T * (H + Hkv) * d / tp,
             "mlp_act": 2 * T * (gated + 1) * ffn / tp, "add": 6 * T * h}
    elem = pd.concat([pd.DataFrame({"op": op, "nbytes": b, "kernels": 1,
                                    "latency_s": _t(df, op), "source": f"{src}:{op}"})
                      for op, b in moved.items() if f"time_stats.{op}.median" in df],
                     ignore_index=True)
    return conform("gemm", gemm, str(path)), conform("elementwise", elem, str(path))


def _attention(path: Path, root: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    df = read_csv(path, "data_dir", PROFILE)
    src = str(path.relative_to(root))
    tp = df["num_tensor_parallel_workers"].astype(float)
    H, Hkv = df["n_q_head"].astype(float), df["n_kv_head"].astype(float)
    base = pd.DataFrame({"batch_size": df["batch_size"].astype(float),
                         "ctx": df["kv_cache_size"].astype(float),
                         "num_heads": H / tp, "num_kv_heads": np.maximum(Hkv / tp, 1.0),
                         "head_dim": df["n_embd"].astype(float) / H, "kv_dtype": "bfloat16",
                         "window": 0, "source": src})
    prefill = df["is_prefill"].astype(str).str.lower().eq("true").to_numpy()
    pre = base[prefill].assign(q=df.loc[prefill, "prefill_chunk_size"].astype(float),
                               latency_s=_t(df[prefill], "attn_prefill"))
    dec = base[~prefill].assign(latency_s=_t(df[~prefill], "attn_decode"))
    return (conform("attention_prefill", pre, str(path)),
            conform("attention_decode", dec, str(path)))


def _network(folder: Path, root: Path) -> pd.DataFrame:
    frames = []
    for name, kind in (("all_reduce.csv", "allreduce"), ("send_recv.csv", "p2p")):
        path = folder / name
        if not path.is_file():
            continue
        df = read_csv(path, "data_dir", PROFILE)
        with fields_of(path, "data_dir", PROFILE):
            df = df[df["num_workers"] <= df["devices_per_node"]]
            if kind == "p2p":
                df = df[df["devices_per_node"] >= 2]
            col = "all_reduce" if kind == "allreduce" else "send_recv"
            frames.append(pd.DataFrame({"kind": kind, "impl": "nccl", "variant": "vidur",
                                        "num_gpus": df["num_workers"].astype(float),
                                        "nbytes": df["size"].astype(float), "dtype": "float16",
                                        "latency_s": _t(df, col),
                                        "source": str(path.relative_to(root))}))
    rows = pd.concat(frames, ignore_index=True) if frames else empty("comm")
    return conform("comm", rows, str(folder))


def read(root: Path, hardware: str) -> tuple[dict[str, pd.DataFrame], dict[str, list[Path]]]:
    """Every family's rows for ``hardware`` from a Vidur data folder, and the files read."""
    root = Path(root)
    if hardware not in DEVICES:
        raise ConfigError("hardware", hardware, f"no Vidur profiles known for it; have "
                          f"{sorted(DEVICES)}")
    device, proxies = DEVICES[hardware]
    prof = next((p for p in (root / "data" / "profiling", root / "profiling", root)
                 if (p / "compute").is_dir()), None)
    if prof is None:
        raise ConfigError("data_dir", str(root), "no Vidur data/profiling/compute folder")
    files: dict[str, list[Path]] = {"mlp": sorted((prof / "compute" / device).glob("*/*/mlp.csv"))}
    files["attention"] = sorted(p for p in root.rglob("attention.csv")
                                if any(x in p.parts for x in proxies))
    frames: dict[str, list[pd.DataFrame]] = {}
    for path in files["mlp"]:
        with fields_of(path, "data_dir", PROFILE):
            g, e = _mlp(path, root)
        frames.setdefault("gemm", []).append(g)
        frames.setdefault("elementwise", []).append(e)
    for path in files["attention"]:
        with fields_of(path, "data_dir", PROFILE):
            pre, dec = _attention(path, root)
        frames.setdefault("attention_prefill", []).append(pre)
        frames.setdefault("attention_decode", []).append(dec)
    net = prof / "network" / f"{device}_dgx"
    files["network"] = sorted(net.glob("*.csv")) if net.is_dir() else []
    if files["network"]:
        frames["comm"] = [_network(net, root)]
    out = {k: pd.concat(v, ignore_index=True) for k, v in frames.items()}
    return {k: v for k, v in out.items() if not v.empty}, files
