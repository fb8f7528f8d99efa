"""The statistics behind ``python -m analysis.compare``: intervals, paired tests, Holm, MSER-5,
and honest verdicts (identical designs show no significant difference in >= 95% of seed sets,
while a real difference is found)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis.compare_tables import design_table, difference_table
from analysis.stats import holm, mser, paired_difference, t_interval
from analysis.verdict import fmt_pm, verdict_sentences

METRICS = ["median_ttft_ms", "p99_ttft_ms", "p99_tpot_ms", "request_throughput"]


def test_t_interval_matches_scipy():
    x = np.array([3.0, 5.0, 4.0, 8.0, 6.5])
    iv = t_interval(x)
    lo, hi = stats.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=stats.sem(x))
    assert iv.mean == pytest.approx(x.mean())
    assert iv.half_width == pytest.approx((hi - lo) / 2)
    assert iv.n == 5
    assert np.isnan(t_interval([2.0]).half_width)


def test_paired_difference_matches_scipy_and_handles_no_spread():
    rng = np.random.default_rng(1)
    a = rng.normal(10, 2, 6)
    b = a + rng.normal(0.5, 0.3, 6)
    d = paired_difference(a, b)
    assert d.p_value == pytest.approx(stats.ttest_rel(b, a).pvalue)
    assert d.mean == pytest.approx((b - a).mean())
    same = paired_difference(a, a.copy())  # common random numbers, identical designs
    assert (same.mean, same.half_width, same.p_value) == (0.0, 0.0, 1.0)
    shifted = paired_difference(a, a + 2.0)  # an exact, deterministic difference
    assert shifted.p_value == 0.0 and shifted.mean == pytest.approx(2.0)


def test_holm_adjusts_as_the_textbook():
    # m = 4: sorted p × (4, 3, 2, 1), running maximum, capped at 1
    p = np.array([0.01, 0.04, 0.03, 0.005])
    assert holm(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert np.isnan(holm([np.nan, 0.2])[0]) and holm([np.nan, 0.2])[1] == pytest.approx(0.2)


def test_mser5_finds_an_initial_transient():
    rng = np.random.default_rng(0)
    warm = np.linspace(50.0, 0.0, 300) + rng.normal(0, 1, 300)  # a decaying start-up bias
    y = np.concatenate([warm, rng.normal(0, 1, 3000)])
    t = mser(y)
    assert 200 <= t.drop <= 320 and t.settled
    flat = mser(rng.normal(0, 1, 3000))
    assert flat.drop < 300
    trend = mser(np.arange(1000.0))  # never settles: capped at half the series
    assert not trend.settled and trend.drop == 500


def _experiments(n_exp: int, seeds: int, shift: float, rng) -> pd.DataFrame:
    """Jobs of ``n_exp`` independent comparisons of designs A and B at two rates: per seed a
    common effect (common random numbers) plus independent noise; B is shifted by ``shift``
    noise standard deviations in every metric."""
    rows = []
    for e in range(n_exp):
        for rate in (2.0, 6.0):
            common = rng.normal(0, 3, (seeds, len(METRICS)))
            for design, mu in (("A", 0.0), ("B", shift)):
                vals = 100 + common + mu + rng.normal(0, 1, (seeds, len(METRICS)))
                for s in range(seeds):
                    rows.append({"design": design, "seed": s, "rate": rate, "experiment": e,
                                 **{f"steady.{m}": vals[s, k] for k, m in enumerate(METRICS)}})
    return pd.DataFrame(rows)


def test_identical_designs_show_no_difference_in_at_least_95_percent_of_seed_sets():
    jobs = _experiments(300, 5, 0.0, np.random.default_rng(42))
    groups = ["rate", "experiment"]
    diffs = difference_table(jobs, groups, METRICS, "A", "holm")
    assert len(diffs) == 300 * 2 * len(METRICS)
    per_metric = 1 - diffs.groupby("metric")["significant"].mean()
    assert (per_metric >= 0.95).all(), per_metric
    # without the correction each test is a plain 5% test: false differences near 5%
    raw = difference_table(jobs, groups, METRICS, "A", "none")["significant"].mean()
    assert 0.02 <= raw <= 0.08


def test_a_real_difference_is_found():
    jobs = _experiments(50, 5, 4.0, np.random.default_rng(7))
    diffs = difference_table(jobs, ["rate", "experiment"], METRICS, "A", "holm")
    assert diffs["significant"].mean() >= 0.9
    assert (diffs["diff"] > 0).mean() >= 0.99


def test_design_table_and_verdict_text():
    rng = np.random.default_rng(3)
    rows = []
    for s in range(4):
        base = {"p99_tpot_ms": 80 + rng.normal(0, 2), "median_ttft_ms": 50 + rng.normal(0, 5)}
        for design, delta in (("vllm", 0.0), ("sarathi", -41.0)):
            noise = rng.normal(0, 0.5)
            rows.append({"design": design, "seed": s, "rate": 6.0,
                         "steady.p99_tpot_ms": base["p99_tpot_ms"] + delta + noise,
                         "steady.median_ttft_ms": base["median_ttft_ms"] + noise})
    jobs = pd.DataFrame(rows)
    metrics = ["p99_tpot_ms", "median_ttft_ms"]
    means = design_table(jobs, ["rate"], metrics)
    assert set(means["n"]) == {4}
    diffs = difference_table(jobs, ["rate"], metrics, "vllm", "holm")
    (sentence,) = verdict_sentences(diffs, ["rate"])
    d = diffs.iloc[0]
    assert sentence == (f"`sarathi` lowers p99 TPOT by {fmt_pm(abs(d['diff']), d['ci'])} ms vs "
                        "`vllm` at 6 req/s; no significant difference in p50 TTFT")
    assert fmt_pm(41.23, 6.1) == "41.2 ± 6.1" and fmt_pm(1523.0, 240.0) == "1,520 ± 240"
