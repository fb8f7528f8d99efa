"""The searches and arithmetic of the capacity plan on synthetic answers: bracketing and
bisection, the replica count and its verification, the forecast and its checks."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from analysis.capacity_config import DIURNAL, check_forecast
from analysis.capacity_search import Evaluation, judge, max_rate, replicas_for
from analysis.forecast import autoscaled_replicas, costs, hourly_rates, peak_rates
from sim.errors import ConfigError


def _threshold(limit: float, calls: list):
    """An evaluation that meets the SLO exactly below ``limit`` req/s."""

    def ev(rate: float) -> Evaluation:
        calls.append(rate)
        ok = rate <= limit
        return Evaluation(rate, 1, {"p99_ttft_ms": rate / limit * 500}, ok,
                          [] if ok else ["p99_ttft_ms"], rate / limit)

    return ev


@pytest.mark.parametrize("limit, start", [(7.3, 5.0), (0.9, 5.0), (123.0, 1.0), (5.0, 5.0)])
def test_bracketing_and_bisection_find_the_limit(limit, start):
    calls = []
    r = max_rate(_threshold(limit, calls), start, 0.01, 0.01, 1e4, 60)
    assert r.low <= limit < r.high and r.high / r.low - 1 <= 0.01
    assert r.rate == r.low and r.best().rate == r.low
    # monotone search: brackets in doublings or quarterings, then halves the bracket
    bracket = math.ceil(abs(math.log2(limit / start))) + 1
    assert len(calls) <= bracket + math.ceil(math.log2(math.log(4) / math.log(1.01))) + 2


def test_an_unmeetable_slo_reports_the_closest_rate():
    calls = []

    def never(rate: float) -> Evaluation:
        calls.append(rate)
        worst = 3.0 + rate  # closest to the bound at the lowest rate
        return Evaluation(rate, 1, {}, False, ["p99_ttft_ms"], worst)

    r = max_rate(never, 5.0, 0.02, 0.05, 1e4, 40)
    assert r.rate is None and r.low is None
    assert min(calls) == pytest.approx(0.05)
    assert r.best().rate == pytest.approx(0.05)


def test_search_stops_at_the_simulation_budget():
    calls = []
    r = max_rate(_threshold(1e9, calls), 1.0, 0.01, 0.01, 1e12, 5)
    assert len(calls) == 5 and r.rate == 16.0 and r.high is None


def _cluster(capacity_per_replica: float):
    """A cluster meets the SLO while the rate is at most replicas × capacity."""

    def ev(rate: float, n: int) -> Evaluation:
        ok = rate <= n * capacity_per_replica
        return Evaluation(rate, n, {}, ok, [] if ok else ["x"], rate / (n * capacity_per_replica))

    return ev


@pytest.mark.parametrize("estimate", [1, 3, 5, 9])
def test_replicas_are_the_fewest_that_hold_and_one_fewer_breaks(estimate):
    p = replicas_for(_cluster(6.0), 31.0, estimate, max_adjustments=8)
    assert p.replicas == 6 and p.verified
    assert p.at_size.ok and not p.one_fewer.ok and p.one_fewer.replicas == 5


def test_replicas_unverified_when_the_adjustment_limit_is_hit():
    p = replicas_for(_cluster(1.0), 50.0, 2, max_adjustments=3)
    assert not p.verified and p.replicas == 5 and "still misses" in p.note


def test_judge_bounds_and_keeping_up():
    ok, missed, worst = judge({"p99_ttft_ms": 400.0, "slo_attainment": 0.995,
                               "throughput_ratio": 0.99},
                              {"p99_ttft_ms": 500.0, "slo_attainment": 0.99}, 0.95)
    assert ok and not missed and worst == pytest.approx(0.99 / 0.995)
    ok, missed, _ = judge({"p99_ttft_ms": 400.0, "throughput_ratio": 0.8},
                          {"p99_ttft_ms": 500.0}, 0.95)
    assert not ok and missed == ["throughput_ratio=0.8 < 0.95"]


def test_forecast_rates_and_costs():
    assert peak_rates(10, 0.1, 3) == pytest.approx([10, 11, 12.1])
    assert peak_rates(10, -0.25, 4, "linear") == pytest.approx([10, 7.5, 5, 2.5])
    hours = hourly_rates(40.0, DIURNAL)
    assert hours.max() == pytest.approx(40.0) and len(hours) == 24
    auto = autoscaled_replicas(40.0, DIURNAL, 7.0, 6)
    assert auto.max() == 6 and auto.min() >= 1
    c = costs(40.0, DIURNAL, 6, 2, 3.0, 2000.0, 500.0, auto)
    assert c["gpus"] == 12 and c["cost_per_hour"] == pytest.approx(36.0)
    tokens_per_hour = np.mean(hours) * 3600 * 2000
    assert c["cost_per_million_tokens"] == pytest.approx(36.0 / tokens_per_hour * 1e6)
    assert c["autoscaled_cost_per_day"] <= 24 * 36.0


def _forecast(**kw):
    base = dict(peak_rate=20.0, growth_per_month=0.1, growth="compound", horizon_months=6,
                diurnal=list(DIURNAL))
    return SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize("kw, field", [
    (dict(growth="linear", growth_per_month=-0.3, horizon_months=6),
     "capacity.forecast.growth_per_month"),
    (dict(growth_per_month=-1.0), "capacity.forecast.growth_per_month"),
    (dict(peak_rate=-5.0), "capacity.forecast.peak_rate"),
    (dict(diurnal=[1.0] * 23), "capacity.forecast.diurnal"),
    (dict(diurnal=[-1.0] + [1.0] * 23), "capacity.forecast.diurnal"),
    (dict(horizon_months=0), "capacity.forecast.horizon_months"),
])
def test_bad_forecasts_name_their_field(kw, field):
    with pytest.raises(ConfigError) as e:
        check_forecast(_forecast(**kw))
    assert e.value.field == field


def test_a_declining_forecast_that_stays_positive_is_fine():
    check_forecast(_forecast(growth="linear", growth_per_month=-0.1, horizon_months=6))
    check_forecast(_forecast(growth_per_month=-0.5, horizon_months=24))
