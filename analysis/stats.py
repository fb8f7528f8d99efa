"""Statistics for replicated simulations: t-intervals, paired differences, Holm's correction,
and the MSER-5 warm-up rule.

Every function works on plain arrays so it can be checked on synthetic data; the comparison
(``analysis.compare``) and the capacity search (``analysis.capacity``) call them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

LEVEL = 0.95  # confidence level of every interval
MSER_BATCH = 5  # MSER-5: batch means of 5 observations


@dataclass(frozen=True)
class Interval:
    """A sample mean with the half-width of its t confidence interval (NaN when n < 2)."""

    mean: float
    half_width: float
    n: int


@dataclass(frozen=True)
class PairedDifference:
    """The mean of per-replication differences (b − a), its t-interval and two-sided p-value."""

    mean: float
    half_width: float
    p_value: float
    n: int


def t_summary(n, mean, sd, level: float = LEVEL) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised over samples given by size ``n``, mean and standard deviation (ddof 1):
    the half-width of each mean's two-sided ``level`` Student-t interval, and the two-sided
    p-value of "the true mean is 0". NaN where n < 2. A sample without spread (all values
    equal up to float noise) has half-width 0 and p = 1 if its mean is 0, else p = 0."""
    n = np.asarray(n, float)
    mean = np.asarray(mean, float)
    sd = np.asarray(sd, float)
    ok = n >= 2
    df = np.where(ok, n - 1, 1.0)
    sem = np.where(ok, sd, np.nan) / np.sqrt(np.where(ok, n, 1.0))
    half = stats.t.ppf(0.5 + level / 2, df) * sem
    flat = ok & (sd <= 1e-12 * np.maximum(np.abs(mean), 1e-300))
    with np.errstate(divide="ignore", invalid="ignore"):
        p = 2 * stats.t.sf(np.abs(mean / sem), df)
    p = np.where(flat, np.where(np.abs(mean) > 0, 0.0, 1.0), p)
    half = np.where(flat, 0.0, half)
    return np.where(ok, half, np.nan), np.where(ok, p, np.nan)


def t_interval(x, level: float = LEVEL) -> Interval:
    """Mean of the finite values of ``x`` and the half-width of its two-sided ``level``
    Student-t interval (replications are independent: one seed each)."""
    x = np.asarray(x, float)
    x = x[np.isfinite(x)]
    n = len(x)
    if n == 0:
        return Interval(float("nan"), float("nan"), 0)
    half, _ = t_summary(n, x.mean(), x.std(ddof=1) if n > 1 else 0.0, level)
    return Interval(float(x.mean()), float(half), n)


def paired_difference(a, b, level: float = LEVEL) -> PairedDifference:
    """Paired comparison of ``b`` against ``a`` (same index = same replication, i.e. the same
    seed and so the same arrivals and lengths): mean difference, its t-interval and the
    p-value of the paired t-test. Pairs with a non-finite value are dropped."""
    d = np.asarray(b, float) - np.asarray(a, float)
    d = d[np.isfinite(d)]
    n = len(d)
    if n == 0:
        return PairedDifference(float("nan"), float("nan"), float("nan"), 0)
    half, p = t_summary(n, d.mean(), d.std(ddof=1) if n > 1 else 0.0, level)
    return PairedDifference(float(d.mean()), float(half), float(p), n)


def holm(p_values) -> np.ndarray:
    """Holm–Bonferroni adjusted p-values (NaN stays NaN): rejecting where the adjusted value
    is below α keeps the chance of any false difference in the family at most α."""
    p = np.asarray(p_values, float)
    out = np.full(p.shape, np.nan)
    ok = np.flatnonzero(np.isfinite(p))
    m = len(ok)
    if not m:
        return out
    order = ok[np.argsort(p[ok], kind="stable")]
    adj = np.maximum.accumulate(p[order] * (m - np.arange(m)))
    out[order] = np.minimum(adj, 1.0)
    return out


@dataclass(frozen=True)
class Truncation:
    """Where MSER-5 ends the warm-up: the number of leading observations to drop, and whether
    the minimum fell in the first half of the series (otherwise the series never settled and
    the cut is capped at half of it)."""

    drop: int
    settled: bool


def mser(y, batch: int = MSER_BATCH) -> Truncation:
    """MSER-``batch`` (White 1997; Franklin & White): average ``y`` in consecutive batches of
    ``batch`` observations, then drop the ``d`` leading batches that minimise
    ``sum((z[d:] - mean(z[d:]))**2) / (k - d)**2``, the squared standard error of the mean of
    what is left. The search is limited to the first half of the batches, as the rule
    prescribes; a minimum on that limit is reported as not settled."""
    y = np.asarray(y, float)
    y = y[np.isfinite(y)]
    k = len(y) // batch
    if k < 4:
        return Truncation(0, True)
    z = y[: k * batch].reshape(k, batch).mean(axis=1)
    # suffix sums give every candidate's mean and sum of squares at once
    s1 = np.cumsum(z[::-1])[::-1]
    s2 = np.cumsum((z * z)[::-1])[::-1]
    m = k - np.arange(k)
    sse = np.maximum(s2 - s1 * s1 / m, 0.0)
    stat = sse / (m * m)
    limit = k // 2
    d = int(np.argmin(stat[: limit + 1]))
    return Truncation(d * batch, d < limit)
