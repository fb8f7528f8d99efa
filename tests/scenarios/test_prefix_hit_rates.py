"""Synthetic prefixes through the simulator: prefix-cache hits that can be worked out by hand,
the KV block size they map onto, multi-turn release after completion, and routing."""

import numpy as np
import pytest
from hydra import compose, initialize_config_module

import conf.schema  # noqa: F401  (registers the config schemas)
from scenarios import requests_for_seed
from sim import simulate
from sim.kv.manager import PagedKVCache
from sim.kv.prefix import block_hashes

# an unbounded cache (far more blocks than any run here touches) and 7 ms steps
UNBOUNDED = ("kv_cache=prefix", "kv_cache.num_gpu_blocks=200000", "cost_model=constant")


def config(*overrides):
    with initialize_config_module("conf", version_base=None):
        return compose("config", overrides=[*UNBOUNDED, *overrides])


@pytest.mark.parametrize("block_size", [16, 32])
def test_one_system_prompt_every_later_request_hits_all_of_it(block_size):
    # 1 system prompt of 1024 tokens; requests 2 s apart never overlap
    cfg = config(f"kv_cache.block_size={block_size}", "workload=system_prompt",
                 "workload.system_prompt.count=1", "workload.system_prompt.tokens=1024",
                 "workload.num_requests=30", "workload.rate=0.5",
                 "workload.input.dist=uniform", "workload.input.low=1",
                 "workload.input.high=400", "workload.output.value=4")
    req = requests_for_seed(cfg.workload, 0)
    rec = simulate(cfg, req).requests
    cached = rec["cached_tokens"].to_numpy()
    assert cached[0] == 0 and (cached[1:] == 1024).all()  # 1024 / block_size blocks each
    assert (cached[1:] // block_size == 1024 // block_size).all()
    hit = cached.sum() / rec["input_tokens"].sum()
    assert hit == pytest.approx(29 * 1024 / req["input_tokens"].sum())


def test_system_prompt_default_yaml_hit_rate_by_hand():
    # 64 system prompts of 2048 tokens + 128-token questions: each prompt's first request
    # misses, every other one hits its 2048 tokens (rate low enough that none overlap)
    cfg = config("workload=system_prompt", "workload.rate=2", "workload.num_requests=300")
    req = requests_for_seed(cfg.workload, 0)
    rec = simulate(cfg, req).requests
    groups = len({h[0] for h in req["hash_ids"]})
    expected = (300 - groups) * 2048 / (300 * (2048 + 128))
    assert rec["cached_tokens"].sum() / rec["input_tokens"].sum() == pytest.approx(expected)


def test_hash_blocks_finer_than_kv_blocks_share_up_to_the_last_whole_kv_block():
    """A 1000-token system prompt named in 16-token ids: 62 KV blocks of 16 are shared (992
    tokens), where 512-token ids (Mooncake's) share 512."""
    cfg_tokens = 1000
    for g, shared in ((16, 992), (512, 512)):
        w = config("workload=system_prompt", "workload.system_prompt.count=1",
                   f"workload.system_prompt.tokens={cfg_tokens}", "workload.num_requests=2",
                   f"workload.hash_block_tokens={g}").workload
        req = requests_for_seed(w, 0)
        kv = PagedKVCache(10_000, 16, 2, prefix_caching=True)
        kv.set_prefix_source(req["hash_ids"].to_numpy(), trace_block=g)
        p = req["input_tokens"].to_numpy()
        assert kv.match_prefix(0, int(p[0])) == 0
        kv.allocate(0, 0, int(p[0]))
        computed = np.array([p[0], 0])
        kv.commit(computed)
        assert kv.match_prefix(1, int(p[1])) == shared
        a, b = (block_hashes(h, n, g, 16) for h, n in zip(req["hash_ids"], p, strict=True))
        assert sum(x == y for x, y in zip(a, b, strict=False)) == shared // 16


@pytest.mark.parametrize("cluster", ["single", "disagg"])
def test_prefix_block_tokens_reach_the_kv_cache_end_to_end(cluster):
    """``cluster.prefix_block_tokens=16`` (the workload's ids follow it): a 1000-token system
    prompt shares its 62 whole 16-token blocks (992 tokens) through ``simulate``; read as
    512-token ids, the first id alone would cover 512 tokens and the shared ids far more."""
    extra = ("cluster.prefill_replicas=1", "cluster.decode_replicas=1") \
        if cluster == "disagg" else ()
    cfg = config(f"cluster={cluster}", *extra, "cluster.prefix_block_tokens=16",
                 "workload=system_prompt", "workload.system_prompt.count=1",
                 "workload.system_prompt.tokens=1000", "workload.num_requests=6",
                 "workload.rate=0.5", "workload.output.value=4")
    assert cfg.workload.hash_block_tokens == 16
    req = requests_for_seed(cfg.workload, 0)
    rec = simulate(cfg, req).requests
    assert (rec["status"] == "completed").all()
    np.testing.assert_array_equal(rec["cached_tokens"].to_numpy(), [0] + [992] * 5)


def test_multi_turn_hit_rate_on_an_unbounded_cache_is_the_repeated_prompt_share():
    """Each turn re-sends the previous turn's prompt and answer, whose computed full KV
    blocks the cache holds (generated tokens' blocks too, as vLLM v1 and SGLang cache them):
    turn t hits ⌊(P + O − 1)(t-1)/16⌋·16 tokens (the last output token is sampled, never
    computed), a session's first turn nothing."""
    cfg = config("workload=multi_turn", "workload.num_requests=200", "workload.rate=1")
    req = requests_for_seed(cfg.workload, 3)
    rec = simulate(cfg, req).requests
    p, o = req["input_tokens"].to_numpy(), req["output_tokens"].to_numpy()
    session = req["client"].to_numpy()
    follow = np.r_[False, session[1:] == session[:-1]]
    expected = np.zeros(len(p), np.int64)
    expected[follow] = (p + o - 1)[:-1][follow[1:]] // 16 * 16
    assert follow.sum() > 50
    np.testing.assert_array_equal(rec["cached_tokens"].to_numpy(), expected)
    hit = rec["cached_tokens"].sum() / rec["input_tokens"].sum()
    assert hit == pytest.approx(expected.sum() / p.sum()) and 0.5 < hit < 0.9


def test_multi_turn_fast_forward_is_exact_with_generated_blocks_cached():
    """Decode windows commit the blocks they fill as stepping does: same hits and times
    on a cache small enough to evict (and preempt)."""
    runs = [simulate(cfg, requests_for_seed(cfg.workload, 2)).requests for cfg in (
        config("workload=multi_turn", "workload.num_requests=150", "workload.rate=3",
               "kv_cache.num_gpu_blocks=400", f"fast_forward={ff}") for ff in (True, False))]
    a, b = runs
    assert a["cached_tokens"].sum() > 0
    np.testing.assert_array_equal(a["cached_tokens"], b["cached_tokens"])
    np.testing.assert_allclose(a["first_token_s"], b["first_token_s"], rtol=0, atol=1e-9)
    np.testing.assert_allclose(a["completion_s"], b["completion_s"], rtol=0, atol=1e-9)


def test_multi_turn_next_turn_arrives_think_time_after_the_previous_completes():
    cfg = config("workload=multi_turn", "workload.num_requests=120", "workload.rate=4")
    req = requests_for_seed(cfg.workload, 1)
    rec = simulate(cfg, req).requests
    session = req["client"].to_numpy()
    follow = np.flatnonzero(session[1:] == session[:-1]) + 1
    assert len(follow) > 20
    np.testing.assert_allclose(rec["arrival_s"].to_numpy()[follow],
                               rec["completion_s"].to_numpy()[follow - 1]
                               + req["think_time_s"].to_numpy()[follow], rtol=1e-12)
    assert (rec["status"] == "completed").all()


def test_prefix_affinity_keeps_each_synthetic_conversation_on_one_replica():
    cfg = config("workload=multi_turn", "workload.num_requests=150", "workload.rate=4",
                 "workload.multi_turn.turns.low=3", "workload.multi_turn.turns.high=5",
                 "cluster.replicas=4", "cluster.router=prefix_affinity")
    req = requests_for_seed(cfg.workload, 0)
    rec = simulate(cfg, req).requests
    assert (rec.groupby(req["client"])["replica"].nunique() == 1).all()
