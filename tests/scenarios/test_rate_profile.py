"""Time-varying arrivals (``workload.rate_profile``) and a trace re-timed to a peak rate."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from omegaconf import OmegaConf
from scipy import stats

from analysis.capacity_config import DIURNAL
from scenarios import WorkloadConfig, WorkloadError, build_requests, requests_for_seed
from scenarios.rate_profile import RateProfile
from scenarios.traces import busiest_rate


def workload(**over) -> WorkloadConfig:
    w = OmegaConf.structured(WorkloadConfig(name="t", input_tokens=10, output_tokens=10))
    return OmegaConf.merge(w, over)


def chi_square(arrivals: np.ndarray, profile: RateProfile, edges: np.ndarray) -> float:
    """p-value of the counts in ``edges`` bins against the profile's expected counts."""
    observed = np.histogram(arrivals, bins=edges)[0]
    expected = np.diff(profile.cumulative(edges))
    expected *= observed.sum() / expected.sum()  # the count is itself random
    return stats.chisquare(observed, expected).pvalue


def test_a_diurnal_day_arrives_hour_by_hour_at_its_hourly_rates():
    """24 hours of DIURNAL weights (a day compressed to 60 s hours) at a peak of 20 req/s:
    the count of each hour passes a chi-square test against 20 × weight × 60, and the
    total is within 4 sd of the Poisson mean."""
    w = workload(rate=20.0, rate_profile={"hourly": DIURNAL, "hour_s": 60.0})
    t = requests_for_seed(w, 1)["arrival_time_s"].to_numpy()
    hourly = 20.0 * np.array(DIURNAL) * 60.0
    assert abs(len(t) - hourly.sum()) < 4 * np.sqrt(hourly.sum())
    assert t.min() >= 0 and t.max() < 24 * 60 and (np.diff(t) >= 0).all()
    observed = np.histogram(t, bins=np.arange(25) * 60.0)[0]
    assert stats.chisquare(observed, hourly * len(t) / hourly.sum()).pvalue > 1e-3
    # a profile read hour by hour as a constant would not pass: one hour is 10x another
    assert observed.max() > 3 * observed.min()


def test_linear_segments_and_a_flash_crowd_are_drawn_exactly():
    """A ramp up, a ramp down to 0 and a ×5 crowd across a knot: counts in 5 s bins (which
    split segments, so a piecewise-constant approximation of the ramps fails) pass a
    chi-square test against Λ; nothing arrives where the rate is 0."""
    w = workload(rate=10.0, rate_profile={
        "points": [{"time_s": 0, "multiplier": 0}, {"time_s": 100, "multiplier": 1},
                   {"time_s": 200, "multiplier": 0.2}, {"time_s": 300, "multiplier": 0.2},
                   {"time_s": 400, "multiplier": 0}],
        "flash_crowds": [{"start_s": 190, "duration_s": 20, "factor": 5}]})
    profile = RateProfile.from_config(w.rate_profile, 10.0)
    t = requests_for_seed(w, 3)["arrival_time_s"].to_numpy()
    assert chi_square(t, profile, np.arange(0, 401, 5.0)) > 1e-3
    crowd = ((t >= 190) & (t < 210)).sum()
    assert crowd == pytest.approx(np.diff(profile.cumulative([190, 210]))[0], rel=0.15)
    assert profile.rate([195.0])[0] == pytest.approx(5 * 10 * (1 - 0.8 * 95 / 100))


RATES = st.one_of(st.just(0.0), st.floats(1e-3, 50))


@given(st.lists(st.tuples(st.floats(0.1, 100), RATES, RATES), min_size=1, max_size=6),
       st.floats(0, 1 - 1e-9))
def test_the_inverse_undoes_the_cumulative_rate(segments, u):
    """Any piecewise-linear profile, flat, stepping and starting from 0 included: for a
    fraction ``u`` of the expected arrivals, Λ(Λ⁻¹(y)) = y and Λ⁻¹ is non-decreasing."""
    knots = np.concatenate([[0.0], np.cumsum([s[0] for s in segments])])
    p = RateProfile(knots, [s[1] for s in segments], [s[2] for s in segments])
    if p.expected_arrivals == 0:
        return
    y = np.array([0.0, u, min(u + 1e-3, 1 - 1e-12)]) * p.expected_arrivals
    t = p.invert(y)
    assert (np.diff(t) >= 0).all() and 0 <= t[0] <= t[-1] <= p.end
    np.testing.assert_allclose(p.cumulative(t), y, rtol=1e-9, atol=1e-9 * p.expected_arrivals)


def test_gamma_gaps_keep_their_burstiness_under_a_profile():
    """arrival=gamma with a flat profile: gaps have the configured CV, and a doubled
    multiplier doubles the count (the unit-rate process is time-changed, not resampled)."""
    flat = {"points": [{"time_s": 0, "multiplier": 1}, {"time_s": 2000, "multiplier": 1}]}
    w = workload(arrival="gamma", cv=3.0, rate=5.0, rate_profile=flat)
    t = requests_for_seed(w, 0)["arrival_time_s"].to_numpy()
    gaps = np.diff(t)
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.15)
    assert len(t) == pytest.approx(10_000, rel=0.15)


def test_a_profile_replaces_num_requests_and_the_same_seed_gives_the_same_day():
    w = workload(rate=2.0, num_requests=7, rate_profile={"hourly": [1.0, 0.5], "hour_s": 100})
    a, b = requests_for_seed(w, 5), requests_for_seed(w, 5)
    assert len(a) > 200 and a.equals(b)
    assert not a.equals(requests_for_seed(w, 6))


@pytest.mark.parametrize("over, field", [
    (dict(rate_profile={"hourly": [1.0], "points": [{"time_s": 0}, {"time_s": 1}]}),
     "workload.rate_profile.points"),
    (dict(rate_profile={"hourly": [1.0, -0.5]}), "workload.rate_profile.hourly[1]"),
    (dict(rate_profile={"hourly": [0.0, 0.0]}), "workload.rate_profile"),
    (dict(rate_profile={"hourly": [1.0], "hour_s": 0}), "workload.rate_profile.hour_s"),
    (dict(rate_profile={"points": [{"time_s": 0}]}), "workload.rate_profile.points"),
    (dict(rate_profile={"points": [{"time_s": 5}, {"time_s": 9}]}),
     "workload.rate_profile.points[0].time_s"),
    (dict(rate_profile={"points": [{"time_s": 0}, {"time_s": 9}, {"time_s": 9}]}),
     "workload.rate_profile.points[2].time_s"),
    (dict(rate_profile={"flash_crowds": [{"start_s": 1}]}),
     "workload.rate_profile.flash_crowds"),
    (dict(rate_profile={"hourly": [1.0], "flash_crowds": [{"duration_s": 0}]}),
     "workload.rate_profile.flash_crowds[0].duration_s"),
    (dict(arrival="closed_loop", rate_profile={"hourly": [1.0]}), "workload.rate_profile"),
    (dict(multi_turn={"enabled": True}, rate_profile={"hourly": [1.0]}),
     "workload.rate_profile"),
    (dict(rate=float("inf"), rate_profile={"hourly": [1.0]}), "workload.rate"),
    (dict(rate=1e6, rate_profile={"hourly": [1.0] * 48}), "workload.rate_profile"),
    (dict(rate_profile={"hourly": [1.0], "hour_s": 1e9}), "workload.rate_profile"),
    (dict(arrival="trace", trace_path="x.csv", peak_rate=-1.0), "workload.peak_rate"),
    (dict(arrival="trace", trace_path="x.csv", peak_rate=3.0, time_scale=0.5),
     "workload.time_scale"),
])
def test_a_bad_profile_is_one_error_naming_its_field(over, field):
    with pytest.raises(WorkloadError) as e:
        build_requests(workload(**over), np.random.default_rng(0), np.random.default_rng(1))
    assert e.value.field == field and str(e.value).startswith(f"{field}=")


def test_busiest_rate_is_a_sliding_window_not_fixed_bins():
    """10 arrivals in [0.5, 1.4) split by the bin edge at 1.0: fixed 1 s bins see 5; the
    sliding window sees all 10."""
    t = np.concatenate([np.linspace(0.5, 1.4, 10), [10.0]])
    assert busiest_rate(t, 1.0) == 10.0
    assert busiest_rate(t, 100.0) == pytest.approx(10 / 9.5)  # shorter than the window
    assert busiest_rate(np.zeros(3), 1.0) == 0.0


def test_a_trace_is_re_timed_so_its_busiest_window_runs_at_the_peak_rate(tmp_path):
    """A trace with a 10 s burst of 4 req/s inside 1 req/s: peak_rate=2 stretches its
    clock until its busiest 10 s window (of the new clock) runs at 2 req/s, and no less
    stretch does; every row is kept, in order. A burst at one instant cannot be spread."""
    rng = np.random.default_rng(0)
    t = np.sort(np.concatenate([np.arange(0, 100, 1.0), 50 + rng.uniform(0, 10, 30)]))
    path = tmp_path / "trace.csv"
    path.write_text("arrival_time_s,input_tokens,output_tokens\n" +
                    "".join(f"{x},5,5\n" for x in t))
    w = workload(arrival="trace", trace_path=str(path), peak_rate=2.0, peak_window_s=10.0)
    out = build_requests(w, np.random.default_rng(0), np.random.default_rng(1))
    new = out["arrival_time_s"].to_numpy()
    f = new[-1] / (t[-1] - t[0])
    np.testing.assert_allclose(new, (t - t[0]) * f)
    assert busiest_rate(new, 10.0) <= 2.0 < busiest_rate(new * (1 - 1e-6), 10.0)
    # a time scale read on the trace's own clock misses: its busiest 10 s is 4 req/s, but
    # stretched 2x the busiest 10 s of the new clock holds more than 20 arrivals
    assert busiest_rate((t - t[0]) * busiest_rate(t, 10.0) / 2.0, 10.0) > 2.0
    flat = tmp_path / "flat.csv"
    flat.write_text("arrival_time_s,input_tokens,output_tokens\n1,5,5\n1,5,5\n")
    with pytest.raises(WorkloadError, match="workload.peak_rate=3.0: a rate its busiest"):
        build_requests(workload(arrival="trace", trace_path=str(flat), peak_rate=3.0),
                       np.random.default_rng(0), np.random.default_rng(1))
