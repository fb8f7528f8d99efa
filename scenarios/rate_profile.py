"""Time-varying arrival rates: a piecewise-linear rate and arrivals drawn from it exactly.

``workload.rate_profile`` gives the rate of a day (or any span) as multipliers of
``workload.rate``: ``hourly`` weights, one per ``hour_s`` seconds (the form of
``capacity.forecast.diurnal``), or ``points`` ``{time_s, multiplier}`` with the rate linear
between them; ``flash_crowds`` multiply it by ``factor`` for ``duration_s`` from ``start_s``.
Both forms are the same object here: a rate that is linear on each segment between knots,
possibly stepping at a knot.

Arrivals are a unit-rate process (exponential gaps: Poisson; Gamma gaps of mean 1: the same
burstiness as ``arrival=gamma``) mapped through the inverse of the cumulative rate
``Λ(t) = ∫₀ᵗ r``: ``t_k = Λ⁻¹(S_k)``. For Poisson gaps this is the non-homogeneous Poisson
process of rate ``r`` exactly (Çinlar's time change; no thinning, no binning), and ``Λ`` is a
quadratic on each segment, so the inverse is closed-form. Arrivals run over ``[0, end)``: the
number of requests is what the process gives there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scenarios.errors import WorkloadError
from scenarios.field_checks import check_nonnegative, check_positive, check_seconds, finite
from scenarios.traces import MAX_TIME_S


@dataclass
class FlashCrowdConfig:
    """A step of the rate: ``factor`` times the profile for ``duration_s`` from ``start_s``."""

    start_s: float = 0.0
    duration_s: float = 60.0
    factor: float = 2.0


@dataclass
class RatePointConfig:
    """One knot of a piecewise-linear profile: the rate at ``time_s`` is ``multiplier`` ×
    ``workload.rate``."""

    time_s: float = 0.0
    multiplier: float = 1.0


@dataclass
class RateProfileConfig:
    """``workload.rate_profile``: the arrival rate over time as multipliers of
    ``workload.rate``; empty ``hourly`` and ``points``: a constant rate."""

    hourly: list[float] = field(default_factory=list)  # one weight per hour (24: a day)
    hour_s: float = 3600.0  # seconds of one ``hourly`` entry (less: a compressed day)
    # knots from time 0, the rate linear between them; the last one's time ends the span
    points: list[RatePointConfig] = field(default_factory=list)
    flash_crowds: list[FlashCrowdConfig] = field(default_factory=list)


def has_profile(w: Any) -> bool:
    """Whether ``workload.rate_profile`` sets a time-varying rate."""
    p = getattr(w, "rate_profile", None)
    return p is not None and bool(list(p.hourly) or list(p.points))


def check_rate_profile(w: Any, max_requests: int) -> None:
    """Range checks of ``workload.rate_profile`` (and the arrival processes it applies to);
    raises ``WorkloadError`` naming the field."""
    p = getattr(w, "rate_profile", None)
    if p is None:  # a config from before rate profiles
        return
    name = "workload.rate_profile"
    hourly, points, crowds = list(p.hourly), list(p.points), list(p.flash_crowds)
    if not (hourly or points):
        if crowds:
            raise WorkloadError(f"{name}.flash_crowds", f"{len(crowds)} crowds",
                                f"[] without a profile (set {name}.hourly or {name}.points; "
                                f"a constant rate is two points of multiplier 1)")
        return
    if hourly and points:
        raise WorkloadError(f"{name}.points", f"{len(points)} points",
                            f"[] when {name}.hourly is set (one form of profile)")
    if w.arrival not in ("poisson", "gamma"):
        raise WorkloadError(name, "set", f"unset with workload.arrival={w.arrival} (a profile "
                            "shapes poisson and gamma arrivals)")
    if getattr(w, "multi_turn", None) is not None and w.multi_turn.enabled:
        raise WorkloadError(name, "set", "unset with workload.multi_turn.enabled (sessions "
                            "start at a constant rate)")
    if not finite(w.rate):
        raise WorkloadError("workload.rate", w.rate, f"a finite number with {name} set")
    check_positive(f"{name}.hour_s", p.hour_s)
    if hourly:
        end = len(hourly) * float(p.hour_s)
        for i, x in enumerate(hourly):
            check_nonnegative(f"{name}.hourly[{i}]", x)
        weights = hourly
    else:
        if len(points) < 2:
            raise WorkloadError(f"{name}.points", f"{len(points)} point(s)",
                                "at least 2 {time_s, multiplier} points")
        for i, pt in enumerate(points):
            check_nonnegative(f"{name}.points[{i}].multiplier", pt.multiplier)
            if i == 0 and pt.time_s != 0:
                raise WorkloadError(f"{name}.points[0].time_s", pt.time_s,
                                    "must be 0 (the profile starts with the run)")
            if i and not (finite(pt.time_s) and pt.time_s > points[i - 1].time_s):
                raise WorkloadError(f"{name}.points[{i}].time_s", pt.time_s, "must be a finite "
                                    f"time > the previous point's {points[i - 1].time_s}")
        end = float(points[-1].time_s)
        weights = [pt.multiplier for pt in points]
    if end > MAX_TIME_S:
        raise WorkloadError(name, f"{end:g} s", f"a span of at most {MAX_TIME_S:g} s")
    if not any(x > 0 for x in weights):
        raise WorkloadError(name, "all 0", "at least one multiplier > 0 (no request would "
                            "arrive)")
    for i, c in enumerate(crowds):
        check_seconds(f"{name}.flash_crowds[{i}].start_s", c.start_s)
        check_positive(f"{name}.flash_crowds[{i}].duration_s", c.duration_s)
        check_nonnegative(f"{name}.flash_crowds[{i}].factor", c.factor)
    expected = RateProfile.from_config(p, float(w.rate)).expected_arrivals
    if expected > max_requests:
        raise WorkloadError(name, f"{expected:.4g} expected arrivals",
                            f"at most {max_requests:,} (lower workload.rate or the span)")


class RateProfile:
    """A rate ``r(t)`` (req/s) on ``[0, end)``, linear from ``left[i]`` to ``right[i]`` on
    segment ``[knots[i], knots[i+1])``."""

    def __init__(self, knots, left, right) -> None:
        self.knots = np.asarray(knots, float)
        self.left = np.asarray(left, float)
        self.right = np.asarray(right, float)
        mass = 0.5 * (self.left + self.right) * np.diff(self.knots)
        self._cum = np.concatenate([[0.0], np.cumsum(mass)])  # Λ at each knot

    @classmethod
    def from_config(cls, profile: Any, rate: float) -> RateProfile:
        """The rate of ``workload.rate_profile`` (checked by ``check_rate_profile``) scaled
        by ``rate``, flash crowds included."""
        if list(profile.hourly):
            w = np.asarray(list(profile.hourly), float) * rate
            base = cls(np.arange(len(w) + 1) * float(profile.hour_s), w, w)
        else:
            p = np.asarray([(pt.time_s, pt.multiplier) for pt in profile.points], float)
            base = cls(p[:, 0], p[:-1, 1] * rate, p[1:, 1] * rate)
        return base.with_crowds([(float(c.start_s), float(c.duration_s), float(c.factor))
                                 for c in profile.flash_crowds])

    @property
    def end(self) -> float:
        """The end of the span (s)."""
        return float(self.knots[-1])

    @property
    def expected_arrivals(self) -> float:
        """``Λ(end)``: the mean number of Poisson arrivals over the span."""
        return float(self._cum[-1])

    def _segment(self, t: np.ndarray) -> np.ndarray:
        return np.clip(np.searchsorted(self.knots, t, side="right") - 1, 0,
                       len(self.left) - 1)

    def rate(self, t) -> np.ndarray:
        """``r(t)`` (right-continuous at a step); 0 outside ``[0, end)``."""
        t = np.asarray(t, float)
        i = self._segment(t)
        a, b = self.knots[i], self.knots[i + 1]
        r = self.left[i] + (self.right[i] - self.left[i]) * (t - a) / (b - a)
        return np.where((t >= 0) & (t < self.end), r, 0.0)

    def cumulative(self, t) -> np.ndarray:
        """``Λ(t)``, the expected arrivals in ``[0, t)``; ``t`` clipped to the span."""
        t = np.clip(np.asarray(t, float), 0.0, self.end)
        i = self._segment(t)
        x = t - self.knots[i]
        slope = (self.right[i] - self.left[i]) / (self.knots[i + 1] - self.knots[i])
        return self._cum[i] + self.left[i] * x + 0.5 * slope * x * x

    def invert(self, y) -> np.ndarray:
        """The time ``t`` with ``Λ(t) = y`` for ``0 <= y < Λ(end)``: the root of the segment's
        quadratic, written ``2y / (r0 + sqrt(r0² + 2·slope·y))`` so that a flat segment
        (slope 0) and a rate rising from 0 are both exact."""
        y = np.asarray(y, float)
        # side="right" skips segments without mass, where Λ does not grow
        i = np.clip(np.searchsorted(self._cum, y, side="right") - 1, 0, len(self.left) - 1)
        width = self.knots[i + 1] - self.knots[i]
        r0, slope = self.left[i], (self.right[i] - self.left[i]) / width
        yy = y - self._cum[i]
        den = r0 + np.sqrt(np.maximum(r0 * r0 + 2.0 * slope * yy, 0.0))
        x = np.divide(2.0 * yy, den, out=np.zeros_like(yy), where=den > 0)
        return self.knots[i] + np.clip(x, 0.0, width)

    def with_crowds(self, crowds: list[tuple[float, float, float]]) -> RateProfile:
        """This rate multiplied by ``factor`` on ``[start, start + duration)`` for each
        ``(start, duration, factor)`` (overlapping crowds multiply)."""
        if not crowds:
            return self
        edges = [t for s, d, _ in crowds for t in (s, s + d) if 0.0 < t < self.end]
        knots = np.union1d(self.knots, edges)
        a, b = knots[:-1], knots[1:]
        i = self._segment(a)
        base_slope = (self.right[i] - self.left[i]) / (self.knots[i + 1] - self.knots[i])
        left = self.left[i] + base_slope * (a - self.knots[i])
        right = self.left[i] + base_slope * (b - self.knots[i])
        mid = 0.5 * (a + b)
        factor = np.ones(len(a))
        for s, d, k in crowds:
            factor[(mid >= s) & (mid < s + d)] *= k
        return RateProfile(knots, left * factor, right * factor)

    def arrivals(self, rng: np.random.Generator, cv: float = 1.0) -> np.ndarray:
        """Arrival times (s) over ``[0, end)``: a unit-rate renewal process (exponential gaps
        for ``cv == 1``, Gamma gaps of mean 1 and CV ``cv`` otherwise) through ``Λ⁻¹``."""
        total = self.expected_arrivals
        shape = 1.0 / cv**2

        def gaps(n: int) -> np.ndarray:
            return rng.exponential(1.0, n) if cv == 1.0 else rng.gamma(shape, 1.0 / shape, n)

        # a draw that almost surely covers the span; more only in the rare case it does not
        n = int(total + 8.0 * cv * np.sqrt(total) + 16)
        unit = np.cumsum(gaps(n))
        while unit[-1] < total:
            unit = np.concatenate([unit, unit[-1] + np.cumsum(gaps(n))])
        return self.invert(unit[unit < total])
