"""vLLM's prefix cache and the ``prefix_affinity`` router on the compiled loop
(``sim.compiled.prefix_cache``, ``routing``, ``lru_map``) give the SimPy engine's records."""

from __future__ import annotations

import random
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from sim import simulate
from sim.compiled import lru_map as M
from sim.compiled.core import PREFIX_SCHEDULERS
from sim.compiled.prefix_cache import hash_at, num_hashes, prefix_state
from sim.kv.manager import PagedKVCache
from sim.kv.prefix import block_hashes
from sim.schedulers import SCHEDULERS
from tests.sim.schedulers.test_compiled_core import assert_same_records, both_engines

SPAN = 8  # tokens one trace id names here (cluster.prefix_block_tokens)


def shared_prefix_workload(requests, seed: int, n: int = 90):
    """Requests on six shared documents (a leading part of one, a few ids of their own),
    a tenth of them without ids, arriving in a burst and then spread out."""
    rng = np.random.default_rng(seed)
    docs = [tuple(range(100 * d, 100 * d + int(rng.integers(2, 12)))) for d in range(6)]
    ids = np.empty(n, object)
    inputs = np.zeros(n, np.int64)
    for i in range(n):
        doc = docs[rng.integers(len(docs))]
        own = tuple(10_000 + 50 * i + k for k in range(int(rng.integers(0, 3))))
        ids[i] = doc[:rng.integers(1, len(doc) + 1)] + own if rng.random() < 0.9 else None
        named = len(ids[i]) if ids[i] is not None else int(rng.integers(1, 10))
        inputs[i] = max(1, named * SPAN - int(rng.integers(0, SPAN)))
    arrivals = np.sort(np.concatenate([rng.uniform(0, 0.05, n // 3),
                                       rng.uniform(0.1, 1.5, n - n // 3)]))
    return requests(arrivals, inputs, rng.integers(1, 30, n), hash_ids=ids)


def prefix_config(tiny_config, blocks: int, replicas: int, router: str, budget: int = 128,
                  name: str = "vllm", **sched):
    cfg = tiny_config(name, roofline=True, max_seqs=6, budget=budget, num_blocks=blocks,
                      block_size=4, **sched)
    cfg.kv_cache = replace(cfg.kv_cache, prefix_caching=True)
    cfg.cluster = replace(cfg.cluster, replicas=replicas, router=router,
                          prefix_block_tokens=SPAN)
    return cfg


@pytest.mark.parametrize("replicas, router", [(1, "round_robin"), (3, "prefix_affinity"),
                                              (3, "least_outstanding"), (3, "jsq_tokens"),
                                              (3, "kv_aware")],
                         ids=["one", "prefix_affinity", "least_outstanding", "jsq_tokens",
                              "kv_aware"])
@pytest.mark.parametrize("blocks", [30, 60, 400], ids=["evicting", "preempting", "roomy"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_prefix_caching_is_the_same_in_both_engines(tiny_config, requests, replicas, router,
                                                    blocks, seed):
    """Hits, evictions of the least recently freed blocks, blocks computed twice at once,
    recompute preemption (a preempted request finds its own blocks again), the router's
    index: the same records, timeline and totals."""
    cfg = prefix_config(tiny_config, blocks, replicas, router)
    a, b = both_engines(cfg, shared_prefix_workload(requests, seed))
    assert_same_records(a, b)
    assert a.requests["cached_tokens"].sum() > 0


@pytest.mark.parametrize("sched", [{"long_prefill_token_threshold": 12},
                                   {"policy": "priority"},
                                   {"enable_chunked_prefill": False, "budget": 400}],
                         ids=["threshold", "priority", "whole_prompts"])
def test_prefix_caching_under_other_vllm_settings(tiny_config, requests, sched):
    cfg = prefix_config(tiny_config, 60, 1, "round_robin", **sched)
    req = shared_prefix_workload(requests, 4)
    req["priority"] = np.arange(len(req)) % 3
    a, b = both_engines(cfg, req)
    assert_same_records(a, b)
    assert a.requests["num_preemptions"].sum() > 0
    assert a.requests["cached_tokens"].sum() > 0


@pytest.mark.parametrize("sched", [{"name": "sarathi", "chunk_size": 64},
                                   {"name": "trtllm"},
                                   {"name": "trtllm",
                                    "capacity_scheduler_policy": "MAX_UTILIZATION"}],
                         ids=["sarathi", "trtllm_no_evict", "trtllm_max_utilization"])
@pytest.mark.parametrize("replicas, router", [(1, "round_robin"), (3, "prefix_affinity")],
                         ids=["one", "prefix_affinity"])
@pytest.mark.parametrize("blocks", [30, 60, 400], ids=["evicting", "preempting", "roomy"])
def test_prefix_caching_under_sarathi_and_trtllm(tiny_config, requests, sched, replicas,
                                                 router, blocks):
    """Their admissions match prefixes as vLLM's does (TensorRT-LLM's guaranteed-no-evict
    reserve counts the cached blocks a hit took from the free ones)."""
    cfg = prefix_config(tiny_config, blocks, replicas, router, **sched)
    for seed in (0, 5):
        a, b = both_engines(cfg, shared_prefix_workload(requests, seed))
        assert_same_records(a, b)
        assert a.requests["cached_tokens"].sum() > 0


@pytest.mark.parametrize("name", PREFIX_SCHEDULERS)
def test_every_policy_declaring_a_compiled_prefix_cache_has_one(tiny_config, requests, name):
    """A policy whose class declares ``compiled_prefix_cache`` runs prefix caching on the
    compiled loop with the records of its Python class."""
    extra = {"chunk_size": 64} if "chunk_size" in SCHEDULERS[name].settings else {}
    cfg = prefix_config(tiny_config, 60, 1, "round_robin", name=name, **extra)
    a, b = both_engines(cfg, shared_prefix_workload(requests, 3))
    assert_same_records(a, b)
    assert a.requests["cached_tokens"].sum() > 0


def test_the_compiled_hashes_are_the_caches(requests):
    """``hash_at`` names a block as ``PagedKVCache`` does: a trace's chained hashes, and a
    request without ids by its own chain over its prompt and output."""
    req = requests([0.0] * 3, [40, 17, 5], [3, 9, 1])
    kv = PagedKVCache(100, 4, 3, prefix_caching=True)
    ids = np.empty(3, object)
    ids[:] = [(7, 8, 9, 3, 1), None, ()]
    lengths = (req["input_tokens"] + req["output_tokens"]).to_numpy()
    kv.set_prefix_source(ids, SPAN, lengths)

    class Table:
        size = 3

    px = prefix_state(kv, Table, 1)
    expected = [block_hashes(ids[0], 40, SPAN, 4), block_hashes((-3,), 26, 26, 4),
                block_hashes((-4,), 6, 6, 4)]  # a request without ids: one id, -2 - rid
    for rid, want in enumerate(expected):
        assert kv._block_hashes(rid) == want
        assert num_hashes(px, rid) == len(want) > 0
        assert [hash_at(px, rid, j) for j in range(len(want))] == want


def test_lru_maps_behave_as_ordered_dicts():
    """Random adds, moves to the newest end, removals and evictions of the oldest, on two
    sets at once, agree with ``OrderedDict`` (keys anywhere in int64, and colliding small
    ones)."""
    m = M.lru_maps(2, 50)
    ref = [OrderedDict(), OrderedDict()]
    rng = random.Random(1)
    for _ in range(20_000):
        r = rng.randrange(2)
        key = rng.choice([rng.randrange(-2**63, 2**63), rng.randrange(80)])
        s = M.find(m, r, key)
        assert (s >= 0) == (key in ref[r])
        if s >= 0 and rng.random() < 0.5:
            M.unlink(m, r, s)
            M.link(m, r, s)
            ref[r].move_to_end(key)
        elif s >= 0:
            M.unlink(m, r, s)
            M.remove(m, r, s)
            del ref[r][key]
        elif len(ref[r]) < 50:
            M.link(m, r, M.add(m, r, key))
            ref[r][key] = None
        else:
            assert m[1][r, M.pop_oldest(m, r), M.KEY] == ref[r].popitem(last=False)[0]
        assert m[2][r, M.SIZE] == m[2][r, M.NLRU] == len(ref[r])
    for r in range(2):
        assert all(M.find(m, r, k) >= 0 for k in ref[r])
        order, s = [], m[2][r, M.HEAD]
        while s >= 0:
            order.append(int(m[1][r, s, M.KEY]))
            s = m[1][r, s, M.NEXT]
        assert order == list(ref[r])


@pytest.mark.parametrize("override, reason", [
    ({"scheduler": "sglang"}, "prefix caching with scheduler=sglang"),
    ({"preemption": "swap"}, "swap, a host tier"),
])
def test_what_the_compiled_prefix_cache_does_not_run_says_why(tiny_config, requests, override,
                                                              reason):
    cfg = prefix_config(tiny_config, 60, 1, "round_robin")
    if "scheduler" in override:
        cfg.scheduler = replace(cfg.scheduler, name=override["scheduler"], chunk_size=64)
    else:
        cfg.kv_cache = replace(cfg.kv_cache, preemption="swap", swap_space_gib=0.001)
    rec = simulate(cfg, shared_prefix_workload(requests, 0, 20))
    assert rec.meta["engine"].startswith("python (") and reason in rec.meta["engine"]


MOONCAKE = Path(__file__).resolve().parents[4] / "shared" / "traces" / "mooncake_conversation.csv"


@pytest.mark.skipif(not MOONCAKE.is_file(), reason="the shared Mooncake trace is not next to "
                    "this checkout")
def test_the_mooncake_trace_behind_prefix_affinity_is_the_same_in_both_engines(
        compose_cfg, requests_for):
    """The first 1,500 requests of Mooncake's conversation trace (its ``hash_ids``, 512 tokens
    an id) on 4 replicas with prefix caching behind ``prefix_affinity``, at twice its pace."""
    overrides = ["workload=trace", f"workload.trace_path={MOONCAKE}",
                 "workload.max_requests=1500", "workload.time_scale=0.5", "kv_cache=prefix",
                 "cluster.replicas=4", "cluster.router=prefix_affinity"]
    req = requests_for(compose_cfg(*overrides))
    out = [simulate(compose_cfg(f"engine={e}", *overrides), req) for e in ("python", "auto")]
    assert out[1].meta["engine"] == "compiled"
    assert_same_records(*out)
    assert out[0].requests["cached_tokens"].sum() > 0
