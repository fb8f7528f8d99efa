"""``python -m calibration validate``: row mapping, unsupported reasons, outputs (tiny CSVs)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calibration.__main__ import main as calibration_main
from calibration.silicon_rows import concurrency_of, plan_rows, range_ratio_of

REPO = Path(__file__).resolve().parents[2]
SILICON = REPO.parent / "shared" / "data" / "aiconfigurator" / "silicon_sample_h100.csv"


def row(**kw) -> dict:
    """One CSV row in the silicon_sample layout (a Llama-3.1-8B agg row unless overridden)."""
    base = {"id": "r", "silicon_data_source": "x", "backend": "vllm", "backend_version": "1",
            "model_path": "meta-llama/Llama-3.1-8B-Instruct", "system": "h100_sxm",
            "precision": np.nan, "mode": "agg", "isl": 64, "osl": 8,
            "gemm_quant_mode": np.nan, "moe_quant_mode": np.nan, "batch_size": 2.0,
            "tp_size": 1.0, "pp_size": 1.0, "attention_dp_size": np.nan, "moe_tp_size": 1.0,
            "moe_ep_size": 1.0, "silicon_ttft_ms": 20.0, "silicon_tpot_ms": 5.0}
    return base | kw


def test_row_maps_to_config_overrides():
    rows = pd.DataFrame([
        row(id="a", backend="trtllm", tp_size=2.0, batch_size=4.0),
        row(id="b", backend="sglang", model_path="Qwen/Qwen3-235B-A22B-FP8", precision="fp8",
            gemm_quant_mode="fp8_block", moe_quant_mode="fp8_block", tp_size=4.0,
            moe_ep_size=4.0, silicon_data_source="s; silicon_concurrency=12"),
        row(id="c", backend="trtllm", model_path="Qwen/Qwen3-32B", precision="fp8",
            gemm_quant_mode="fp8"),
        row(id="d", model_path="MiniMaxAI/MiniMax-M2.5", precision="fp8",
            gemm_quant_mode="fp8", moe_quant_mode="fp8", tp_size=4.0, moe_ep_size=4.0),
        row(id="e", model_path="openai/gpt-oss-120b", precision="fp4",
            gemm_quant_mode="nvfp4", moe_quant_mode="nvfp4", tp_size=2.0),
    ])
    a, b, c, d, e = plan_rows(rows, "h100_sxm").to_dict("records")
    assert a["reason"] == "" and a["model"] == "llama3_8b" and a["scheduler"] == "trtllm"
    assert {"model=llama3_8b", "backend=trtllm", "scheduler=trtllm", "model.dtype=bfloat16",
            "cluster.tensor_parallel_size=2", "workload.concurrency=4",
            "workload.input_tokens=64", "workload.output_tokens=8"} <= set(a["overrides"])
    assert b["model"] == "qwen3_235b_a22b" and b["dtype"] == "fp8_block" and b["concurrency"] == 12
    assert b["scheduler"] == "sglang" and "no sglang scheduler" not in b["note"]
    assert "as Qwen/Qwen3-235B-A22B" in b["note"]
    assert {"cluster.expert_parallel_size=4", "model.dtype=fp8_block",
            "model.moe_dtype=''"} <= set(b["overrides"])
    # FP8 KV cache under TensorRT-LLM's fp8 rows only
    assert "kv_cache.dtype=auto" in a["overrides"] and "kv_cache.dtype=auto" in b["overrides"]
    assert {"model.dtype=fp8", "kv_cache.dtype=fp8"} <= set(c["overrides"])
    # a block-scaled checkpoint's experts stay block-scaled under an "fp8" row
    assert {"model.dtype=fp8", "model.moe_dtype='fp8_block'"} <= set(d["overrides"])
    # gpt-oss's 4-bit rows serve its checkpoint: bf16 layers, its own MXFP4 experts
    assert e["reason"] == "" and e["model"] == "gpt_oss_120b" and e["dtype"] == "bfloat16"
    assert "model.dtype=bfloat16" in e["overrides"]
    assert not any(o.startswith("model.moe_dtype") for o in e["overrides"])


def test_unsupported_rows_get_reasons():
    rows = pd.DataFrame([
        row(id="fp4", precision="fp4", gemm_quant_mode="nvfp4"),  # a bf16 checkpoint
        row(id="fp4_dense", model_path="openai/gpt-oss-120b", precision="fp4",
            gemm_quant_mode="nvfp4", moe_quant_mode="bf16"),  # its experts, not its layers
        row(id="unknown", model_path="acme/Nope-7B"),
        row(id="disagg", mode="disagg", silicon_data_source="s; silicon_concurrency=4",
            prefill_attention_dp_size=4.0),
        row(id="disagg_c", mode="disagg", decode_batch_size=4.0, decode_num_workers=2.0),
        row(id="system", system="a100_sxm"),
    ])
    reasons = plan_rows(rows, "h100_sxm").set_index("id")["reason"]
    assert "nvfp4" in reasons["fp4"] and "not modelled" in reasons["fp4"]
    assert "nvfp4" in reasons["fp4_dense"] and "not modelled" in reasons["fp4_dense"]
    assert "no conf/model" in reasons["unknown"]
    assert "prefill_attention_dp_size=4" in reasons["disagg"]
    assert "without silicon_concurrency" in reasons["disagg_c"]
    assert "system=a100_sxm" in reasons["system"]


def test_disaggregated_row_maps_to_pools():
    base = dict(mode="disagg", model_path="Qwen/Qwen3-32B", batch_size=np.nan,
                silicon_data_source="s; silicon_concurrency=24",
                prefill_num_workers=2.0, prefill_tp_size=1.0, decode_num_workers=1.0,
                decode_tp_size=4.0, decode_batch_size=24.0, prefill_moe_ep_size=0.0,
                decode_moe_ep_size=0.0)
    near = row(id="near", **base)
    far = row(id="far", **(base | {"prefill_num_workers": 6.0}))  # 6 + 4 GPUs: two nodes
    a, b = plan_rows(pd.DataFrame([near, far]), "h100_sxm").to_dict("records")
    assert a["reason"] == "" and a["concurrency"] == 24 and a["tp"] == 4
    assert {"cluster=disagg", "cluster.prefill_replicas=2", "cluster.decode_replicas=1",
            "cluster.prefill_tensor_parallel_size=1", "cluster.decode_tensor_parallel_size=4",
            "cluster.expert_parallel_size=1"} <= set(a["overrides"])
    assert not any("kv_transfer_bandwidth" in o for o in a["overrides"])
    assert "cluster.kv_transfer_bandwidth=${hardware.internode_bandwidth}" in b["overrides"]


def test_concurrency_prefers_stated_value():
    rows = pd.DataFrame({"silicon_data_source": ["a; silicon_concurrency=12", "b", "c"],
                         "batch_size": [8.0, 8.0, 16.0],
                         "attention_dp_size": [np.nan, 4.0, np.nan]})
    assert concurrency_of(rows).tolist() == [12, 32, 16]


def test_inferencex_rows_draw_their_lengths_as_its_client_does():
    """InferenceX's exports (``source_file=<date>.csv``, ``db-dump/...``) ran
    ``--random-range-ratio 0.8``: lengths uniform on [int(0.8 L), L]; other rows fixed."""
    sources = ["source_file=2026-03-25.csv; model=GPT-OSS-120B; silicon_concurrency=4",
               "db-dump/2026-04-27; config_id=494; silicon_concurrency=6",
               "source_file=/Users/x/aic-auto-gap-analysis/data/h100_sxm/vllm/q.csv; "
               "silicon_concurrency=8", "x"]
    assert range_ratio_of(pd.DataFrame({"silicon_data_source": sources})).tolist() == \
        [0.8, 0.8, 1.0, 1.0]
    ix, fixed = plan_rows(pd.DataFrame([row(id="ix", silicon_data_source=sources[0],
                                            isl=1000, osl=9),
                                        row(id="fixed", silicon_data_source=sources[2])]),
                          "h100_sxm").to_dict("records")
    assert {"workload.input.dist=uniform", "workload.input.low=800",
            "workload.input.high=1000", "workload.output.dist=uniform",
            "workload.output.low=7", "workload.output.high=9"} <= set(ix["overrides"])
    assert not any(o.startswith("workload.input_tokens") for o in ix["overrides"])
    assert ix["range_ratio"] == 0.8 and "InferenceX" in ix["note"]
    assert {"workload.input_tokens=64", "workload.output_tokens=8"} <= set(fixed["overrides"])
    assert fixed["range_ratio"] == 1.0


def test_gap_analysis_rows_run_the_generated_deployment():
    """aiconfigurator's gap-analysis rows ran what its generator wrote for the row's batch size:
    budget batch + isl + 1500, TensorRT-LLM unchunked with 80% of its free memory for the KV
    cache, CUDA graphs for every batch size up to it, behind Dynamo's frontend (not modelled:
    a wire). Not SGLang's (no generator before its
    version), nor rows with more clients than the batch, nor other sources."""
    gap = "source_file=/Users/x/aic-auto-gap-analysis/data/h100_sxm/v/q.csv; " \
          "silicon_concurrency=16"
    plans = plan_rows(pd.DataFrame([
        row(id=b, backend=b, silicon_data_source=gap, batch_size=16.0, isl=1000, osl=100)
        for b in ("vllm", "trtllm", "sglang")] + [
        row(id="more_clients", silicon_data_source=gap, batch_size=4.0),
        row(id="other", batch_size=16.0)]), "h100_sxm").set_index("id")
    wire = {f"backend.frontend.{k}=0" for k in ("per_request_ms", "per_prompt_token_us",
                                                 "per_output_token_us", "latency_ms")}
    assert {"scheduler.max_num_seqs=16", "scheduler.max_num_batched_tokens=2516"} | wire <= \
        set(plans.loc["vllm", "overrides"])
    assert {"scheduler.max_num_seqs=16", "scheduler.max_num_batched_tokens=2516",
            "scheduler.enable_chunked_prefill=false", "scheduler.max_model_len=1100",
            "kv_cache.gpu_memory_utilization=0.8"} | wire <= set(plans.loc["trtllm", "overrides"])
    assert "kv_cache.gpu_memory_utilization=0.8" not in plans.loc["vllm", "overrides"]
    graphs = f"backend.cuda_graph_batch_sizes=[{','.join(map(str, range(1, 17)))}]"
    assert graphs in plans.loc["vllm", "overrides"] and graphs in plans.loc["trtllm",
                                                                              "overrides"]
    assert "generated deployment" in plans.loc["vllm", "note"]
    for other in ("sglang", "more_clients", "other"):
        overrides = plans.loc[other, "overrides"]
        assert not any(o.startswith(("scheduler.", "backend.")) for o in overrides)


def test_inferencex_row_simulates_its_drawn_lengths(tmp_path):
    from hydra import compose

    from calibration.silicon_replay import (
        RowSimulator,
        request_latency_estimate,
        requests_for_seed,
    )

    plan = plan_rows(pd.DataFrame([row(id="ix", isl=1000, osl=20, batch_size=4.0,
                                       silicon_data_source="source_file=2026-03-25.csv")]),
                     "h100_sxm").iloc[0].to_dict()
    with RowSimulator(25, 0, "burst") as simulator:
        cfg = simulator.compose(plan)
        requests = requests_for_seed(cfg.workload, cfg.seed)
        fixed = compose("config", overrides=[*plan["overrides"], "workload.input_tokens=900",
                                             "workload.output_tokens=18"])
        # the harnesses' latency estimate takes the middle of the range
        assert request_latency_estimate(cfg) == pytest.approx(request_latency_estimate(fixed))
    assert len(requests) == 100
    for column, low, high in (("input_tokens", 800, 1000), ("output_tokens", 16, 20)):
        lengths = requests[column].to_numpy()
        assert lengths.min() >= low and lengths.max() <= high
        assert len(np.unique(lengths)) > 10 or high - low < 10
        assert abs(lengths.mean() - (low + high) / 2) < 0.05 * high


def test_command_writes_json_and_parquet(tmp_path, capsys):
    csv = tmp_path / "s.csv"
    pd.DataFrame([row(id="ok"), row(id="pp", tp_size=1.0, attention_dp_size=2.0,
                                    batch_size=1.0),
                  row(id="fp4", gemm_quant_mode="nvfp4")]).to_csv(csv, index=False)
    out = tmp_path / "run"
    rc = calibration_main(["validate", f"silicon_csv={csv}", "requests_per_client=3",
                           "harness=ramp", f"hydra.run.dir={out}"])
    assert rc == 0
    doc = json.loads((out / "validate.json").read_text())
    table = pd.read_parquet(out / "rows.parquet")
    assert doc["rows"] == 3 and doc["simulated"] == 1
    assert {u["id"] for u in doc["unsupported"]} == {"pp", "fp4"}
    assert "data_parallel_size" in table.set_index("id").loc["pp", "reason"]
    ok = table.set_index("id").loc["ok"]
    assert ok["pred_ttft_ms"] > 0 and ok["pred_tpot_ms"] > 0
    assert ok["steady_requests"] == 2  # 2 clients × 3 requests, first and last not measured
    assert np.isclose(ok["ttft_err_pct"], (ok["pred_ttft_ms"] / 20.0 - 1) * 100)
    assert doc["summary"]["vllm"]["ttft"]["n"] == 1
    printed = capsys.readouterr().out
    assert "Absolute % error per backend and metric" in printed
    assert "Rows not simulated: 2 of 3" in printed


def test_burst_harness_measures_every_request(tmp_path):
    csv = tmp_path / "s.csv"
    pd.DataFrame([row(id="ok")]).to_csv(csv, index=False)
    out = tmp_path / "run"
    rc = calibration_main(["validate", f"silicon_csv={csv}", "requests_per_client=4",
                           f"hydra.run.dir={out}"])
    assert rc == 0
    ok = pd.read_parquet(out / "rows.parquet").set_index("id").loc["ok"]
    assert ok["steady_requests"] == 8  # 2 clients × 4 requests, all measured
    assert ok["pred_ttft_ms"] == ok["pred_ttft_all_ms"]
    assert json.loads((out / "validate.json").read_text())["harness"] == "burst"


def test_desynchronise_spreads_second_requests_only():
    from calibration.silicon_replay import desynchronise

    req = pd.DataFrame({"client": np.arange(12) % 4, "think_time_s": np.full(12, 0.5)})
    out = desynchronise(req, spread_s=2.0)
    # rows 4..7 are each client's second request: client i waits i/4 of 2 s more
    assert out["think_time_s"].tolist() == [0.5] * 4 + [0.5, 1.0, 1.5, 2.0] + [0.5] * 4
    assert req["think_time_s"].tolist() == [0.5] * 12  # the input is not changed


def test_desync_harness_bursts_first_round_then_spreads(tmp_path):
    csv = tmp_path / "s.csv"
    pd.DataFrame([row(id="ok", batch_size=8.0, isl=512, osl=16)]).to_csv(csv, index=False)
    preds = {}
    for harness in ("burst", "desync"):
        out = tmp_path / harness
        assert calibration_main(["validate", f"silicon_csv={csv}", "requests_per_client=4",
                                 f"harness={harness}", f"hydra.run.dir={out}"]) == 0
        preds[harness] = pd.read_parquet(out / "rows.parquet").set_index("id").loc["ok"]
    assert preds["desync"]["steady_requests"] == 32  # every request is measured
    # the same first-round burst, then fewer prompts per prefill step: a lower mean TTFT
    assert preds["desync"]["pred_ttft_ms"] < preds["burst"]["pred_ttft_ms"]


def test_bad_input_is_one_line_exit_2(tmp_path, capsys):
    assert calibration_main(["validate", f"silicon_csv={tmp_path / 'no.csv'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "silicon_csv=" in err[0] and "not a file" in err[0]
    csv = tmp_path / "s.csv"
    pd.DataFrame([row(id="ok")]).to_csv(csv, index=False)
    assert calibration_main(["validate", f"silicon_csv={csv}", "harness=lockstep"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "harness='lockstep'" in err[0] and "burst" in err[0]
    assert calibration_main(["validate", f"silicon_csv={tmp_path}", "nokey=1"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert calibration_main(["validate", f"silicon_csv={csv}", "fit_compute=true"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fit_compute=True: needs gpustack_csv=PATH" in err[0]


def test_two_real_rows(tmp_path):
    if not SILICON.is_file():
        pytest.skip(f"silicon CSV not found at {SILICON} (expected ../shared next to the repo)")
    df = pd.read_csv(SILICON)
    small = df[(df["mode"] == "agg") & (df["batch_size"] <= 8) & (df["osl"] <= 128)
               & df["model_path"].str.contains("Llama-3.1-8B")].head(2)
    csv = tmp_path / "two.csv"
    small.to_csv(csv, index=False)
    rc = calibration_main(["validate", f"silicon_csv={csv}", f"hydra.run.dir={tmp_path / 'o'}"])
    assert rc == 0
    table = pd.read_parquet(tmp_path / "o" / "rows.parquet")
    assert len(table) == 2 and table["pred_ttft_ms"].notna().all()
    assert np.isfinite(table[["ttft_err_pct", "tpot_err_pct"]].to_numpy()).all()


def gpustack_rows(model: str, isl: int) -> list[dict]:
    """The gpustack CSV rows of one 20-request burst of ``model`` on vLLM v0.11."""
    note = (f"vllm bench serve client; 20 requests; total in/out tokens {20 * isl}/200; "
            f"serve cmd: vllm serve {model}")
    return [{"source": "doc.md", "engine": "vLLM [vLLM: v0.11.0]", "model": model,
             "dataset_or_lengths": f"random (input {isl}, output 10)",
             "input_len": str(isl), "output_len": "10",
             "request_rate_or_concurrency": "request_rate=inf", "metric": m, "value": v,
             "notes": note}
            for m, v in (("request_throughput", 4.0), ("mean_ttft", 3000.0),
                         ("median_ttft", 3000.0), ("mean_tpot", 40.0))]


def two_model_csv(tmp_path):
    """A gpustack CSV of one Qwen3-8B and one Qwen3-32B burst (Qwen3-32B: held out of the
    shipped vLLM frontend fit)."""
    csv = tmp_path / "runs.csv"
    pd.DataFrame(gpustack_rows("Qwen/Qwen3-8B", 2000)
                 + gpustack_rows("Qwen/Qwen3-32B", 2000)).to_csv(csv, index=False)
    return csv


def test_gpustack_compute_fit_trains_on_the_frontend_fits_models_only(tmp_path, capsys):
    """``fit_compute=true``: the compute scale is fitted on the runs of the models the
    calibrated frontend block trained on (vLLM: Qwen3-32B is held out), reported on both
    splits, not written into the shipped file by default; the throughput ratio per model is
    in validate.json."""
    from calibration.silicon_rows import calibration_file

    csv = two_model_csv(tmp_path)
    shipped = calibration_file("h100_sxm", "vllm").read_text()
    out = tmp_path / "out"
    assert calibration_main(["validate", f"gpustack_csv={csv}", "fit_compute=true",
                             "max_evals=3", "n_jobs=1", f"hydra.run.dir={out}"]) == 0
    text = capsys.readouterr().out
    assert "train runs, before (scale 1) the vllm compute fit" in text
    assert "held_out runs, after (scale" in text
    assert calibration_file("h100_sxm", "vllm").read_text() == shipped
    doc = json.loads((out / "validate.json").read_text())
    block = doc["compute_fit"]["vllm"]
    assert 0.3 <= block["scale"] <= 1.5 and block["held_out_models"] == ["qwen3_235b_a22b",
                                                                          "qwen3_32b"]
    assert block["errors"]["train"]["request_throughput"]["n"] == 1
    assert block["errors"]["held_out"]["request_throughput"]["n"] == 1
    assert {r["model"] for r in doc["throughput_ratio_by_model"]} == {"qwen3_8b", "qwen3_32b"}


def test_gpustack_frontend_and_compute_fit_jointly(tmp_path, capsys):
    """``fit_frontend=true fit_compute=true``: one fit of the frontend costs and the compute
    scale on the training model; its blocks say so and agree; the shipped file is untouched
    when neither is written, and writing one of the pair without the other is refused."""
    from calibration.silicon_rows import calibration_file

    csv = two_model_csv(tmp_path)
    assert calibration_main(["validate", f"gpustack_csv={csv}", "fit_frontend=true",
                             "fit_compute=true"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "write_compute=False" in err[0] and "jointly" in err[0]
    shipped = calibration_file("h100_sxm", "vllm").read_text()
    out = tmp_path / "out"
    assert calibration_main(["validate", f"gpustack_csv={csv}", "fit_frontend=true",
                             "fit_compute=true", "write_frontend=false", "max_evals=7",
                             "n_jobs=1", f"hydra.run.dir={out}"]) == 0
    text = capsys.readouterr().out
    assert "held_out runs, after the vllm frontend fit" in text
    scales = set(re.findall(r"'compute_scale': ([0-9.]+)", text))
    assert len(scales) >= 2  # the trials vary the scale with the costs
    assert calibration_file("h100_sxm", "vllm").read_text() == shipped
    doc = json.loads((out / "validate.json").read_text())
    front, compute = doc["frontend_fit"]["vllm"], doc["compute_fit"]["vllm"]
    assert str(compute["scale"]) in scales and "jointly with the frontend" in compute["method"]
    assert f"jointly with the compute scale ({compute['scale']}" in front["method"]
    assert compute["errors"]["held_out"]["request_throughput"]["n"] == 1
