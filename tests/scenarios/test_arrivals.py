"""Arrival processes: Poisson, Gamma (burstiness) and the closed-loop schedule."""

import numpy as np
import pytest
from scipy import stats

from scenarios.arrivals import closed_loop, gamma_arrivals, poisson_arrivals, think_times


def gaps(times: np.ndarray) -> np.ndarray:
    return np.diff(times, prepend=0.0)


def test_poisson_rate_and_exponential_gaps():
    rate, n = 7.0, 50_000
    t = poisson_arrivals(rate, n, np.random.default_rng(11))
    assert t[0] > 0  # first arrival at the first gap, not at 0
    assert np.all(np.diff(t) >= 0)
    assert n / t[-1] == pytest.approx(rate, rel=0.02)
    assert stats.kstest(gaps(t), "expon", args=(0, 1 / rate)).pvalue > 1e-3


@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_gamma_mean_and_cv(cv):
    rate, n = 5.0, 200_000
    g = gaps(gamma_arrivals(rate, cv, n, np.random.default_rng(3)))
    assert g.mean() == pytest.approx(1 / rate, rel=0.03)
    assert g.std() / g.mean() == pytest.approx(cv, rel=0.03)
    assert np.all(g >= 0)


def test_gamma_with_cv_one_is_poisson():
    rate = 3.0
    g = gaps(gamma_arrivals(rate, 1.0, 50_000, np.random.default_rng(5)))
    assert stats.kstest(g, "expon", args=(0, 1 / rate)).pvalue > 1e-3


def test_closed_loop_structure():
    arrival, client, think = closed_loop(10, 4, 2.0, "fixed", np.random.default_rng(0))
    assert client.tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    assert np.all(arrival[:4] == 0.0) and np.all(np.isnan(arrival[4:]))
    assert np.all(think[:4] == 0.0) and np.all(think[4:] == 2.0)


def test_closed_loop_fewer_requests_than_clients():
    arrival, client, _ = closed_loop(3, 8, 0.0, "fixed", np.random.default_rng(0))
    assert client.tolist() == [0, 1, 2] and np.all(arrival == 0.0)


def test_exponential_think_time_mean():
    t = think_times(1.5, "exponential", 100_000, np.random.default_rng(2))
    assert t.mean() == pytest.approx(1.5, rel=0.02)
    assert np.all(think_times(0.0, "exponential", 5, np.random.default_rng(2)) == 0.0)


def test_closed_loop_ramp_spreads_first_requests_evenly():
    arrival, client, _ = closed_loop(10, 4, 0.0, "fixed", np.random.default_rng(0), ramp_up_s=2.0)
    assert arrival[:4].tolist() == [0.0, 0.5, 1.0, 1.5]
    assert np.all(np.isnan(arrival[4:]))
