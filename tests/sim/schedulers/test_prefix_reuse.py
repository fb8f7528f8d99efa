"""Prefix-cache reuse under every policy that has a prefix cache (vllm, edf, sarathi, trtllm,
sglang), and the warning of the settings a policy ignores."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from scenarios import requests_for_seed
from sim import simulate
from sim.builders import ignored_settings, plain
from sim.config import SchedulerConfig
from sim.kv.manager import PagedKVCache
from sim.records import LogHistogram
from sim.schedulers import SCHEDULERS
from sim.state import RequestTable

UNBOUNDED = ("kv_cache=prefix", "kv_cache.num_gpu_blocks=200000", "cost_model=constant")
MAX_UTIL = ("scheduler=trtllm", "scheduler.capacity_scheduler_policy=MAX_UTILIZATION")
POLICIES = {"vllm": ("scheduler=vllm",), "edf": ("scheduler=edf",),
            "sarathi": ("scheduler=sarathi",), "trtllm": ("scheduler=trtllm",),
            "trtllm_max_util": MAX_UTIL, "sglang": ("scheduler=sglang",)}


def _run(compose_cfg, policy: str, *overrides: str, seed: int = 0):
    cfg = compose_cfg(*UNBOUNDED, *POLICIES[policy], *overrides)
    req = requests_for_seed(cfg.workload, seed)
    return req, simulate(cfg, req).requests


@pytest.mark.parametrize("policy", POLICIES)
def test_system_prompt_hit_rate_by_hand(compose_cfg, policy):
    """8 system prompts of 2048 tokens, requests 0.5 s apart on average: the first request
    of each prompt misses, every later one hits all 2048 tokens."""
    req, rec = _run(compose_cfg, policy, "workload=system_prompt", "workload.num_requests=60",
                    "workload.rate=2", "workload.system_prompt.count=8")
    first = ~req["hash_ids"].map(lambda h: h[0]).duplicated().to_numpy()
    assert 1 < first.sum() <= 8
    np.testing.assert_array_equal(rec["cached_tokens"], np.where(first, 0, 2048))
    hit = rec["cached_tokens"].sum() / rec["input_tokens"].sum()
    assert hit == pytest.approx((60 - first.sum()) * 2048 / (60 * (2048 + 128)))


@pytest.mark.parametrize("policy", ["sarathi", "trtllm", "trtllm_max_util", "sglang"])
def test_multi_turn_turns_hit_the_previous_prompt_and_answer(compose_cfg, policy):
    """As under vllm (tests/scenarios/test_prefix_hit_rates.py): a follow-up turn hits the
    previous turn's computed full blocks, ⌊(P + O − 1) / 16⌋ · 16 tokens."""
    req, rec = _run(compose_cfg, policy, "workload=multi_turn", "workload.num_requests=80",
                    "workload.rate=1", seed=3)
    p, o = req["input_tokens"].to_numpy(), req["output_tokens"].to_numpy()
    session = req["client"].to_numpy()
    follow = np.r_[False, session[1:] == session[:-1]]
    expected = np.where(follow, np.r_[0, (p + o - 1)[:-1]] // 16 * 16, 0)
    assert follow.sum() > 20
    np.testing.assert_array_equal(rec["cached_tokens"], expected)


@pytest.mark.parametrize("policy", ["sarathi", "trtllm"])
def test_hit_rate_rises_with_cache_size(compose_cfg, policy):
    """16 system prompts of 128 blocks each: a cache that holds more of them hits more."""
    rates = []
    for blocks in (500, 1200, 3000):
        _, rec = _run(compose_cfg, policy, "workload=system_prompt", "workload.num_requests=120",
                      "workload.rate=4", "workload.system_prompt.count=16",
                      f"kv_cache.num_gpu_blocks={blocks}")
        assert (rec["status"] == "completed").all()
        rates.append(rec["cached_tokens"].sum() / rec["input_tokens"].sum())
    assert rates[0] < rates[1] < rates[2], rates


# ---- admission without SimPy ------------------------------------------------------------
def _prefix_sched(name: str, num_blocks: int, **cfg):
    """Two 64-token prompts (2 outputs each) sharing their first 48 tokens, 16-token blocks."""
    t = RequestTable(np.zeros(2), np.array([64, 64]), np.array([2, 2]))
    kv = PagedKVCache(num_blocks + 1, 16, 2, prefix_caching=True)
    kv.set_prefix_source(np.array([(1, 2, 3, 4), (1, 2, 3, 5)], dtype=object), trace_block=16)
    return SCHEDULERS[name](SchedulerConfig(name=name, **cfg), t, kv, LogHistogram()), t, kv


@pytest.mark.parametrize("name,cfg", [
    ("sarathi", {}), ("trtllm", {}),
    ("trtllm", {"capacity_scheduler_policy": "MAX_UTILIZATION"})])
def test_admission_starts_a_request_at_its_cached_prefix(name, cfg):
    s, t, kv = _prefix_sched(name, 100, **cfg)
    s.add_request(0)
    s.update(s.schedule(0.0), 1.0)
    s.add_request(1)
    b = s.schedule(1.0)
    assert list(b.ids) == [0, 1] and list(b.new_tokens) == [1, 16]
    assert list(b.context_tokens) == [64, 48]         # the prefill skips the cached tokens
    assert t.cached_tokens[1] == 48 and t.cached_tokens[0] == 0
    # request 1 references the 3 shared blocks and took one of its own
    assert kv.held[1] == 4 and kv.used_blocks == int(kv.held[0]) + 1


def test_guaranteed_no_evict_reserves_only_the_unshared_blocks():
    """Each request reaches 65 tokens (5 blocks); 8 blocks hold both only because request 1
    shares request 0's first 3 blocks."""
    s, t, kv = _prefix_sched("trtllm", 8)
    s.add_request(0)
    s.update(s.schedule(0.0), 1.0)
    s.add_request(1)
    assert list(s.schedule(1.0).ids) == [0, 1]
    unshared, _, _ = _prefix_sched("trtllm", 8)
    unshared.kv.set_prefix_source(np.array([(1, 2, 3, 4), (6, 7, 8, 9)], dtype=object), 16)
    unshared.add_request(0)
    unshared.update(unshared.schedule(0.0), 1.0)
    unshared.add_request(1)
    assert list(unshared.schedule(1.0).ids) == [0]


# ---- settings a policy ignores ----------------------------------------------------------
@pytest.mark.parametrize("name", ["static", "dynamic", "orca"])
def test_policies_without_a_prefix_cache_warn_and_hit_nothing(compose_cfg, caplog, name):
    cfg = compose_cfg(*UNBOUNDED, f"scheduler={name}", "workload=system_prompt",
                      "workload.num_requests=12", "workload.system_prompt.count=1")
    assert ignored_settings(plain(cfg)) == [
        f"kv_cache.prefix_caching=true is ignored: scheduler={name} does not use a prefix "
        "cache (every prompt is computed in full)"]
    with caplog.at_level(logging.WARNING, logger="sim"):
        rec = simulate(cfg, requests_for_seed(cfg.workload, 0)).requests
    assert caplog.text.count("kv_cache.prefix_caching=true is ignored") == 1
    assert (rec["status"] == "completed").all() and rec["cached_tokens"].sum() == 0


def test_sglang_ignores_swap_with_a_warning(compose_cfg, caplog):
    # a swap space far too small for any request: an error wherever swap is used
    tiny = ("kv_cache.preemption=swap", "kv_cache.swap_space_gib=0.0001")
    cfg = compose_cfg("scheduler=sglang", "cost_model=constant", "workload.num_requests=5",
                      *tiny)
    with caplog.at_level(logging.WARNING, logger="sim"):
        rec = simulate(cfg, requests_for_seed(cfg.workload, 0)).requests
    assert (rec["status"] == "completed").all()
    assert "kv_cache.preemption=swap is ignored: scheduler=sglang" in caplog.text
    assert len(caplog.records) == 1
    for name in ("vllm", "sarathi", "trtllm"):
        assert ignored_settings(plain(compose_cfg(f"scheduler={name}", "kv_cache=prefix",
                                                  *tiny))) == []
