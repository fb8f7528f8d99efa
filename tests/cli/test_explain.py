"""``python -m sim.explain``: the operator table checked by hand, the memory plan, the chart,
one-line errors, and every shipped GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

import cli.explain as explain_module
from cli.explain import (
    batch_arrays,
    kv_footprint,
    main,
    memory_plan,
    operator_table,
    parse_batch,
)
from cli.step_surroundings import frontend_line
from sim.builders import plain, replica_memory_budget
from sim.config import check_hardware
from sim.cost.base import StepCost

HARDWARE = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "conf" / "hardware")
                  .glob("*.yaml"))

# Llama-3.1-8B (conf/model/llama3_8b.yaml, its config.json): the numbers the hand check uses
L, H, HEADS, KV_HEADS, D, INTER, VOCAB = 32, 4096, 32, 8, 128, 14336, 128256
BF16 = 2


def gemm(m: int, n: int, k: int) -> tuple[float, float]:
    """FLOPs and bytes of a bf16 [m,k]·[k,n] GEMM: read both inputs, write the output once."""
    return 2.0 * m * n * k, BF16 * (m * k + k * n + m * n)


def test_llama8b_decode_on_h100_by_hand(compose_cfg):
    """64 sequences decoding at context 2000, one H100, bf16: each number from the
    architecture, not from the code under test."""
    cfg = plain(compose_cfg("model=llama3_8b", "hardware=h100_sxm", "backend=vllm"))
    new, ctx = batch_arrays(parse_batch("decode:64x2000"))
    table, totals = operator_table(cfg, new, ctx)
    rows = table.set_index("operator")
    S = 64

    expected = {
        "qkv_proj": [L * w for w in gemm(S, (HEADS + 2 * KV_HEADS) * D, H)],
        "gate_up_proj": [L * w for w in gemm(S, 2 * INTER, H)],
        "lm_head": list(gemm(S, VOCAB, H)),  # one position per sequence, once per step
    }
    keys = S * 2000 + S  # each decode token attends over its 2000 cached tokens and itself
    expected["attn_decode"] = [
        L * 4.0 * HEADS * D * keys,  # QKᵀ and PV: 2 FLOPs per multiply-add, 2 products
        L * (keys * 2 * KV_HEADS * D * BF16 + 2 * S * HEADS * D * BF16),  # K,V read; Q,O
    ]
    for op, (flops, nbytes) in expected.items():
        assert rows.loc[op, "flops"] == pytest.approx(flops, rel=1e-12), op
        assert rows.loc[op, "bytes"] == pytest.approx(nbytes, rel=1e-12), op
        assert rows.loc[op, "FLOP/B"] == pytest.approx(flops / nbytes, rel=1e-12), op
        assert rows.loc[op, "GFLOP"] == pytest.approx(flops / 1e9, rel=1e-12), op
    # 64 tokens through a weight GEMM: ~62 FLOP/B, far under the balance point
    balance = 989.4e12 / 3.35e12
    assert balance == pytest.approx(295.3, abs=0.1)
    assert totals["balance"]["bf16"] == pytest.approx(balance)
    with_flops = rows["flops"] > 0  # a bf16 model: one balance point; none without FLOPs
    assert np.allclose(rows.loc[with_flops, "balance"], balance)
    assert rows.loc[~with_flops, "balance"].isna().all()
    assert (rows.loc[with_flops, "dtype"] == "bf16").all()
    for op in ("qkv_proj", "gate_up_proj", "lm_head", "attn_decode"):
        assert rows.loc[op, "bound"] == "memory", op
    assert rows.loc["lm_head", "count"] == 1 and rows.loc["qkv_proj", "count"] == L
    assert table["time_us"].sum() / 1e3 == pytest.approx(totals["step_ms"])
    assert table["share_%"].sum() == pytest.approx(100)
    assert totals["sequences"] == S and totals["tokens"] == S
    assert kv_footprint(cfg)["kv_bytes_per_token"] == 2 * L * KV_HEADS * D * BF16 == 131_072


def test_cli_prints_table_kv_and_memory_plan(tmp_path, capsys):
    chart = tmp_path / "step.png"
    assert main(["model=llama3_8b", "hardware=h100_sxm", "backend=vllm",
                 "batch=decode:64x2000", f"chart={chart}"]) == 0
    out = capsys.readouterr().out
    assert "bf16 295, fp8 591 FLOP/B" in out
    for op in ("qkv_proj", "gate_up_proj", "attn_decode", "lm_head", "host_overhead"):
        assert op in out
    assert "131,072 bytes per token" in out
    assert "at context 2,001: 126 blocks per sequence" in out  # default: cached + new tokens
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("model_args", [["batch=decode:8x100"], ["model=flux1_dev"]])
def test_the_chart_goes_into_the_runs_output_dir_by_default(tmp_path, monkeypatch, capsys,
                                                          model_args):
    """No ``chart=``: ``roofline.png`` in the dir ``python -m sim`` would use with the same
    overrides (``hydra.run.dir``, else ``outputs/<date>/<time>``), not the current folder."""
    monkeypatch.chdir(tmp_path)
    assert main([*model_args, f"hydra.run.dir={tmp_path / 'mine'}"]) == 0
    assert (tmp_path / "mine" / "roofline.png").is_file()
    assert main(model_args) == 0
    charts = list(tmp_path.glob("outputs/*/*/roofline.png"))
    assert len(charts) == 1 and not (tmp_path / "roofline.png").exists()
    assert f"roofline chart: {charts[0].relative_to(tmp_path)}" in capsys.readouterr().out


def test_memory_plan_of_llama8b_on_h100(compose_cfg):
    cfg = plain(compose_cfg("model=llama3_8b", "hardware=h100_sxm"))
    plan = memory_plan(cfg, 2048)
    # bf16 weights of the Llama architecture on one GPU, counted by hand
    linear = H * (HEADS + 2 * KV_HEADS) * D + HEADS * D * H + 3 * H * INTER
    weights = (L * linear + 2 * VOCAB * H + (2 * L + 1) * H) * BF16
    assert plan["weights_gib"] == pytest.approx(weights / 2**30)
    # vLLM's rule: the total cudaMemGetInfo reports (79.19 GiB on an H100 SXM 80GB)
    assert plan["usable_gib"] == pytest.approx(81090 * 2**20 * 0.9 / 2**30, rel=1e-9)
    # the profile run's peak is the sampler's: 1,024 requests x 128,256 vocab x 16 bytes
    assert plan["activations_gib"] == pytest.approx(1024 * VOCAB * 16 / 2**30)
    assert "Available KV cache memory" in plan["engine_log"][0]
    assert plan["blocks_per_seq"] == 2048 // 16
    usable_blocks = plan["num_gpu_blocks"] - 1  # vLLM's null block holds no tokens
    assert plan["kv_limited_seqs"] == usable_blocks // 128
    assert plan["max_concurrent_seqs"] == min(plan["kv_limited_seqs"], 1024)
    assert plan["kv_cache_gib"] == pytest.approx(
        plan["usable_gib"] - plan["weights_gib"] - plan["activations_gib"] - plan["other_gib"])


def test_memory_plan_uses_a_num_gpu_blocks_override(compose_cfg, capsys):
    """``kv_cache.num_gpu_blocks`` sizes the simulated cache, so the plan counts with it and
    says so, next to what memory alone would give."""
    cfg = plain(compose_cfg("model=llama3_8b", "hardware=h100_sxm",
                            "kv_cache.num_gpu_blocks=1000"))
    plan = memory_plan(cfg, 2048)
    derived = replica_memory_budget(cfg).num_gpu_blocks
    assert plan["num_gpu_blocks"] == 1000 and plan["memory_num_gpu_blocks"] == derived > 1000
    assert plan["max_tokens"] == 16_000 and plan["kv_limited_seqs"] == 999 // 128
    assert main(["model=llama3_8b", "hardware=h100_sxm", "kv_cache.num_gpu_blocks=1000",
                 "batch=decode:4x100", "chart=none"]) == 0
    out = capsys.readouterr().out
    assert (f"KV cache: 1,000 blocks (override; memory gives {derived:,}) of 16 tokens = "
            "16,000 tokens") in out
    assert memory_plan(plain(compose_cfg("model=llama3_8b", "hardware=h100_sxm")),
                       2048)["num_gpu_blocks"] == derived


def test_window_state_is_reported_and_budgeted(compose_cfg, capsys):
    """A model with sliding-window layers (gpt-oss) holds its window's blocks per request on
    vLLM: explain shows the bound and counts, per sequence, the window blocks of its length
    on top of the growing KV blocks."""
    cfg = plain(compose_cfg("model=gpt_oss_120b"))
    b = replica_memory_budget(cfg)
    state = kv_footprint(cfg)["state_bytes_per_request"]
    assert state == 18 * 2 * 8 * 64 * 2 * 128 and b.state_blocks_per_request == 9
    plan = memory_plan(cfg, 160)  # 10 blocks of KV, and the window's 9 of 10
    assert plan["blocks_per_seq"] == 10 + 9
    plan = memory_plan(cfg, 48)  # shorter than the window: 3 blocks in each group
    assert plan["blocks_per_seq"] == 3 + 3
    assert plan["kv_limited_seqs"] == (plan["num_gpu_blocks"] - 1) // plan["blocks_per_seq"]
    assert main(["model=gpt_oss_120b", "batch=decode:4x100", "chart=none"]) == 0
    assert f"per-request state: at most {state:,} bytes" in capsys.readouterr().out


def test_batch_grammar():
    new, ctx = batch_arrays(parse_batch("prefill:2x100@50+decode:3x7+prefill:1x9"))
    assert new.tolist() == [100, 100, 1, 1, 1, 9]
    assert ctx.tolist() == [50, 50, 7, 7, 7, 0]


def test_mixed_batch_names_both_roofs(compose_cfg):
    cfg = plain(compose_cfg())
    table, totals = operator_table(cfg, *batch_arrays(parse_batch(
        "prefill:1x2048@512+decode:64x2048")))
    rows = table.set_index("operator")
    assert rows.loc["attn_decode", "bound"] == "memory"
    assert rows.loc["gate_up_proj", "bound"] == "compute"  # 2112 tokens: above the balance
    assert rows.loc["attn_prefill", "FLOP/B"] > totals["balance"]["bf16"]


@pytest.mark.parametrize("overrides, batch, says", [
    (["backend=trtllm", "scheduler=trtllm", "cluster.tensor_parallel_size=8"],
     "decode:33x1000", "none for this step; the host launches its"),
    (["backend=trtllm", "scheduler=trtllm", "cluster.tensor_parallel_size=8"],
     "decode:32x1000", "replays the one captured for 32 tokens"),
    ([], "decode:9x1000", "replays the one captured for 16 tokens (padded from 9)"),
    ([], "prefill:1x4096", "none for this step; it runs compiled code"),
])
def test_the_report_says_which_cuda_graph_the_step_replays(compose_cfg, overrides, batch,
                                                           says):
    cfg = plain(compose_cfg("model=llama3_8b", *overrides))
    _, totals = operator_table(cfg, *batch_arrays(parse_batch(batch)))
    assert totals["graph"].startswith("CUDA graph: ") and says in totals["graph"]


def test_the_report_says_what_the_api_server_adds(compose_cfg):
    """SGLang streams in a process of its own, vLLM in its API server; 64 sequences' tokens at
    210.18 µs each stream in 13.45 ms; the constant cost model has no frontend."""
    sglang = plain(compose_cfg("model=llama3_8b", "backend=sglang", "scheduler=sglang",
                               "backend.frontend.per_output_token_us=210.18"))
    line = operator_table(sglang, *batch_arrays(parse_batch("decode:64x1000")))[1]["frontend"]
    assert "in a process of its own (up to 13.45 ms for one token of each of" in line
    assert "one after another" in line
    vllm = plain(compose_cfg("model=llama3_8b"))
    line = operator_table(vllm, *batch_arrays(parse_batch("decode:8x100")))[1]["frontend"]
    assert "the same server" in line and "one instant's arrivals together" in line
    assert frontend_line(plain(compose_cfg("cost_model=constant")), 8) == ""


@pytest.mark.parametrize("args, field", [
    (["batch=decode:64x"], "batch"),
    (["batch=prefill:1x4096@"], "batch"),
    (["batch=decode:0x5"], "batch"),
    (["batch=decode:4x100@3"], "batch"),
    (["batch=verify:1x2"], "batch"),
    (["batch=decode:64x2000,prefill:1x10"], "batch"),  # a comma is not the separator
    (["batch=prefill:1x200000"], "max_model_len"),  # longer than the context window
    (["context=0"], "context"),
    (["context=abc"], "context"),
    (["--decode", "8x100"], "--decode"),
    (["foo=1"], "foo"),
    (["model.foo=1"], "model.foo"),
    (["hardware=tpu_v9"], "hardware"),
])
def test_bad_input_is_one_line_exit_2(args, field, capsys):
    try:
        rc = main([*args, "chart=none"])
    except SystemExit as e:  # composition errors exit from cli.preflight
        rc = e.code
    assert rc == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and err.count("\n") == 1 and field in err, err


def test_model_that_does_not_fit_still_shows_the_step(capsys):
    assert main(["model=llama3_70b", "batch=decode:8x1000", "chart=none"]) == 2
    captured = capsys.readouterr()
    assert "qkv_proj" in captured.out and "memory plan" not in captured.out
    assert captured.err.count("\n") == 1 and "does not fit" in captured.err


@pytest.mark.parametrize("name", HARDWARE)
def test_every_gpu_composes_checks_and_explains(name, compose_cfg, capsys):
    cfg = plain(compose_cfg(f"hardware={name}"))
    hw = cfg.hardware
    check_hardware(hw, cfg.model)
    assert hw.name == name
    assert hw.fp8_flops is None or hw.fp8_flops >= hw.bf16_flops
    assert 16 * 2**30 < hw.hbm_bytes < 300 * 2**30 and 1 <= hw.gpus_per_node <= 72
    text = (Path(__file__).resolve().parents[2] / "conf" / "hardware" / f"{name}.yaml").read_text()
    assert "Source" in text  # each datasheet value says where it came from
    if hw.calibration != name:  # borrowed efficiencies must be declared in the file
        assert "carried over" in text and hw.calibration in text
    assert yaml.safe_load(text)["name"] == name
    assert main([f"hardware={name}", "batch=decode:16x1000", "chart=none"]) == 0
    out = capsys.readouterr().out
    assert f"on 1x {name}" in out and "max concurrent" in out


def test_help_documents_the_batch_grammar(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "prefill:' SEQS 'x' TOKENS ['@' CACHED]" in out and "chart=none" in out


def test_entry_point_bad_batch_is_one_line_without_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "sim.explain", "batch=decode:64x2000@5"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: batch=")
    assert not (tmp_path / "roofline.png").exists()


class _FakeCostModel:
    """Two GEMMs, one with a reported dtype and one without, and a copy without FLOPs, on
    the GPU ``hw``."""

    def __init__(self, hw) -> None:
        self.hw = hw

    def breakdown(self, new, ctx):
        return [SimpleNamespace(name="fp8_gemm", count=1, flops=4e12, bytes=1e9, time_s=3e-3,
                                bound="compute", dtype="fp8"),
                SimpleNamespace(name="untyped_gemm", count=1, flops=1e9, bytes=1e8, time_s=1e-4,
                                bound="memory"),
                SimpleNamespace(name="copy", count=1, flops=0.0, bytes=1e8, time_s=1e-4,
                                bound="memory", dtype="")]

    def step_cost(self, new, ctx):
        return StepCost(3.2e-3, compute_s=3e-3, memory_s=2e-4)


def test_balance_follows_each_operators_dtype(compose_cfg, monkeypatch):
    """An operator meets the compute roof of the dtype the cost model reports for it; without
    one, the model's layer dtype; without FLOPs, no balance point at all."""
    monkeypatch.setattr(explain_module, "build_cost_model",
                        lambda cfg: _FakeCostModel(cfg.hardware))
    cfg = plain(compose_cfg("model.dtype=fp8"))
    table, totals = operator_table(cfg, *batch_arrays(parse_batch("decode:2x10")))
    rows = table.set_index("operator")
    assert rows.loc["fp8_gemm", "balance"] == pytest.approx(1978.9e12 / 3.35e12)
    assert rows.loc["untyped_gemm", "dtype"] == "fp8"  # the model's layer dtype
    assert np.isnan(rows.loc["copy", "balance"]) and rows.loc["copy", "dtype"] == "-"
    assert rows.loc["fp8_gemm", "TFLOP/s"] == pytest.approx(4e12 / 3e-3 / 1e12)
    assert not totals["dtypes_reported"] and totals["bound"] == "compute"


def test_the_header_counts_every_gpu_of_a_pipeline(capsys):
    assert main(["model=llama3_70b", "cluster.tensor_parallel_size=2",
                 "cluster.pipeline_parallel_size=2", "batch=decode:8x1000", "chart=none"]) == 0
    assert "on 4x h100_sxm (TP2 × PP2)" in capsys.readouterr().out
