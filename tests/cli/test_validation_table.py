"""One case per row of ``docs/validation.md``: every check of the validation layer refuses its
bad input with one line that names the field and the value, and says what would be valid.

A case runs one of three ways: ``cli`` through ``python -m sim`` (exit code 2, one ``error:``
line on stderr, no traceback, no outputs), ``compose`` through the CLI's own preflight in this
process (``cli.preflight.compose_or_exit``: the same line and exit code), or ``validate``
through ``cli.validation.validate_config`` on the composed config (one ``ConfigError`` or
``WorkloadError`` of one line). Each error line must contain the row's "message contains"
text from the docs and the case's own field and value.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

import conf.schema  # noqa: F401  (registers the config schemas)
from cli.preflight import compose_or_exit
from cli.validation import validate_config
from scenarios import WorkloadError
from sim.errors import ConfigError

DOC = Path(__file__).resolve().parents[2] / "docs" / "validation.md"
HEADER = "arrival_time_s,input_tokens,output_tokens\n"
LLAMA = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 256,
         "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 512,
         "vocab_size": 1000, "max_position_embeddings": 2048}
# files the cases name, relative to the directory they run in
FILES = {
    "no_output_col.csv": "arrival_time_s,input_tokens\n0.0,10\n0.5,20\n",
    "unknown_cols.csv": "when,prompt,answer\n0.0,10,5\n",
    "azure_bad_time.csv": "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,10,5\n",
    "not_json.jsonl": '{"timestamp": 0, "input_length": 10, "output_length": 5}\n{"timestamp"\n',
    "no_key.jsonl": '{"timestamp": 0, "input_length": 10}\n',
    "negative_len.csv": HEADER + "0.0,10,5\n0.1,-5,5\n",
    "fractional_len.csv": HEADER + "0.0,10,5\n0.1,12.5,5\n",
    "unsorted.csv": HEADER + "0.0,10,5\n0.5,10,5\n0.2,10,5\n",
    "nan_arrival.csv": HEADER + "0.0,10,5\nnan,10,5\n",
    "empty_cell.csv": HEADER + "0.0,10,5\n0.1,,5\n",
    "text_len.csv": HEADER + "0.0,10,5\n0.1,ten,5\n",
    "negative_arrival.csv": HEADER + "-1.0,10,5\n0.0,10,5\n",
    "late_arrival.csv": HEADER + "0.0,10,5\n2e9,10,5\n",
    "huge_len.csv": HEADER + "0.0,1e30,5\n",
    "header_only.csv": HEADER,
    "empty.csv": "",
    "bad_hash.csv": HEADER.strip() + ",hash_ids\n0.0,10,5,1 2 x\n",
    "zero_len.csv": HEADER + "0.0,0,5\n",
    "ok.csv": HEADER + "0.0,10,5\n100.0,10,5\n",
    "lengths_zero.csv": "input_tokens\n10\n0\n",
    "hf_invalid/config.json": "{not json",
    "hf_list/config.json": "[1, 2]",
    "hf_gpt2/config.json": json.dumps({"architectures": ["GPT2LMHeadModel"]}),
    "hf_no_hidden/config.json": json.dumps({k: v for k, v in LLAMA.items()
                                            if k != "hidden_size"}),
    "hf_zero_heads/config.json": json.dumps({**LLAMA, "num_attention_heads": 0}),
    "hf_text_layers/config.json": json.dumps({**LLAMA, "num_hidden_layers": "two"}),
    "hf_int8/config.json": json.dumps({**LLAMA, "torch_dtype": "int8"}),
    "hf_deep/config.json": "[" * 100_000 + "]" * 100_000,
    "hf_huge_int/config.json": json.dumps(LLAMA)[:-1] + ', "vocab_size": ' + "9" * 5000 + "}",
    "bool_len.jsonl": '{"timestamp": 0, "input_length": true, "output_length": 5}\n',
    "deep.jsonl": ('{"timestamp": 0, "input_length": 10, "output_length": 5}\n'
                   '{"timestamp": 1, "input_length": ' + "[" * 100_000 + "]" * 100_000 + "}\n"),
    "huge_int.jsonl": '{"timestamp": 0, "input_length": ' + "9" * 5000 + ', "output_length": 5}\n',
    "bad.csv.gz": b"\x1f\x8b" + b"not gzip after all",
    "output_dir_used/.hydra/config.yaml": "{}",  # the cli case's own run dir: another run's
}
SMALL = ("workload.num_requests=20", "plots=false")
TRACE = ("workload=trace",)
DISAGG = ("cluster=disagg", "cluster.prefill_replicas=1", "cluster.decode_replicas=1")
DIFFUSION = ("workload=diffusion", "cluster=diffusion")


@dataclass(frozen=True)
class Case:
    """Overrides of one bad run, the texts its error line must hold, and how it runs."""

    overrides: tuple[str, ...]
    expect: tuple[str, ...]
    via: str = "validate"  # cli | compose | validate


def C(*overrides: str, expect: tuple[str, ...], via: str = "validate") -> Case:
    """A case (shorthand of the table below)."""
    return Case(tuple(overrides), expect, via)


CASES: dict[str, Case] = {
    # ---- composition (cli.preflight): schemas, options, model files
    "model_unknown": C("model=nonexistent", expect=("model", "nonexistent"), via="cli"),
    "scheduler_unknown": C("scheduler=nonexistent", expect=("scheduler", "nonexistent"),
                           via="cli"),
    "hidden_size_not_int": C("model.hidden_size=abc", expect=("model.hidden_size", "abc"),
                             via="cli"),
    "model_unknown_key": C("model.foo=1", expect=("model.foo",), via="cli"),
    "not_optional": C("workload.rate=null", expect=("workload.rate",), via="compose"),
    "slo_unknown_metric": C("slo.p99_ttft_ms=500", expect=("slo.p99_ttft_ms",), via="compose"),
    "key_inside_null_field": C("workload.total_length.dist=fixed",
                               expect=("workload.total_length.dist",), via="cli"),
    "null_field_dict": C("workload.total_length={dist:fixed,value:100}",
                         expect=("workload.total_length",), via="compose"),
    "hf_config_missing": C("model=hf_nowhere/config.json", expect=("model", "hf_nowhere"),
                           via="compose"),
    "hf_config_invalid_json": C("model=hf_invalid/config.json", expect=("model", "hf_invalid"),
                                via="compose"),
    "hf_config_not_object": C("model=hf_list/config.json", expect=("model", "hf_list"),
                              via="compose"),
    "hf_config_architecture": C("model=hf_gpt2/config.json", expect=("model", "GPT2LMHeadModel"),
                                via="compose"),
    "hf_config_missing_field": C("model=hf_no_hidden/config.json", expect=("model", "hidden_size"),
                                 via="compose"),
    "hf_config_bad_value": C("model=hf_zero_heads/config.json", expect=("model", "hf_zero_heads"),
                             via="compose"),
    "hf_config_field_type": C("model=hf_text_layers/config.json",
                              expect=("model.num_hidden_layers", "two"), via="compose"),
    "hf_config_dtype": C("model=hf_int8/config.json", expect=("model", "int8"), via="compose"),
    "hf_config_too_deep": C("model=hf_deep/config.json", expect=("model", "hf_deep"),
                            via="compose"),
    "hf_config_huge_int": C("model=hf_huge_int/config.json", expect=("model", "hf_huge_int"),
                            via="compose"),
    # ---- what the user probably meant (cli.hints), and output folders
    "option_did_you_mean": C("model=llama3_8bb", expect=("model", "llama3_8bb"), via="cli"),
    "key_did_you_mean": C("workload.rat=3", expect=("workload.rat",), via="cli"),
    "vllm_flag": C("--model", "llama3_8b", expect=("--model",), via="cli"),
    "hf_repo_id": C("model=meta-llama/Llama-3.1-8B", expect=("model", "meta-llama/Llama-3.1-8B",
                                                             "model=llama3_8b"), via="compose"),
    "model_option_of_another_run": C("model=Llama-3.1-8B@1a2b3c4d",
                                     expect=("Llama-3.1-8B@1a2b3c4d",), via="cli"),
    "output_dir_used": C(expect=("hydra.run.dir=", "output_dir_used"), via="cli"),
    # ---- every number finite; the run's own fields
    "non_finite": C("hardware.hbm_bandwidth=nan", expect=("hardware.hbm_bandwidth=nan",)),
    "non_finite_slo": C("slo.ttft_ms=inf", expect=("slo.ttft_ms=inf",)),
    "seed_negative": C("seed=-1", expect=("seed=-1",)),
    "progress_unknown": C("progress=maybe", expect=("progress='maybe'",)),
    "engine_unknown": C("engine=numba", expect=("engine='numba'",)),
    # ---- model
    "model_dim_positive": C("model.num_hidden_layers=0", expect=("model.num_hidden_layers=0",)),
    "model_int_negative": C("model.q_lora_rank=-1", expect=("model.q_lora_rank=-1",)),
    "model_layers_limit": C("model.num_hidden_layers=20000",
                            expect=("model.num_hidden_layers=20000",)),
    "kv_heads_divide": C("model.num_key_value_heads=5", expect=("model.num_key_value_heads=5",)),
    "model_dtype": C("model.dtype=int4", expect=("model.dtype='int4'",)),
    "moe_top_k": C("model=qwen3_30b_a3b", "model.num_experts_per_tok=1000",
                   expect=("model.num_experts_per_tok=1000",)),
    "layer_types_length": C("model.layer_types=[full_attention]",
                            expect=("model.layer_types", "1 entries")),
    # ---- hardware
    "hardware_positive": C("hardware.num_sms=0", expect=("hardware.num_sms=0",)),
    "hardware_memory_limit": C("hardware.hbm_bytes=1e30", expect=("hardware.hbm_bytes=1e+30",)),
    "fp8_flops_negative": C("hardware.fp8_flops=-1", expect=("hardware.fp8_flops=-1",)),
    "fp32_flops_negative": C("hardware.fp32_flops=-1", expect=("hardware.fp32_flops=-1",)),
    "fp8_without_tensor_cores": C("model.dtype=fp8", "hardware=a100_80g_sxm",
                                  expect=("model.dtype='fp8'", "a100_80g_sxm")),
    "calibration_name": C("hardware.calibration=''", expect=("hardware.calibration=''",)),
    "calibration_file_missing": C("cost_model.calibration=nowhere.yaml",
                                  expect=("cost_model.calibration='nowhere.yaml'",)),
    "frontend_negative": C("backend.frontend.per_request_ms=-1",
                           expect=("backend.frontend.per_request_ms=-1",)),
    "eager_launch_negative": C("backend.eager_launch_us=-1",
                               expect=("backend.eager_launch_us=-1",)),
    "cuda_graph_max_bs_zero": C("backend.cuda_graph_max_bs=0",
                                expect=("backend.cuda_graph_max_bs=0",)),
    # ---- scheduler
    "max_num_seqs_zero": C("scheduler.max_num_seqs=0", expect=("scheduler.max_num_seqs=0",),
                           via="cli"),
    "budget_below_seqs": C("scheduler.max_num_batched_tokens=100", "scheduler.max_num_seqs=200",
                           expect=("scheduler.max_num_batched_tokens=100",)),
    "chunk_over_budget": C("scheduler=sarathi", "scheduler.chunk_size=4096",
                           expect=("scheduler.chunk_size=4096",), via="cli"),
    "whole_prompt_budget": C("scheduler=static", "scheduler.max_num_batched_tokens=4096",
                             expect=("scheduler.max_num_batched_tokens=4096",)),
    "queue_delay_negative": C("scheduler=dynamic", "scheduler.max_queue_delay_ms=-1",
                              expect=("scheduler.max_queue_delay_ms=-1",), via="cli"),
    "policy_unknown": C("scheduler.policy=lifo", expect=("scheduler.policy", "lifo"), via="cli"),
    "policy_not_vllm": C("scheduler=sarathi", "scheduler.policy=priority",
                         expect=("scheduler.policy='priority'",)),
    "max_model_len_over_model": C("scheduler.max_model_len=10000000",
                                  expect=("scheduler.max_model_len=10000000",)),
    # ---- KV cache
    "mem_fraction_static": C("kv_cache.mem_fraction_static=1.5",
                             expect=("kv_cache.mem_fraction_static=1.5",)),
    "gpu_mem_util_too_big": C("kv_cache.gpu_memory_utilization=1.5",
                              expect=("kv_cache.gpu_memory_utilization=1.5",), via="cli"),
    "kv_dtype": C("kv_cache.dtype=int8", expect=("kv_cache.dtype='int8'",)),
    "preemption_mode": C("kv_cache.preemption=drop", expect=("kv_cache.preemption='drop'",)),
    "offload_without_prefix": C("kv_cache.cpu_offload_gb=4", expect=("kv_cache.cpu_offload_gb",)),
    "num_gpu_blocks_small": C("kv_cache.num_gpu_blocks=1", expect=("kv_cache.num_gpu_blocks=1",)),
    "num_gpu_blocks_limit": C("kv_cache.num_gpu_blocks=10000000000000000000",
                              expect=("kv_cache.num_gpu_blocks=10000000000000000000",)),
    "kv_block_size_backend": C("kv_cache.block_size=17",
                               expect=("kv_cache.block_size=17", "[1, 8, 16, 32, 64, 128, 256]")),
    # ---- parallel layout, memory fit, cluster
    "model_does_not_fit": C("model=llama3_70b",
                            expect=("cluster.tensor_parallel_size=1", "llama3_70b"), via="cli"),
    "pool_does_not_fit": C(*DISAGG, "model=llama3_70b", "cluster.tensor_parallel_size=4",
                           "cluster.decode_tensor_parallel_size=1",
                           expect=("cluster.decode_tensor_parallel_size=1", "llama3_70b")),
    "tp_over_node": C("cluster.tensor_parallel_size=16",
                      expect=("cluster.tensor_parallel_size=16",)),
    "tp_divides_heads": C("cluster.tensor_parallel_size=3",
                          expect=("cluster.tensor_parallel_size=3",)),
    "pool_tp_divides_heads": C(*DISAGG, "cluster.prefill_tensor_parallel_size=3",
                               expect=("cluster.prefill_tensor_parallel_size=3",)),
    "pp_over_layers": C("cluster.pipeline_parallel_size=33",
                        expect=("cluster.pipeline_parallel_size=33",)),
    "ep_not_tp": C("model=qwen3_30b_a3b", "cluster.tensor_parallel_size=2",
                   "cluster.expert_parallel_size=4", expect=("cluster.expert_parallel_size=4",)),
    "ep_dense_model": C("cluster.expert_parallel_size=2",
                        expect=("cluster.expert_parallel_size=2", "llama3_8b")),
    "data_parallel": C("cluster.data_parallel_size=2", expect=("cluster.data_parallel_size=2",)),
    "replicas_positive": C("cluster.replicas=0", expect=("cluster.replicas=0",)),
    "replicas_limit": C("cluster.replicas=100000", expect=("cluster.replicas=100000",)),
    "router_unknown": C("cluster.replicas=2", "cluster.router=nope",
                        expect=("cluster.router", "nope"), via="cli"),
    "cluster_time_limit": C("cluster.failure.mtbf_s=1e12", expect=("cluster.failure.mtbf_s",)),
    "prefix_hash_mismatch": C("workload.system_prompt.count=2", "cluster.prefix_block_tokens=16",
                              expect=("workload.hash_block_tokens=512",)),
    # ---- diffusion node pool (cluster=diffusion, mixed)
    "workload_cluster_kind": C("workload=diffusion", "model=flux1_dev",
                               expect=("workload.kind='diffusion'", "cluster=diffusion"),
                               via="cli"),
    "llm_workload_diffusion_cluster": C("cluster=diffusion", expect=("workload.kind='llm'",)),
    "llm_model_kind": C("model=flux1_dev", expect=("model='flux1_dev'", "cluster=single")),
    "diffusion_model_kind": C(*DIFFUSION, expect=("model='llama3_8b'",)),
    "job_model_not_diffusion": C(*DIFFUSION, "model=flux1_dev", "workload.model=llama3_8b",
                                 expect=("workload.model='llama3_8b'",), via="cli"),
    "job_shape_invalid": C(*DIFFUSION, "model=flux1_dev", "workload.height=1000",
                           expect=("workload.height=1000", "flux1_dev"), via="cli"),
    "job_mix_shape_invalid": C(*DIFFUSION, "model=flux1_dev",
                               "workload.mix=[{height: 1000, weight: 1}]",
                               expect=("workload.mix[0].height=1000", "flux1_dev"), via="cli"),
    "job_mix_model_unknown": C("workload=diffusion_mix", "cluster=diffusion", "model=flux1_dev",
                               "workload.mix.1.model=nope",
                               expect=("workload.mix[1].model='nope'",)),
    "job_mix_unknown_key": C("workload=diffusion", "cluster=diffusion", "model=flux1_dev",
                             "workload.mix=[{steps: 28}, {height: 512, foo: 1}]",
                             expect=("workload.mix[1]", "'foo'"), via="compose"),
    "job_shape_constant_cost": C(*DIFFUSION, "model=flux1_dev", "cluster.job_cost.name=constant",
                                 "workload.width=1000", expect=("workload.width=1000",)),
    "job_plan_heads": C(*DIFFUSION, "model=sd35_large", "cluster.job_cost.name=constant",
                        "cluster.gpus_per_job=4", "cluster.parallel.ulysses=4",
                        expect=("cluster.parallel.ulysses=4", "sd35_large")),
    "mixed_job_model_llm": C("workload=mixed", "cluster=mixed", "workload.model=llama3_8b",
                             expect=("workload.model='llama3_8b'",), via="cli"),
    "diffusion_pipeline_positive": C(*DIFFUSION, "model=flux1_dev", "model.diffusion.dit.heads=0",
                                     expect=("model.diffusion.dit.heads=0",)),
    "diffusion_vae_positive": C(*DIFFUSION, "model=flux1_dev",
                                "model.diffusion.vae.spatial_compression=0",
                                expect=("model.diffusion.vae.spatial_compression=0",), via="cli"),
    "diffusion_attention_impl_unknown": C(*DIFFUSION, "model=flux1_dev",
                                          "model.diffusion.attention_impl=flash9",
                                          expect=("model.diffusion.attention_impl='flash9'",),
                                          via="cli"),
    "diffusion_execution_unknown": C(*DIFFUSION, "model=flux1_dev",
                                     "model.diffusion.execution=jit",
                                     expect=("model.diffusion.execution='jit'",)),
    "diffusion_plan_memory": C(*DIFFUSION, "model=hunyuan_video", "hardware=l20",
                               "cluster.gpus_per_job=1", "cluster.parallel.plan=fixed",
                               "workload.num_requests=2",
                               expect=("plan='single'", "l20"), via="cli"),
    "prefix_block_too_long": C("workload=multi_turn", "cluster.prefix_block_tokens=1000000000000",
                               expect=("cluster.prefix_block_tokens=1000000000000",)),
    "nodes_positive": C("cluster=diffusion", "cluster.nodes=0", expect=("cluster.nodes=0",)),
    "diffusion_policy_unknown": C("cluster=diffusion", "cluster.policy=lifo",
                                  expect=("cluster.policy='lifo'",)),
    "gpus_per_job_over_node": C("cluster=diffusion", "cluster.gpus_per_job=16",
                                expect=("cluster.gpus_per_job=16", "=8")),
    "diffusion_job_limits": C(*DIFFUSION, "model=flux1_dev", "workload.steps=1000000",
                              expect=("workload.steps=1000000",)),
    "diffusion_plan_product": C("cluster=diffusion", "cluster.parallel.ulysses=4",
                                expect=("cluster.parallel='ulysses=4'", "=8",
                                        "multiply to 4")),
    "elastic_with_fixed_plan": C("cluster=diffusion", "cluster.elastic=true",
                                 "cluster.parallel.ulysses=8", expect=("cluster.elastic=True",)),
    "batching_wait_negative": C("cluster=diffusion", "cluster.batching.max_wait_s=-1",
                                expect=("cluster.batching.max_wait_s=-1",)),
    # ---- backend and cost model
    "backend_unknown": C("backend.name=tgi", expect=("backend.name", "tgi"), via="cli"),
    "constant_step_time_zero": C("cost_model=constant", "cost_model.step_time_ms=0",
                                 expect=("cost_model.step_time_ms=0",), via="cli"),
    "calibration_unknown": C("cost_model.calibration=nope",
                             expect=("cost_model.calibration", "nope"), via="cli"),
    "host_overhead_negative": C("cost_model.host_overhead_ms=-1",
                                expect=("cost_model.host_overhead_ms=-1",)),
    # ---- workload config
    "rate_zero": C("workload.rate=0", expect=("workload.rate=0",), via="cli"),
    "rate_negative": C("workload.rate=-3", expect=("workload.rate=-3",), via="cli"),
    "rate_span": C("workload.rate=1e-12", expect=("workload.rate=1e-12",)),
    "num_requests_limit": C("workload.num_requests=1000000000000",
                            expect=("workload.num_requests=1000000000000",)),
    "system_prompts_limit": C("workload=system_prompt", "workload.system_prompt.count=10000000",
                              expect=("workload.system_prompt.count=10000000",)),
    "turns_limit": C("workload=multi_turn", "workload.multi_turn.turns.value=1000000",
                     expect=("workload.multi_turn.turns.value=1000000",)),
    "arrival_unknown": C("workload.arrival=burst", expect=("workload.arrival='burst'",)),
    "think_time_limit": C("workload=closed_loop", "workload.think_time_s=1e12",
                          expect=("workload.think_time_s",)),
    "random_range_ratio": C("workload=random", "workload.random.range_ratio=1.0",
                            expect=("workload.random.range_ratio=1.0",)),
    "random_range_too_wide": C("workload=random", "workload.random.input_len=1",
                               "workload.random.range_ratio=0.5",
                               expect=("workload.random.range_ratio=0.5",)),
    "random_special_tokens": C("workload=random", "workload.random.special_tokens=1024",
                               expect=("workload.random.special_tokens=1024",)),
    "random_with_prefixes": C("workload=random", "workload.system_prompt.count=2",
                              expect=("workload.system_prompt.count=2",)),
    "random_with_trace": C("workload=random", "workload.arrival=trace",
                           "workload.trace_path=ok.csv", expect=("workload.random",)),
    "length_bounds_order": C("workload.input.dist=uniform", "workload.input.low=100",
                             "workload.input.high=10", expect=("workload.input.high=10",)),
    "length_limit": C("workload.input.dist=fixed", "workload.input.value=3000000000",
                      expect=("workload.input.value=3000000000",)),
    "lognormal_mu": C("workload.input.mu=5000", expect=("workload.input.mu=5000",)),
    "empirical_without_path": C("workload.input.dist=empirical",
                                expect=("workload.input.path=None",)),
    "empirical_file": C("workload.input.dist=empirical", "workload.input.path=lengths_zero.csv",
                        expect=("workload.input.path", "lengths_zero.csv", "row 1")),
    "classes_share": C("workload=two_classes", "workload.classes.0.share=2",
                       expect=("workload.classes[0].share=2",)),
    "trace_path_missing": C(*TRACE, "workload.trace_path=null",
                            expect=("workload.trace_path=None",)),
    "window_order": C(*TRACE, "workload.trace_path=ok.csv", "workload.window_end_s=-1",
                      expect=("workload.window_end_s=-1",)),
    # ---- trace file
    "trace_missing": C(*TRACE, "workload.trace_path=missing.csv",
                       expect=("workload.trace_path", "missing.csv"), via="cli"),
    "trace_not_csv": C(*TRACE, "workload.trace_path=empty.csv",
                       expect=("workload.trace_path", "empty.csv")),
    "trace_no_output_col": C(*TRACE, "workload.trace_path=no_output_col.csv",
                             expect=("workload.trace_path", "no_output_col.csv", "output_tokens"),
                             via="cli"),
    "trace_unknown_layout": C(*TRACE, "workload.trace_path=unknown_cols.csv",
                              expect=("workload.trace_path", "unknown trace columns", "BurstGPT"),
                              via="cli"),
    "trace_bad_timestamp": C(*TRACE, "workload.trace_path=azure_bad_time.csv",
                             expect=("workload.trace_path", "TIMESTAMP", "yesterday",
                                     "date-time")),
    "trace_jsonl_not_json": C(*TRACE, "workload.trace_path=not_json.jsonl",
                              expect=("workload.trace_path", "line 2 is not JSON")),
    "trace_jsonl_missing_key": C(*TRACE, "workload.trace_path=no_key.jsonl",
                                 expect=("workload.trace_path", "line 1 lacks",
                                         "output_length")),
    "trace_jsonl_not_a_number": C(*TRACE, "workload.trace_path=bool_len.jsonl",
                                  expect=("bool_len.jsonl", "line 1: 'input_length' is true")),
    "trace_jsonl_too_deep": C(*TRACE, "workload.trace_path=deep.jsonl",
                              expect=("deep.jsonl", "line 2 ")),
    "trace_jsonl_huge_int": C(*TRACE, "workload.trace_path=huge_int.jsonl",
                              expect=("huge_int.jsonl", "line 1 ")),
    "trace_bad_compression": C(*TRACE, "workload.trace_path=bad.csv.gz",
                               expect=("workload.trace_path", "bad.csv.gz")),
    "trace_no_rows": C(*TRACE, "workload.trace_path=header_only.csv",
                       expect=("workload.trace_path", "header_only.csv")),
    "trace_not_a_number": C(*TRACE, "workload.trace_path=text_len.csv",
                            expect=("text_len.csv", "input_tokens", "'ten'")),
    "trace_nan_arrival": C(*TRACE, "workload.trace_path=nan_arrival.csv",
                           expect=("nan_arrival.csv", "arrival_time_s", "'nan'")),
    "trace_empty_cell": C(*TRACE, "workload.trace_path=empty_cell.csv",
                          expect=("empty_cell.csv", "input_tokens", "row 1")),
    "trace_negative_arrival": C(*TRACE, "workload.trace_path=negative_arrival.csv",
                                expect=("negative_arrival.csv", "'-1.0'")),
    "trace_late_arrival": C(*TRACE, "workload.trace_path=late_arrival.csv",
                            expect=("late_arrival.csv", "'2e9'")),
    "trace_unsorted": C(*TRACE, "workload.trace_path=unsorted.csv",
                        expect=("workload.trace_path", "unsorted.csv", "arrival_time_s", "0.2",
                                "0.5"), via="cli"),
    "trace_negative_len": C(*TRACE, "workload.trace_path=negative_len.csv",
                            expect=("workload.trace_path", "negative_len.csv", "input_tokens",
                                    "-5"), via="cli"),
    "trace_fractional_len": C(*TRACE, "workload.trace_path=fractional_len.csv",
                              expect=("workload.trace_path", "fractional_len.csv",
                                      "input_tokens", "12.5"), via="cli"),
    "trace_huge_len": C(*TRACE, "workload.trace_path=huge_len.csv",
                        expect=("huge_len.csv", "input_tokens", "'1e30'")),
    "trace_hash_ids": C(*TRACE, "workload.trace_path=bad_hash.csv",
                        expect=("bad_hash.csv", "hash_ids", "'1 2 x'")),
    "trace_window_empty": C(*TRACE, "workload.trace_path=ok.csv", "workload.window_start_s=500",
                            expect=("workload.trace_path", "ok.csv", "[500.0, None)")),
    "trace_zero_length": C(*TRACE, "workload.trace_path=zero_len.csv",
                           expect=("zero_len.csv", "input_tokens is 0")),
    "trace_time_scale_span": C(*TRACE, "workload.trace_path=ok.csv", "workload.time_scale=1e8",
                               expect=("workload.time_scale=100000000.0",)),
    # ---- SLO
    "slo_bound_positive": C("slo.ttft_ms=0", expect=("slo.ttft_ms=0",)),
    # ---- metrics
    "metric_percentiles_range": C("metrics.percentiles=[50,101]",
                                  expect=("metrics.percentiles=101.0",)),
}


def doc_rows() -> dict[str, str]:
    """``id`` → "message contains" text of each row of the docs table."""
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        m = re.fullmatch(r"`([a-z0-9_]+)`", cells[0]) if len(cells) >= 4 else None
        if m:
            rows[m.group(1)] = cells[3].strip("`")
    return rows


ROWS = doc_rows()


def test_every_docs_row_has_a_case_and_every_case_a_row():
    assert len(ROWS) >= 30
    assert sorted(set(ROWS) - set(CASES)) == [], "docs rows without a test case"
    assert sorted(set(CASES) - set(ROWS)) == [], "test cases without a docs row"


def _write_files(root: Path) -> None:
    for name, content in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            (root / name).write_bytes(content)
        else:
            (root / name).write_text(content)


def _check_line(name: str, line: str) -> None:
    assert "\n" not in line.strip(), line
    assert "Traceback" not in line, line
    for text in (ROWS[name], *CASES[name].expect):
        assert text in line, (name, text, line)
    assert "np.float64" not in line, line  # plain numbers, not numpy reprs


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory, sim_cli):
    """Every ``cli`` case, run once, in parallel."""
    cwd = tmp_path_factory.mktemp("validation_cli")
    _write_files(cwd)
    jobs = {name: [*SMALL, *c.overrides] for name, c in CASES.items() if c.via == "cli"}
    return sim_cli.run_many(jobs, cwd)


@pytest.fixture(scope="module")
def case_dir(tmp_path_factory) -> Path:
    """The folder the in-process cases run in, with every file they name."""
    cwd = tmp_path_factory.mktemp("validation")
    _write_files(cwd)
    return cwd


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.via == "cli"])
def test_cli_case(cli_runs, name):
    run = cli_runs[name]
    assert run.returncode == 2, run.describe()
    assert "Traceback" not in run.stdout + run.stderr, run.describe()
    lines = run.stderr.splitlines()
    assert len(lines) == 1, run.describe()
    assert lines[0].startswith("error: "), lines[0]
    _check_line(name, lines[0])
    assert not (run.outdir / "summary.json").exists()
    assert not (run.outdir / "requests.parquet").exists()


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.via == "compose"])
def test_compose_case(case_dir, monkeypatch, capsys, name):
    monkeypatch.chdir(case_dir)
    with pytest.raises(SystemExit) as exit_info:
        compose_or_exit([*SMALL, *CASES[name].overrides])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), lines[0]
    _check_line(name, lines[0])


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.via == "validate"])
def test_validate_case(case_dir, monkeypatch, name):
    monkeypatch.chdir(case_dir)
    with initialize_config_module("conf", version_base=None):
        cfg = compose("config", overrides=[*SMALL, *CASES[name].overrides])
    with pytest.raises((ConfigError, WorkloadError)) as error:
        validate_config(cfg)
    _check_line(name, str(error.value))


def test_the_default_config_and_every_shipped_workload_pass(case_dir, monkeypatch):
    """The checks refuse bad input only: the shipped options validate."""
    monkeypatch.chdir(case_dir)
    with initialize_config_module("conf", version_base=None):
        for extra in ([], ["workload=closed_loop"], ["workload=multi_turn"],
                      ["workload=system_prompt"], ["workload=two_classes"],
                      [*TRACE, "workload.trace_path=ok.csv"], ["experiment=vidur_synthetic"],
                      [*DISAGG], ["model=qwen3_30b_a3b", "cluster.tensor_parallel_size=2",
                                  "cluster.expert_parallel_size=2"],
                      [*DIFFUSION, "model=flux1_dev"], ["workload=mixed", "cluster=mixed"],
                      [*DIFFUSION, "model=hunyuan_video"], [*DIFFUSION, "model=wan21_t2v_14b"],
                      ["workload=diffusion_mix", "cluster=diffusion", "model=flux1_dev"],
                      [*DIFFUSION, "model=flux1_dev", "cluster.elastic=true",
                       "cluster.policy=priority", "cluster.batching.max_images=4"]):
            validate_config(compose("config", overrides=[*SMALL, *extra]))


@pytest.mark.parametrize("backend, size, refused", [
    ("vllm", 256, False), ("vllm", 1, False), ("vllm", 48, True), ("trtllm", 64, False),
    ("trtllm", 48, True), ("sglang", 17, False), ("sglang", 1, False)])
def test_block_size_is_one_the_backend_takes(backend, size, refused):
    """``kv_cache.block_size`` by engine: vLLM's list, TensorRT-LLM's powers of 2, any page
    size for SGLang (``sim.config.kv_cache.check_block_size``)."""
    from sim.config.kv_cache import KVCacheConfig, check_block_size

    if not refused:
        check_block_size(KVCacheConfig(block_size=size), backend)
        return
    with pytest.raises(ConfigError, match=f"kv_cache.block_size={size}: .*backend={backend}"):
        check_block_size(KVCacheConfig(block_size=size), backend)
