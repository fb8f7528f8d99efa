"""Readers on small synthetic folders (and, cheaply, on the shared data when present)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from calibration.readers import aiconfigurator, vidur
from calibration.rows import COLUMNS
from sim.errors import ConfigError

AIC_H100 = Path(__file__).resolve().parents[3] / "shared" / "data" / "aiconfigurator" / "h100_sxm"


def test_version_order_and_reuse(tmp_path):
    for v in ("0.5.6.post2", "0.5.10", "0.5.9", "1.3.0rc20", "1.3.0rc3", "1.3.0"):
        (tmp_path / "gemm" / "x" / v).mkdir(parents=True)
    order = sorted(p.name for p in (tmp_path / "gemm" / "x").iterdir())
    order.sort(key=aiconfigurator.version_key)
    assert order == ["0.5.6.post2", "0.5.9", "0.5.10", "1.3.0rc3", "1.3.0rc20", "1.3.0"]
    base = tmp_path / "gemm" / "vllm"
    for v in ("0.19.0", "0.24.0"):
        (base / v).mkdir(parents=True)
        pd.DataFrame({"latency": [1.0]}).to_parquet(base / v / "gemm_perf.parquet")
    (base / "0.22.0").mkdir()
    (base / "0.22.0" / "reuse.yaml").write_text(yaml.safe_dump(
        {"reuse": [{"table": "gemm_perf", "from_version": "0.24.0"}]}))
    assert aiconfigurator.find_table(tmp_path, "gemm", "vllm", "gemm_perf").version == "0.24.0"
    reused = aiconfigurator.find_table(tmp_path, "gemm", "vllm", "gemm_perf", "0.22.0")
    assert reused.reused_from == "0.24.0" and reused.path.parent.name == "0.24.0"
    assert aiconfigurator.find_table(tmp_path, "gemm", "vllm", "gemm_perf", "9.9") is None


def test_aiconfigurator_folder_to_rows(tmp_path, synthetic):
    root = synthetic.write_aiconfigurator(tmp_path)
    frames, used = aiconfigurator.read(root, "vllm")
    assert set(frames) == {"gemm", "attention_prefill", "attention_decode", "comm", "moe"}
    for fam, df in frames.items():
        assert list(df.columns) == COLUMNS[fam] + ["latency_s", "source"], fam
        assert (df["latency_s"] > 0).all() and df["latency_s"].max() < 1.0  # ms → s
    comm = frames["comm"]
    assert set(comm["impl"]) == {"custom", "nccl"}
    ar = comm[comm["kind"] == "allreduce"]
    assert ar["nbytes"].min() == 256  # 128 bf16 elements
    assert (frames["attention_decode"]["ctx"] > 0).all()
    assert used["nccl"].version == "2.29.2"
    with pytest.raises(ConfigError, match="version"):
        aiconfigurator.read(root, "vllm", version="0.1.0")


def test_one_gemm_dtype_from_another_version(tmp_path, synthetic):
    root = synthetic.write_aiconfigurator(tmp_path)
    newest, _ = aiconfigurator.read(root, "vllm")
    dtype = newest["gemm"]["dtype"].iloc[0]
    older = root / "gemm" / "vllm" / "0.19.0"
    older.mkdir()
    table = pd.read_parquet(root / "gemm" / "vllm" / "0.24.0" / "gemm_perf.parquet")
    table.assign(latency=table["latency"] * 3).to_parquet(older / "gemm_perf.parquet")
    frames, used = aiconfigurator.read(root, "vllm", gemm_dtype_versions={dtype: "0.19.0"})
    g, g0 = frames["gemm"], newest["gemm"]
    assert used[f"gemm_{dtype}"].version == "0.19.0" and used["gemm"].version == "0.24.0"
    mine, theirs = g[g["dtype"] == dtype], g0[g0["dtype"] == dtype]
    assert len(mine) == len(theirs)
    np.testing.assert_allclose(np.sort(mine["latency_s"]), np.sort(theirs["latency_s"]) * 3)
    assert (mine["source"] == "gemm/vllm/0.19.0/gemm_perf.parquet").all()
    rest = g[g["dtype"] != dtype].reset_index(drop=True)
    pd.testing.assert_frame_equal(rest, g0[g0["dtype"] != dtype].reset_index(drop=True))
    with pytest.raises(ConfigError, match=f"gemm_dtype_versions.{dtype}"):
        aiconfigurator.read(root, "vllm", gemm_dtype_versions={dtype: "9.9.9"})
    with pytest.raises(ConfigError, match="gemm_dtype_versions.int4"):
        aiconfigurator.read(root, "vllm", gemm_dtype_versions={"int4": "0.19.0"})


def test_vidur_csvs_to_rows(tmp_path):
    prof = tmp_path / "data" / "profiling"
    mlp = prof / "compute" / "a100" / "org" / "model"
    mlp.mkdir(parents=True)
    ops = ["attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj", "input_layernorm",
           "attn_rope", "mlp_act", "add", "post_attention_layernorm"]
    df = pd.DataFrame({"num_tokens": [1, 64], "num_tensor_parallel_workers": [2, 2],
                       "n_head": 32, "n_kv_head": 8, "n_embd": 4096, "n_expanded_embd": 14336,
                       "vocab_size": 128256, "use_gated_mlp": True})
    for op in ops:
        df[f"time_stats.{op}.median"] = [0.01, 0.02]
    df.to_csv(mlp / "mlp.csv", index=False)
    att = tmp_path / "extra" / "a800" / "attention.csv"
    att.parent.mkdir(parents=True)
    pd.DataFrame({"time_stats.attn_prefill.median": [0.1, np.nan],
                  "time_stats.attn_decode.median": [np.nan, 0.02], "n_embd": 4096,
                  "n_q_head": 32, "n_kv_head": 8, "num_tensor_parallel_workers": 1,
                  "batch_size": [1, 8], "prefill_chunk_size": [512, 0],
                  "kv_cache_size": [0, 1000], "is_prefill": [True, False]}).to_csv(att,
                                                                                   index=False)
    net = prof / "network" / "a100_dgx"
    net.mkdir(parents=True)
    pd.DataFrame({"time_stats.all_reduce.median": [0.05, 0.06], "num_workers": [2, 16],
                  "size": [2048, 2048], "devices_per_node": [8, 8]}).to_csv(
        net / "all_reduce.csv", index=False)
    frames, files = vidur.read(tmp_path, "a100_80g_sxm")
    g = frames["gemm"].sort_values(["m", "n"])
    qkv = g[g["source"].str.endswith("attn_pre_proj")]
    assert set(qkv["n"]) == {(32 + 16) * 128 / 2} and set(qkv["k"]) == {4096}
    up = g[g["source"].str.endswith("mlp_up_proj")]
    assert set(up["n"]) == {2 * 14336 / 2}
    assert len(frames["elementwise"]) == 10
    pre, dec = frames["attention_prefill"], frames["attention_decode"]
    assert pre["q"].tolist() == [512] and dec["ctx"].tolist() == [1000]
    assert dec["latency_s"].tolist() == pytest.approx([2e-5])
    assert frames["comm"]["num_gpus"].tolist() == [2]  # the 16-GPU row is inter-node
    with pytest.raises(ConfigError, match="hardware"):
        vidur.read(tmp_path, "mi300x")


@pytest.mark.skipif(not AIC_H100.is_dir(), reason=f"shared aiconfigurator tables not found at "
                    f"{AIC_H100}")
def test_shared_tables_read_with_expected_units():
    frames, used = aiconfigurator.read(AIC_H100, "vllm")
    g = frames["gemm"]
    one = g[(g.dtype == "bfloat16") & (g.m == 1) & (g.n == 4096) & (g.k == 4096)]
    assert one["latency_s"].iloc[0] == pytest.approx(15e-6, rel=0.2)  # 32 MiB at ~2.2 TB/s
    assert used["gemm"].version == "0.24.0"
