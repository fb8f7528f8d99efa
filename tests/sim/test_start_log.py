"""The start-of-run log line reports the KV capacity the replicas use."""

from __future__ import annotations

import logging
import re

from cli.app import log_memory_budgets
from sim.builders import pool_memory_budgets


def _blocks(caplog) -> list[int]:
    return [int(m) for m in re.findall(r"num_gpu_blocks=(\d+)", caplog.text)]


def test_log_prints_the_memory_derived_capacity(compose_cfg, caplog):
    cfg = compose_cfg()
    with caplog.at_level(logging.INFO, logger="sim"):
        log_memory_budgets(cfg)
    derived = pool_memory_budgets(cfg)["mixed"].num_gpu_blocks
    assert _blocks(caplog) == [derived] and "override" not in caplog.text


def test_log_prints_a_num_gpu_blocks_override(compose_cfg, caplog):
    cfg = compose_cfg("kv_cache.num_gpu_blocks=1234")
    with caplog.at_level(logging.INFO, logger="sim"):
        log_memory_budgets(cfg)
    derived = pool_memory_budgets(cfg)["mixed"].num_gpu_blocks
    assert _blocks(caplog) == [1234]
    assert f"override; memory gives {derived}" in caplog.text
    assert "max concurrent tokens 19744" in caplog.text  # 1234 × 16


def test_a_cache_smaller_than_one_max_length_request_is_warned_about(compose_cfg, caplog):
    with caplog.at_level(logging.INFO, logger="sim"):
        log_memory_budgets(compose_cfg("kv_cache.num_gpu_blocks=1000"))  # 16,000 tokens
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "holds 16000 tokens" in warned[0].getMessage()
    assert "max_model_len=131072" in warned[0].getMessage()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="sim"):  # a shorter limit fits: no warning
        log_memory_budgets(compose_cfg("kv_cache.num_gpu_blocks=1000",
                                       "scheduler.max_model_len=16000"))
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]

def test_disaggregated_pools_log_the_override_each(compose_cfg, caplog):
    cfg = compose_cfg("cluster=disagg", "kv_cache.num_gpu_blocks=777")
    with caplog.at_level(logging.INFO, logger="sim"):
        log_memory_budgets(cfg)
    assert _blocks(caplog) == [777, 777]


def test_run_meta_counts_concurrent_tokens_of_the_blocks_the_cache_has(compose_cfg, open_loop):
    from sim import simulate

    req = open_loop([0.0], [100], [4])
    for extra, blocks in (((), None), (("kv_cache.num_gpu_blocks=1234",), 1234)):
        cfg = compose_cfg("cost_model=constant", *extra)
        meta = simulate(cfg, req).meta
        derived = pool_memory_budgets(cfg)["mixed"].num_gpu_blocks
        assert meta["num_gpu_blocks"] == (blocks or derived)
        assert meta["max_concurrent_tokens"] == (blocks or derived) * 16


def test_the_line_names_the_replica_count_and_expert_parallelism(compose_cfg, caplog):
    with caplog.at_level(logging.INFO, logger="sim"):
        log_memory_budgets(compose_cfg("model=qwen3_30b_a3b", "cluster.tensor_parallel_size=2",
                                       "cluster.expert_parallel_size=2", "cluster.replicas=3"))
    assert "on 3 replica(s) of 2×1 h100_sxm (tp × pp, ep 2, mixed pool)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="sim"):
        log_memory_budgets(compose_cfg("cluster=disagg"))
    assert re.search(r"on \d+ replica\(s\) of .* ep 1, prefill pool", caplog.text)
