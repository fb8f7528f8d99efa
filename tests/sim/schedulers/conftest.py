"""Helpers of the scheduler tests: a scheduler over a hand-made queue, tiny simulated servers."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from sim.config import (
    BackendConfig,
    ClusterConfig,
    ConstantCostConfig,
    HardwareConfig,
    KVCacheConfig,
    ModelConfig,
    RooflineCostConfig,
    SchedulerConfig,
)
from sim.config.backend import FrontendConfig
from sim.kv.budget import activation_peak_bytes, kv_bytes_per_token
from sim.kv.manager import PagedKVCache
from sim.model.weights import parameter_count
from sim.records import LogHistogram
from sim.schedulers import SCHEDULERS
from sim.state import RequestTable

TINY = ModelConfig(name="tiny", num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, intermediate_size=128, vocab_size=1000,
                   max_position_embeddings=4096)


def _make(name, prompts, outputs, num_blocks=10_000, block_size=16, arrivals=None,
          priority=None, ttft_slo_s=None, add=True, **sched):
    """A scheduler ``name`` over requests of these lengths (all queued unless ``add`` is
    False); returns (scheduler, table, kv)."""
    n = len(prompts)
    arrivals = np.zeros(n) if arrivals is None else np.asarray(arrivals, float)
    t = RequestTable(arrivals, np.array(prompts), np.array(outputs), priority=priority,
                     ttft_slo_s=ttft_slo_s)
    kv = PagedKVCache(num_blocks + 1, block_size, n)  # + vLLM's null block
    s = SCHEDULERS[name](SchedulerConfig(name=name, **sched), t, kv,
                         LogHistogram(keep_samples=True))
    if add:
        for rid in range(n):
            s.add_request(rid)
    return s, t, kv


def _step(s, now, dt=1.0):
    """One step: schedule at ``now``, finish at ``now + dt``; returns (batch, done)."""
    batch = s.schedule(now)
    done = s.update(batch, now + dt) if batch is not None else np.empty(0, np.int64)
    return batch, done


@pytest.fixture
def make():
    """Build a scheduler by name over a hand-made request table (see ``_make``)."""
    return _make


@pytest.fixture
def step():
    """Run one schedule/update step of a scheduler (see ``_step``)."""
    return _step


# the engine's own semantics: no API server in front (tests of sim.engine.frontend set their own)
WIRE = FrontendConfig(per_request_ms=0.0, per_prompt_token_us=0.0, per_output_token_us=0.0,
                      latency_ms=0.0)


def _tiny_config(name="vllm", num_blocks=64, block_size=4, max_seqs=8, budget=256,
                 max_len=400, roofline=False, fast_forward=True, **sched) -> SimpleNamespace:
    """A tiny model on a GPU sized so that exactly ``num_blocks`` KV blocks hold tokens
    (policies that prefill whole prompts get a budget of at least ``max_len``)."""
    if SCHEDULERS[name].whole_prompt:
        budget = max(budget, max_len)
    sched = SchedulerConfig(name=name, max_num_seqs=max_seqs, max_num_batched_tokens=budget,
                            max_model_len=max_len, **sched)
    kv = KVCacheConfig(block_size=block_size, gpu_memory_utilization=1.0, other_memory_gib=0.0)
    need = (parameter_count(TINY) * 2 + activation_peak_bytes(TINY, sched, 1)
            + (num_blocks + 1) * block_size * kv_bytes_per_token(TINY, kv, 1))
    hw = HardwareConfig(name="toy", bf16_flops=1e12, fp8_flops=2e12, hbm_bandwidth=1e11,
                        hbm_bytes=need, nvlink_bandwidth=1e10, pcie_bandwidth=1e10)
    cost = RooflineCostConfig() if roofline else ConstantCostConfig(step_time_ms=7.0)
    return SimpleNamespace(model=TINY, hardware=hw, scheduler=sched, kv_cache=kv,
                           cluster=ClusterConfig(), backend=BackendConfig(frontend=WIRE),
                           cost_model=cost,
                           fast_forward=fast_forward)


@pytest.fixture
def tiny_config():
    """A SimpleNamespace config of a tiny model with an exact number of KV blocks."""
    return _tiny_config


def _requests(arrivals, inputs, outputs, **extra) -> pd.DataFrame:
    n = len(arrivals)
    return pd.DataFrame({"arrival_time_s": np.asarray(arrivals, float),
                         "input_tokens": np.asarray(inputs, np.int64),
                         "output_tokens": np.asarray(outputs, np.int64),
                         "client": np.full(n, -1, np.int64), "think_time_s": np.zeros(n),
                         **extra})


@pytest.fixture
def requests():
    """An open-loop request table from arrays (extra columns by keyword)."""
    return _requests
