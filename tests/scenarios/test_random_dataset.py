"""``workload=random``: vLLM's ``vllm bench serve --dataset-name random`` — the length bounds
worked out by hand from vLLM's rule, a prefix every prompt shares (and prefix caching hits),
``--request-rate inf`` as a burst at t = 0, and the settings it cannot be combined with."""

import numpy as np
import pytest
from hydra import compose, initialize_config_module

import conf.schema  # noqa: F401  (registers the config schemas)
from analysis.steady import Load, _offered_rate
from scenarios import WorkloadError, requests_for_seed
from scenarios.bench_datasets import RandomDatasetConfig, random_length_bounds
from sim import simulate


def config(*overrides):
    with initialize_config_module("conf", version_base=None):
        return compose("config", overrides=["workload=random", *overrides])


def test_the_yaml_defaults_are_vllm_bench_serve_defaults():
    w = config().workload
    assert (w.num_requests, w.random.input_len, w.random.output_len) == (1000, 1024, 128)
    assert (w.random.range_ratio, w.random.prefix_len, w.rate) == (0.0, 0, float("inf"))


@pytest.mark.parametrize("rd,inputs,outputs", [
    # no range: exactly the lengths asked for, special tokens or not
    (RandomDatasetConfig(), (1024, 1024), (128, 128)),
    (RandomDatasetConfig(special_tokens=1), (1024, 1024), (128, 128)),
    # floor((1024-1)·0.5) + 1 = 512, ceil((1024-1)·1.5) + 1 = 1536; 64..192 out
    (RandomDatasetConfig(range_ratio=0.5, special_tokens=1), (512, 1536), (64, 192)),
    # floor(100·0.75) = 75, ceil(100·1.25) = 125; output floor(3·0.75)=2, ceil(3.75)=4
    (RandomDatasetConfig(input_len=100, output_len=3, range_ratio=0.25), (75, 125), (2, 4)),
    # an output range reaching 0 is floored at 1, as vLLM does; and its float arithmetic:
    # 40·(1 − 0.9) is 3.999…, so the shortest prompt is 3 tokens
    (RandomDatasetConfig(input_len=40, output_len=1, range_ratio=0.9), (3, 76), (1, 2)),
])
def test_length_bounds_follow_vllm_floor_and_ceil(rd, inputs, outputs):
    assert random_length_bounds(rd) == (inputs, outputs)


def test_lengths_are_uniform_over_the_bounds_and_reach_both_ends():
    w = config("workload.num_requests=20000", "workload.random.input_len=100",
               "workload.random.output_len=10", "workload.random.range_ratio=0.2").workload
    req = requests_for_seed(w, 3)
    for column, (low, high) in zip(("input_tokens", "output_tokens"),
                                   random_length_bounds(w.random), strict=True):
        x = req[column].to_numpy()
        assert (x.min(), x.max()) == (low, high)
        assert x.mean() == pytest.approx((low + high) / 2, rel=0.01)
        counts = np.bincount(x - low)
        assert counts.min() > 0.8 * counts.mean()  # every value drawn about as often
    assert "hash_ids" not in req  # no prefix, nothing shared


def test_the_prefix_leads_every_prompt_and_is_shared_block_for_block():
    w = config("workload.num_requests=50", "workload.random.prefix_len=1024",
               "workload.random.range_ratio=0.5", "workload.random.special_tokens=1",
               "workload.hash_block_tokens=16").workload
    req = requests_for_seed(w, 0)
    (low, high), _ = random_length_bounds(w.random)
    own = req["input_tokens"].to_numpy() - 1024
    assert own.min() >= low and own.max() <= high
    # BOS + 1024 prefix tokens: 64 whole 16-token blocks shared by all, the rest fresh
    heads = {h[:64] for h in req["hash_ids"]}
    assert heads == {tuple(range(64))}
    tails = [i for h in req["hash_ids"] for i in h[64:]]
    assert len(tails) == len(set(tails))
    assert [len(h) for h in req["hash_ids"]] == [-(-n // 16) for n in req["input_tokens"]]


def test_prefix_caching_hits_the_shared_prefix():
    # requests 2 s apart never overlap: each after the first reuses the 1024-token prefix
    cfg = config("kv_cache=prefix", "kv_cache.num_gpu_blocks=200000", "cost_model=constant",
                 "workload.rate=0.5", "workload.num_requests=20",
                 "workload.random.prefix_len=1024", "workload.random.input_len=200",
                 "workload.random.output_len=4")
    rec = simulate(cfg, requests_for_seed(cfg.workload, 0)).requests
    cached = rec["cached_tokens"].to_numpy()
    assert cached[0] == 0 and (cached[1:] == 1024).all()


def test_the_same_lengths_stream_gives_the_same_lengths_at_any_rate():
    a = requests_for_seed(config("workload.random.range_ratio=0.5").workload, 7)
    b = requests_for_seed(config("workload.random.range_ratio=0.5",
                                 "workload.rate=3").workload, 7)
    assert a[["input_tokens", "output_tokens"]].equals(b[["input_tokens", "output_tokens"]])
    assert (a["arrival_time_s"] == 0).all() and (np.diff(b["arrival_time_s"]) > 0).all()


def test_rate_inf_is_a_burst_neither_steady_nor_overloaded():
    assert _offered_rate(requests_for_seed(config().workload, 0)["arrival_time_s"]) == np.inf
    load = Load(np.inf, 25.0, 0.5, 1000, False, True, 0, "req", "requests", "TTFT")
    assert load.burst and not load.steady and not load.overloaded
    assert load.headline().startswith("BURST: ")
    assert "set workload.rate" in load.headline()


@pytest.mark.parametrize("overrides,field,words", [
    (["workload.random.range_ratio=1.0"], "workload.random.range_ratio", "in [0, 1)"),
    (["workload.random.range_ratio=-0.1"], "workload.random.range_ratio", "in [0, 1)"),
    (["workload.random.input_len=1", "workload.random.range_ratio=0.5"],
     "workload.random.range_ratio", "no tokens of its own"),
    (["workload.random.input_len=0"], "workload.random.input_len", ">= 1"),
    (["workload.random.prefix_len=-1"], "workload.random.prefix_len", ">= 0"),
    (["workload.random.special_tokens=1024"], "workload.random.special_tokens",
     "must be below"),
    (["workload.system_prompt.count=4"], "workload.system_prompt.count", "prefix_len"),
    (["workload.multi_turn.enabled=true"], "workload.multi_turn.enabled", "single turns"),
    (["workload.arrival=trace", "workload.trace_path=t.csv"], "workload.random",
     "arrival=trace"),
])
def test_bad_random_settings_name_their_field(overrides, field, words):
    with pytest.raises(WorkloadError) as err:
        requests_for_seed(config(*overrides).workload, 0)
    assert err.value.field == field and words in str(err.value)
