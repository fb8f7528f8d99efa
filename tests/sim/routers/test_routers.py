"""Routing policies' decisions on hand-made pools, without SimPy."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

import numpy as np
import pytest

from sim.config import ClusterConfig, check_cluster
from sim.errors import ConfigError
from sim.kv.manager import PagedKVCache
from sim.routers import ROUTERS, PoolView
from sim.state import RequestTable


def pool(n=3, prompts=(100,) * 8, hash_ids=None, kv_tokens=1024):
    """A view over ``n`` idle replicas and a table of requests with these prompts."""
    t = RequestTable(np.zeros(len(prompts)), np.array(prompts), np.full(len(prompts), 10))
    scheds = [SimpleNamespace(waiting=deque(), running=np.empty(0, np.int64),
                              kv=PagedKVCache(101, 16, len(prompts))) for _ in range(n)]
    return PoolView(scheds, t, hash_ids, kv_tokens)


def router(name, view, seed=0, **options):
    cfg = ClusterConfig(router=name, **options)
    return ROUTERS[name](view, np.random.default_rng(seed), cfg)


def test_every_router_is_registered_and_checked():
    assert set(ROUTERS) == {"round_robin", "random", "least_outstanding", "jsq_tokens",
                            "kv_aware", "prefix_affinity", "power_of_two"}
    for name in ROUTERS:
        check_cluster(ClusterConfig(router=name))
    with pytest.raises(ConfigError, match=r"^cluster.router='nearest': one of \["):
        check_cluster(ClusterConfig(router="nearest"))


def test_round_robin_cycles_and_skips_replicas_that_are_down():
    v = pool(3)
    r = router("round_robin", v)
    assert [r.choose(i) for i in range(4)] == [0, 1, 2, 0]
    v.set_alive(1, False)
    assert [r.choose(i) for i in range(4)] == [2, 0, 2, 0]


def test_random_draws_uniformly_among_replicas_that_are_up():
    v = pool(4)
    v.set_alive(2, False)
    r = router("random", v, seed=3)
    picks = np.array([r.choose(i) for i in range(3000)])
    assert 2 not in picks
    counts = np.bincount(picks, minlength=4)[[0, 1, 3]]
    assert counts.min() > 900
    again = router("random", v, seed=3)  # same stream, same choices
    assert [again.choose(i) for i in range(50)] == picks[:50].tolist()


def test_least_outstanding_picks_the_least_loaded_and_rotates_ties():
    v = pool(3)
    v.outstanding[:] = [3, 1, 2]
    r = router("least_outstanding", v)
    assert r.choose(0) == 1
    v.outstanding[:] = [1, 1, 5]
    assert {r.choose(0), r.choose(1)} == {0, 1}
    v.set_alive(0, False)
    assert r.choose(2) == 1


def test_jsq_tokens_counts_unprefilled_tokens_of_waiting_and_running_requests():
    v = pool(3, prompts=(1000, 300, 300, 50, 10, 10, 10, 10))
    t = v.table
    v.schedulers[0].waiting.extend([0])              # 1000 tokens queued
    v.schedulers[1].waiting.extend([1, 2])           # 600
    v.schedulers[2].running = np.array([3, 4, 5])    # 50 + 10 + 10, partly computed
    t.computed[3] = 40
    assert [v.queued_tokens(i) for i in range(3)] == [1000, 600, 30]
    v.outstanding[:] = [1, 2, 3]
    assert router("jsq_tokens", v).choose(6) == 2


def test_kv_aware_counts_blocks_in_use_and_blocks_the_waiting_need():
    v = pool(3, prompts=(320, 16, 16, 16, 16, 16, 16, 16))
    v.schedulers[0].kv.allocate(5, 0, 160)          # 10 of 100 blocks in use
    v.schedulers[1].waiting.append(0)               # 320 tokens: 20 blocks to come
    v.schedulers[2].kv.allocate(6, 0, 240)          # 15 blocks in use
    assert v.projected_kv_usage(1) == pytest.approx(0.20)
    assert router("kv_aware", v).choose(7) == 0


def test_power_of_two_takes_the_less_loaded_of_two_distinct_replicas():
    v = pool(2)
    v.outstanding[:] = [5, 1]
    r = router("power_of_two", v, seed=7)
    assert {r.choose(i) for i in range(20)} == {1}  # two replicas: both are always drawn
    v = pool(5)
    v.outstanding[:] = [0, 9, 9, 9, 9]
    r = router("power_of_two", v, seed=7)
    picks = [r.choose(i) for i in range(400)]
    # replica 0 wins whenever it is drawn: in 2 of 5 draws of a pair
    assert 0.3 < picks.count(0) / 400 < 0.5


def hashes(*rows):
    out = np.empty(len(rows), object)
    out[:] = [tuple(r) for r in rows]
    return out


def test_prefix_affinity_follows_the_longest_indexed_prefix():
    v = pool(3, hash_ids=hashes([1, 2, 3], [1, 2, 3, 4], [1, 9], [7, 8], [1, 2, 3, 4, 5]))
    r = router("prefix_affinity", v, router_load_cap=8)
    first = r.choose(0)          # no match anywhere: least outstanding
    v.outstanding[first] += 1
    assert r.choose(1) == first  # shares [1, 2, 3]
    v.outstanding[first] += 1
    other = r.choose(3)          # nothing shared: a less loaded replica
    assert other != first
    v.outstanding[other] += 1
    assert r.choose(4) == first  # longest prefix wins over a shorter match elsewhere


def test_prefix_affinity_respects_the_load_cap_and_forgets_a_failed_replica():
    v = pool(2, hash_ids=hashes([1, 2], [1, 2], [1, 2]))
    r = router("prefix_affinity", v, router_load_cap=2)
    home = r.choose(0)
    v.outstanding[home] = 3                  # 3 more than the other replica: over the cap
    assert r.choose(1) == 1 - home
    v.outstanding[:] = 0
    r.forget(home)
    r.forget(1 - home)
    assert not any(r.index)


def test_prefix_affinity_index_is_an_lru_sized_by_the_kv_cache():
    v = pool(1, hash_ids=hashes([1, 2, 3, 4], [5, 6, 7, 8]), kv_tokens=6 * 512)
    r = router("prefix_affinity", v)
    assert r.capacity == 6
    r.choose(0)
    r.choose(1)
    # least recent first: the older request's deepest blocks went first, as the leaves of a
    # radix tree would
    assert list(r.index[0]) == [2, 1, 8, 7, 6, 5]


def test_prefix_affinity_without_hash_ids_is_least_outstanding():
    v = pool(3)
    v.outstanding[:] = [4, 0, 2]
    assert router("prefix_affinity", v).choose(0) == 1


def test_router_options_are_checked():
    for kw, field in (({"router_load_cap": -1}, "cluster.router_load_cap"),
                      ({"prefix_block_tokens": 0}, "cluster.prefix_block_tokens"),
                      ({"prefix_index_blocks": 0}, "cluster.prefix_index_blocks")):
        with pytest.raises(ConfigError, match=f"^{field}="):
            check_cluster(ClusterConfig(**kw))
