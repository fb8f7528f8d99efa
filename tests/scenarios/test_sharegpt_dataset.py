"""``workload=sharegpt``: vLLM's ``vllm bench serve --dataset-name sharegpt`` known by its mean
lengths — pairs that pass the client's filter (``is_valid_sequence``), the given means, a spread
whose longest reply is many means long, the same draw for the same seed, and the settings it
cannot be combined with."""

import numpy as np
import pytest
from hydra import compose, initialize_config_module

import conf.schema  # noqa: F401  (registers the config schemas)
from scenarios import WorkloadError, requests_for_seed
from scenarios.bench_datasets import RandomDatasetConfig
from scenarios.sharegpt_dataset import client_filter, reachable, sharegpt_lengths
from sim import simulate


def config(*overrides):
    with initialize_config_module("conf", version_base=None):
        return compose("config", overrides=["workload=sharegpt", *overrides])


def test_client_filter_is_vllm_bench_serves_rule():
    # is_valid_sequence(min_len=4, max_prompt_len=1024, max_total_len=2048)
    prompts = np.array([3, 4, 1024, 1025, 1000, 1000, 10])
    replies = np.array([10, 4, 10, 10, 1048, 1049, 3])
    assert client_filter(prompts, replies).tolist() == [False, True, True, False, True, False,
                                                        False]


@pytest.mark.parametrize("means", [(214.465, 199.895), (232.6, 220.61), (8, 8), (400, 400),
                                   (8, 500)])
def test_lengths_keep_the_means_under_the_clients_filter(means):
    prompts, replies = sharegpt_lengths(1000, *means, np.random.default_rng(0))
    assert len(prompts) == len(replies) == 1000
    assert prompts.dtype == replies.dtype == np.int64
    assert abs(prompts.mean() - means[0]) < 0.5 and abs(replies.mean() - means[1]) < 0.5
    assert client_filter(prompts, replies).all()


def test_lengths_spread_like_an_exponential():
    prompts, replies = sharegpt_lengths(1000, 214.465, 199.895, np.random.default_rng(0))
    # a burst ends with its longest reply: many means long, not the mean
    assert replies.max() > 5 * replies.mean()
    # median / mean of an exponential is ln 2
    assert np.median(replies) / replies.mean() == pytest.approx(np.log(2), abs=0.08)
    assert replies.std() / replies.mean() == pytest.approx(1.0, abs=0.15)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 17, 50])
@pytest.mark.parametrize("means", [(8.5, 8.5), (214.465, 199.895), (8, 500), (400, 400)])
def test_small_samples_come_within_a_token_or_5_percent(n, means):
    for seed in range(4):
        prompts, replies = sharegpt_lengths(n, *means, np.random.default_rng(seed))
        assert len(prompts) == n and client_filter(prompts, replies).all()
        for got, want in zip((prompts.mean(), replies.mean()), means, strict=True):
            assert abs(got - want) <= max(1.0, 0.05 * want)


def test_the_same_generator_state_gives_the_same_lengths():
    a = sharegpt_lengths(500, 215, 200, np.random.default_rng(7))
    b = sharegpt_lengths(500, 215, 200, np.random.default_rng(7))
    c = sharegpt_lengths(500, 215, 200, np.random.default_rng(8))
    assert all((x == y).all() for x, y in zip(a, b, strict=True))
    assert not (a[1] == c[1]).all()


@pytest.mark.parametrize("means,ok", [((8, 8), True), ((400, 400), True), ((7, 100), False),
                                      ((401, 100), False), ((100, 501), False),
                                      ((350, 451), False)])
def test_reachable_means(means, ok):
    assert reachable(*means) is ok
    if not ok:
        with pytest.raises(ValueError, match="cannot keep"):
            sharegpt_lengths(10, *means, np.random.default_rng(0))


def test_the_yaml_is_a_vllm_bench_serve_burst_of_1000():
    w = config().workload
    assert (w.num_requests, w.rate, w.sharegpt.input_mean, w.sharegpt.output_mean) == (
        1000, float("inf"), 215.0, 200.0)
    req = requests_for_seed(w, 0)
    assert (req["arrival_time_s"] == 0).all()
    assert req["input_tokens"].mean() == pytest.approx(215, abs=0.5)
    assert req["output_tokens"].mean() == pytest.approx(200, abs=0.5)
    # the lengths stream only: another arrival process, the same lengths
    poisson = requests_for_seed(config("workload.rate=5").workload, 0)
    assert req[["input_tokens", "output_tokens"]].equals(
        poisson[["input_tokens", "output_tokens"]])


def test_a_burst_lasts_until_its_longest_reply_is_decoded():
    # every request at the mean finishes in lockstep; the spread leaves a tail of long replies
    # decoded at a small batch, so the same mean lengths take longer as a burst
    base = ["cost_model=constant", "workload.num_requests=200"]
    spread = config(*base)
    fixed = config(*base, "workload.input_tokens=215", "workload.output_tokens=200")
    t_spread = simulate(spread, requests_for_seed(spread.workload, 0)).requests
    t_fixed = simulate(fixed, requests_for_seed(fixed.workload, 0)).requests
    assert t_spread["output_tokens"].max() > 4 * t_fixed["output_tokens"].max()
    assert t_spread["completion_s"].max() > 2 * t_fixed["completion_s"].max()


@pytest.mark.parametrize("overrides,field,words", [
    (["workload.sharegpt.input_mean=401"], "workload.sharegpt.input_mean", "[8, 400]"),
    (["workload.sharegpt.output_mean=7"], "workload.sharegpt.output_mean", "[8, 500]"),
    (["workload.sharegpt.input_mean=400", "workload.sharegpt.output_mean=401"],
     "workload.sharegpt.output_mean", "together at most 800"),
    (["workload.sharegpt.output_mean=nan"], "workload.sharegpt.output_mean", "finite"),
    (["workload.multi_turn.enabled=true"], "workload.multi_turn.enabled", "single turns"),
    (["workload.arrival=trace", "workload.trace_path=t.csv"], "workload.sharegpt",
     "arrival=trace"),
])
def test_bad_sharegpt_settings_name_their_field(overrides, field, words):
    with pytest.raises(WorkloadError) as err:
        requests_for_seed(config(*overrides).workload, 0)
    assert err.value.field == field and words in str(err.value)


def test_one_dataset_draws_the_lengths():
    w = config().workload
    w.random = RandomDatasetConfig()
    with pytest.raises(WorkloadError) as err:
        requests_for_seed(w, 0)
    assert err.value.field == "workload.sharegpt" and "workload.random" in str(err.value)
