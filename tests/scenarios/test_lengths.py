"""Length distributions: fixed, uniform, exact truncated lognormal, empirical resampling."""

import codecs
import gzip

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from scenarios.config import LengthConfig, check_length
from scenarios.errors import WorkloadError
from scenarios.lengths import sample_lengths, sample_truncated_lognormal, truncated_lognormal_ppf


def draw(cfg: LengthConfig, n: int = 1000, seed: int = 0) -> np.ndarray:
    return sample_lengths(cfg, n, np.random.default_rng(seed), "workload.input", "input_tokens")


def scipy_truncated_ppf(q, mu, sigma, low, high):
    a, b = (np.log(low) - mu) / sigma, (np.log(high) - mu) / sigma
    return np.exp(stats.truncnorm.ppf(q, a, b, loc=mu, scale=sigma))


def test_fixed():
    x = draw(LengthConfig(dist="fixed", value=77))
    assert x.dtype == np.int64 and np.all(x == 77)


def test_uniform_inclusive_bounds():
    x = draw(LengthConfig(dist="uniform", low=3, high=6), n=5000)
    assert x.dtype == np.int64 and set(x.tolist()) == {3, 4, 5, 6}


@pytest.mark.parametrize(
    "mu,sigma,low,high",
    [
        (11.1145, 3.3236, 1, 8192),  # ShareGPT input fit: window below the median
        (6.0, 1.0, 1, 4096),  # ordinary
        (0.0, 1.0, 100, 200),  # far upper tail (survival-function branch)
        (20.0, 0.01, 1, 10),  # window probability underflows
    ],
)
def test_truncated_lognormal_ppf_matches_scipy(mu, sigma, low, high):
    q = np.linspace(0.001, 0.999, 41)
    expected = scipy_truncated_ppf(q, mu, sigma, low, high)
    np.testing.assert_allclose(
        truncated_lognormal_ppf(q, mu, sigma, low, high), expected, rtol=1e-6
    )


@pytest.mark.parametrize(
    "mu,sigma,low,high",
    [(11.1145, 3.3236, 1, 8192), (9.8008, 2.3874, 1, 1024), (5.0, 0.5, 50, 400)],
)
def test_truncated_lognormal_sampler_in_bounds_and_quantiles(mu, sigma, low, high):
    x = sample_truncated_lognormal(mu, sigma, low, high, 200_000, np.random.default_rng(7))
    assert x.dtype == np.int64 and x.min() >= low and x.max() <= high
    q = np.array([0.1, 0.25, 0.5, 0.75, 0.9])
    np.testing.assert_allclose(
        np.quantile(x, q), scipy_truncated_ppf(q, mu, sigma, low, high), rtol=0.02, atol=1.0
    )


def test_empirical_resamples_only_column_values(tmp_path):
    path = tmp_path / "lengths.csv"
    pd.DataFrame({"input_tokens": [5, 17, 900], "other": [1, 1, 1]}).to_csv(path, index=False)
    x = draw(LengthConfig(dist="empirical", path=str(path)), n=2000)
    assert set(x.tolist()) == {5, 17, 900}
    y = draw(LengthConfig(dist="empirical", path=str(path), column="other"))
    assert np.all(y == 1)


@pytest.mark.parametrize(
    "content,problem",
    [
        (None, "file not found"),
        ("a,b\n1,2\n", "missing column 'input_tokens'"),
        ("input_tokens\n", "no rows"),
        ("input_tokens\n5\nx\n", "row 1"),
        ("input_tokens\n5\n0\n", "row 1"),
        ("input_tokens\n2.5\n", "row 0"),
        ("input_tokens\n5\n\n\n0\n", r"row 1 \(line 5\)"),  # blank lines are lines
    ],
)
def test_empirical_bad_file(tmp_path, content, problem):
    path = tmp_path / "lengths.csv"
    if content is not None:
        path.write_text(content)
    with pytest.raises(WorkloadError, match=problem) as err:
        draw(LengthConfig(dist="empirical", path=str(path)))
    assert err.value.field == "workload.input.path"


def test_empirical_file_is_read_by_its_content(tmp_path):
    """A gzip file whatever its name, a byte-order mark: as ``read_trace`` reads them."""
    path = tmp_path / "lengths.csv"
    path.write_bytes(gzip.compress(codecs.BOM_UTF8 + b"input_tokens\n5\n17\n"))
    assert set(draw(LengthConfig(dist="empirical", path=str(path))).tolist()) == {5, 17}


lengths = st.one_of(
    st.builds(LengthConfig, dist=st.just("fixed"), value=st.integers(1, 10**6)),
    st.tuples(st.integers(1, 10**5), st.integers(0, 10**5)).map(
        lambda t: LengthConfig(dist="uniform", low=t[0], high=t[0] + t[1])
    ),
    st.tuples(
        st.integers(1, 10**5), st.integers(0, 10**5), st.floats(-30, 30), st.floats(0.01, 10)
    ).map(
        lambda t: LengthConfig(dist="lognormal", low=t[0], high=t[0] + t[1], mu=t[2], sigma=t[3])
    ),
)


@settings(max_examples=150, deadline=None)
@given(cfg=lengths, seed=st.integers(0, 2**32 - 1))
def test_any_valid_length_config_gives_ints_in_bounds(cfg, seed):
    check_length(cfg, "workload.input")
    x = draw(cfg, n=200, seed=seed)
    assert x.dtype == np.int64 and x.shape == (200,)
    lo, hi = (cfg.value, cfg.value) if cfg.dist == "fixed" else (cfg.low, cfg.high)
    assert x.min() >= max(lo, 1) and x.max() <= hi
