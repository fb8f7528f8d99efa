"""Check the engines' KV-cache rules (sim/kv/rules.py) against published vLLM start-up logs.

    python scripts/kv_startup_logs.py        # prints the Markdown table of docs/fidelity.md

Each row is one published log: the deployment as its command line set it and the values the
engine logged. Nothing here is fitted: the simulator's numbers come from the rule read from
vLLM's source. The logs are vLLM 0.19.0 on a dedicated H100 SXM 80GB (llm-d-planner's
accuracy sweep, github.com/llm-d-incubation/llm-d-planner at d3121e0,
accuracy/results/v0.19.0/logs/), with vLLM's defaults otherwise (max_num_seqs 1024,
max_num_batched_tokens 8192).
"""

from __future__ import annotations

from hydra import compose, initialize_config_module

import conf.schema  # noqa: F401  (registers the config schemas)
from sim.builders import plain, replica_memory_budget
from sim.kv.budget import GIB
from sim.kv.rules import vllm_kv_capacity

LOGS = "https://github.com/llm-d-incubation/llm-d-planner/blob/d3121e0/accuracy/results/v0.19.0/logs/"
# (log file, overrides, logged "Available KV cache memory" GiB, logged "GPU KV cache size",
# and for the sliding-window models logged "Maximum concurrency for 8,192 tokens per request")
ROWS = [
    ("meta-llama-llama-3-1-8b---h100-80gb--tp1pp1dp1--8192.log",
     ["model=llama3_8b", "scheduler.max_model_len=8192"], 58.11, 476_016),
    ("meta-llama-llama-3-1-8b---h100-80gb--tp1pp1dp1--2048.log",
     ["model=llama3_8b", "scheduler.max_model_len=2048"], 58.11, 476_016),
    ("meta-llama-llama-3-1-8b--h100-80gb--tp1pp1dp1--32768.log",
     ["model=llama3_8b", "scheduler.max_model_len=32768"], 58.11, 476_016),
    ("meta-llama---h100-80gb--tp1pp1dp1--8192-dtbf16-kvfp8.log",
     ["model=llama3_8b", "scheduler.max_model_len=8192", "kv_cache.dtype=fp8"], 58.11,
     952_032),
    ("meta-llama-llama-3---h100-80gb--tp1pp1dp1--8192-qfp8.log",
     ["model=llama3_8b", "scheduler.max_model_len=8192", "model.dtype=fp8"], 64.61, 529_248),
    ("meta-llama-llama-3-1-8b---h100-80gb--tp2pp1dp1--8192.log",
     ["model=llama3_8b", "scheduler.max_model_len=8192", "cluster.tensor_parallel_size=2"],
     63.76, 1_044_688),
    ("meta-llama-llama-3-1-8b---h100-80gb--tp4pp1dp1--8192.log",
     ["model=llama3_8b", "scheduler.max_model_len=8192", "cluster.tensor_parallel_size=4"],
     67.44, 2_209_792),
    ("meta-llama-llama-3-1-8b---h100-80gb--tp1pp2dp1--8192.log",
     ["model=llama3_8b", "scheduler.max_model_len=8192", "cluster.pipeline_parallel_size=2"],
     66.54, 1_075_312),
    ("meta-llama-llama-3-1-8b---h100-80gb--tp1pp4dp1--8192.log",
     ["model=llama3_8b", "scheduler.max_model_len=8192", "cluster.pipeline_parallel_size=4"],
     69.80, 2_257_264),
    ("qwen-qwen3-8b--h100-80gb--tp1pp1dp1--8192.log",
     ["model=qwen3_8b", "scheduler.max_model_len=8192"], 57.50, 418_688),
    ("qwen-qwen3-30b-a3b--h100-80gb--tp1pp1dp1--8192.log",
     ["model=qwen3_30b_a3b", "scheduler.max_model_len=8192"], 15.41, 168_288),
    ("mistralai-mixtral-8x7b-i--h100-80gb--tp2pp1dp1--8192.log",
     ["model=mixtral_8x7b", "scheduler.max_model_len=8192", "cluster.tensor_parallel_size=2"],
     28.44, 465_936),
    ("openai-gpt-oss-20b--h100-80gb--tp2pp1dp1--8192.log",
     ["model=gpt_oss_20b", "scheduler.max_model_len=8192", "cluster.tensor_parallel_size=2",
      "kv_cache.gpu_memory_utilization=0.9"], 59.32, 2_591_776, 316.07),
    ("google-gemma-2-2b-it--h100-80gb--tp1pp1dp1--8192.log",
     ["model=gemma2_2b", "scheduler.max_model_len=8192"], 66.47, 670_160, 81.73),
    ("google-gemma-2-9b-it--h100-80gb--tp1pp1dp1--8192.log",
     ["model=gemma2_9b", "scheduler.max_model_len=8192"], 54.12, 168_880, 20.60),
    ("google-gemma-2-27b-it--h100-80gb--tp1pp1dp1--8192.log",
     ["model=gemma2_27b", "scheduler.max_model_len=8192"], 20.59, 58_672, 7.16),
    ("fp8dyn-llama-3-3-70b--h100-80gb--tp2pp1dp1--8192.log",
     ["model=llama3_70b", "model.dtype=fp8", "scheduler.max_model_len=8192",
      "cluster.tensor_parallel_size=2"], 37.28, 244_304),
    ("fp8dyn-llama-3-3-70b--h100-80gb--tp4pp1dp1--8192.log",
     ["model=llama3_70b", "model.dtype=fp8", "scheduler.max_model_len=8192",
      "cluster.tensor_parallel_size=4"], 54.09, 708_992),
]
BASE = ["hardware=h100_sxm", "backend=vllm", "kv_cache.gpu_memory_utilization=0.95"]


def main() -> None:
    print("| log | deployment | logged KV GiB | ours | error | logged tokens | ours | error | "
          "logged concurrency | ours | error |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    with initialize_config_module("conf", version_base=None):
        for name, over, gib, tokens, *concurrency in ROWS:
            cfg = plain(compose("config", overrides=BASE + over))
            b = replica_memory_budget(cfg)
            ours_gib = b.kv_cache_bytes / GIB
            # the numbers of the engine's own lines: vLLM logs tokens of the whole model, one
            # GPU's blocks (its heads of TP, its layers of PP) divided among its KV cache groups
            ours_tokens, ours_x = vllm_kv_capacity(b, 8192, cfg.scheduler.max_num_batched_tokens)
            logged_x = (f"{concurrency[0]:.2f} | {ours_x:.2f} | "
                        f"{100 * (ours_x / concurrency[0] - 1):+.1f}%") if concurrency else \
                "— | — | —"
            deployment = " ".join(o for o in over if not o.startswith("scheduler.max_model"))
            print(f"| [{name.removesuffix('.log')}]({LOGS}{name}) | {deployment} | {gib:.2f} | "
                  f"{ours_gib:.2f} | {100 * (ours_gib / gib - 1):+.1f}% | {tokens:,} | "
                  f"{ours_tokens:,} | {100 * (ours_tokens / tokens - 1):+.1f}% | {logged_x} |")


if __name__ == "__main__":
    main()
