"""Shape-dependent efficiencies: a scale times smooth tables over shape variables.

The calibrated files store each operator family's efficiency as ``Eta`` (``scale × Π Term``),
tables interpolated linearly in log2 of the shape variables; ``sim.cost.operators`` evaluates
them and ``calibration`` fits them.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import numpy as np

from sim.cost.eta_plan import TablePlan
from sim.cost.memo import Memo


def _sig(x, digits: int = 5):
    """Round to ``digits`` significant digits (keeps calibrated files short and stable)."""
    return float(f"{float(x):.{digits}g}")


def knot_cell(log2x: np.ndarray, knots: np.ndarray):
    """Left knot index and weight of the right knot for linear interpolation, clamped (the
    calibration builds its fitting bases with this too)."""
    # np.minimum/np.maximum: np.clip's dispatch overhead dominates on the small arrays of a step
    x = np.minimum(np.maximum(log2x, knots[0]), knots[-1])
    i = np.minimum(np.maximum(np.searchsorted(knots, x, side="right") - 1, 0),
                   max(len(knots) - 2, 0))
    if len(knots) == 1:
        return i, np.zeros_like(x)
    return i, (x - knots[i]) / (knots[i + 1] - knots[i])


_SCALARS = (int, float, np.integer, np.floating)


def scalar_cell(x, kn: list) -> tuple[int, int, float]:
    """(left knot, right knot, weight of the right one) of a scalar ``x`` among the log2
    knots ``kn`` (a list of floats), clamped; x ≤ 0 sits at the first knot."""
    last = len(kn) - 1
    lx = math.log2(x) if x > 0 else kn[0]
    if lx <= kn[0] or last == 0:
        return 0, min(1, last), 0.0
    if lx >= kn[last]:
        return last - 1, last, 1.0
    i = bisect.bisect_right(kn, lx) - 1
    return i, i + 1, (lx - kn[i]) / (kn[i + 1] - kn[i])


def scalar_value(f: list, cells: list) -> float:
    """ln(factor) interpolated in a 1- or 2-axis table ``f`` (nested lists) at ``cells``."""
    if len(cells) == 1:
        (i, i1, w), = cells
        return f[i] * (1 - w) + f[i1] * w
    (i, i1, u), (j, j1, v) = cells
    return ((1 - u) * ((1 - v) * f[i][j] + v * f[i][j1])
            + u * ((1 - v) * f[i1][j] + v * f[i1][j1]))


MEMO_SIZE = 4096  # remembered scalar points per term


@dataclass(frozen=True, eq=False)
class Term:
    """One smooth factor of an efficiency: a table over one or two shape variables (``axes``)
    at ``log2_knots``, interpolated linearly in log2 of the variables and in log of the factor,
    constant beyond the outer knots. ``log_factor`` holds ln(factor) at the knots."""

    axes: tuple[str, ...]
    log2_knots: tuple[np.ndarray, ...]
    log_factor: np.ndarray

    def __post_init__(self) -> None:
        # plain-Python copies for the scalar path (the simulator prices one step at a time)
        object.__setattr__(self, "_kn", [list(map(float, k)) for k in self.log2_knots])
        object.__setattr__(self, "_f", np.asarray(self.log_factor, dtype=float).tolist())
        object.__setattr__(self, "_memo", Memo(MEMO_SIZE))

    def __call__(self, shape: dict) -> np.ndarray:
        """ln(factor) at the shape variables ``shape[axis]`` (scalars or arrays)."""
        xs = [shape[a] for a in self.axes]
        if all(isinstance(x, _SCALARS) for x in xs):
            return self._scalar(xs)
        cells = [knot_cell(np.log2(np.asarray(x, dtype=np.float64)), kn)
                 for x, kn in zip(xs, self.log2_knots, strict=True)]
        f = self.log_factor
        if len(cells) == 1:
            (i, w), = cells
            return f[i] * (1 - w) + f[np.minimum(i + 1, len(f) - 1)] * w
        (i, u), (j, v) = cells
        i1, j1 = np.minimum(i + 1, f.shape[0] - 1), np.minimum(j + 1, f.shape[1] - 1)
        return ((1 - u) * ((1 - v) * f[i, j] + v * f[i, j1])
                + u * ((1 - v) * f[i1, j] + v * f[i1, j1]))

    def scalar(self, xs: tuple) -> float:
        """ln(factor) at scalar shape variables ``xs`` (in ``axes`` order), remembered: a
        step's GEMM and per-batch attention variables recur all the time. Equal keys give
        equal results (``int``/``float`` keys compare by exact value), so the memo changes
        nothing; it is emptied when full, which bounds its memory."""
        return self._memo.get_or(xs, lambda: self._scalar(xs))

    def _scalar(self, xs) -> float:
        return scalar_value(self._f, [scalar_cell(x, kn)
                                      for x, kn in zip(xs, self._kn, strict=True)])

    @classmethod
    def from_dict(cls, d: dict) -> Term:
        """From ``{axes, log2_knots, factor}`` (factor: nested lists, one level per axis)."""
        axes = tuple(d["axes"])
        knots = tuple(np.asarray(k, dtype=np.float64) for k in d["log2_knots"])
        factor = np.asarray(d["factor"], dtype=np.float64)
        if len(axes) not in (1, 2) or len(knots) != len(axes) or factor.shape != tuple(
                len(k) for k in knots) or np.any(factor <= 0):
            raise ValueError(f"efficiency term over {axes}: need 1 or 2 axes, one knot list "
                             f"per axis and a positive factor table of matching shape")
        return cls(axes, knots, np.log(factor))

    def to_dict(self) -> dict:
        """The mapping ``from_dict`` reads (factors to 5 significant digits)."""
        factor = np.vectorize(_sig)(np.exp(self.log_factor))
        return {"axes": list(self.axes),
                "log2_knots": [[_sig(v) for v in k] for k in self.log2_knots],
                "factor": factor.tolist()}


class ScalarPlan:
    """Evaluates ``etas`` together at scalar shape variables, as ``Eta.reference``'s scalar
    path does term by term, but finding each distinct (variable, knots) cell once (a GEMM's
    compute and memory η share their m, n and k cells)."""

    def __init__(self, etas: tuple[Eta, ...]) -> None:
        cells: dict = {}
        self.terms = []  # (cell rows, table as nested lists)
        self.etas = []  # (scale, term rows, whether it has terms)
        for eta in etas:
            rows = []
            for t in eta.terms:
                rows.append(len(self.terms))
                self.terms.append(([cells.setdefault((a, tuple(kn)), len(cells))
                                    for a, kn in zip(t.axes, t._kn, strict=True)], t._f))
            self.etas.append((eta.scale, rows, bool(eta.terms)))
        self.cells = [(a, list(kn)) for a, kn in cells]

    def __call__(self, shape: dict) -> list:
        """Each eta's value at ``shape``, equal to its ``reference``."""
        cells = [scalar_cell(shape[a], kn) for a, kn in self.cells]
        values = [scalar_value(f, [cells[c] for c in cs]) for cs, f in self.terms]
        out = []
        for scale, rows, has_terms in self.etas:
            if not has_terms:
                out.append(scale)
                continue
            log = 0.0
            for r in rows:
                log = log + values[r]
            out.append(scale * math.exp(log))
        return out


@dataclass(frozen=True, eq=False)
class Eta:
    """An efficiency (fraction of a peak) that varies with the shape: ``scale × Π term``.

    In a calibrated file it is either a number (constant) or ``{scale, terms: [...]}``.
    """

    scale: float
    terms: tuple[Term, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "_plans", {})

    def __call__(self, **shape) -> np.ndarray:
        """η at the shape variables (keyword arguments named like the terms' axes); equal
        bit for bit to ``reference``, faster (``sim.cost.eta_plan``)."""
        return evaluate((self,), shape)[0]

    def reference(self, **shape) -> np.ndarray:
        """η evaluated term by term: the definition ``__call__`` reproduces exactly."""
        if not self.terms:
            return self.scale
        log = 0.0
        for t in self.terms:
            log = log + t(shape)
        return self.scale * (math.exp(log) if isinstance(log, float) else np.exp(log))

    def fix(self, **values) -> Eta:
        """This η with the shape variables ``values`` fixed (e.g. a model's query heads per KV
        head): each term over one of them becomes a term over its other axis (interpolated
        across the fixed one) or, over only fixed ones, a constant in the scale. Equal to
        evaluating this η with those values, up to rounding."""
        if not any(a in values for t in self.terms for a in t.axes):
            return self
        log_scale, terms = 0.0, []
        for t in self.terms:
            free = [j for j, a in enumerate(t.axes) if a not in values]
            if len(free) == len(t.axes):
                terms.append(t)
                continue
            f = np.asarray(t.log_factor, dtype=np.float64)
            for j, a in reversed(list(enumerate(t.axes))):  # fixed axes, last first
                if a in values:
                    i, w = knot_cell(np.log2(np.asarray([values[a]], dtype=np.float64)),
                                     t.log2_knots[j])
                    i1 = min(int(i[0]) + 1, f.shape[j] - 1)
                    f = (np.take(f, int(i[0]), axis=j) * (1 - float(w[0]))
                         + np.take(f, i1, axis=j) * float(w[0]))
            if free:
                terms.append(Term(tuple(t.axes[j] for j in free),
                                  tuple(t.log2_knots[j] for j in free), f))
            else:
                log_scale += float(f)
        return Eta(self.scale * math.exp(log_scale), tuple(terms))

    @classmethod
    def from_dict(cls, d) -> Eta:
        """From a number or ``{scale, terms}``."""
        if isinstance(d, (int, float)):
            return cls(float(d))
        return cls(float(d["scale"]), tuple(Term.from_dict(t) for t in d.get("terms") or ()))

    def to_dict(self):
        """A number when constant, else ``{scale, terms}``."""
        if not self.terms:
            return _sig(self.scale)
        return {"scale": _sig(self.scale), "terms": [t.to_dict() for t in self.terms]}


def evaluate(etas: tuple[Eta, ...], shape: dict, points: frozenset | None = None) -> list:
    """The value of each of ``etas`` at the same shape variables, each equal bit for bit to
    its ``reference``: scalar terms through ``Term.scalar``, array-valued ones through one
    ``TablePlan`` for all of ``etas`` (e.g. the compute and memory η of one kernel).

    ``points`` names variables given as floats that stand for one-element arrays: the
    results are then floats equal to the reference's one-element arrays (one step priced
    without numpy's per-call cost)."""
    arrays = points or frozenset(a for a, x in shape.items() if not isinstance(x, _SCALARS))
    key = (etas, arrays)  # Eta hashes by identity; the key keeps them alive
    plans = etas[0]._plans
    plan = plans.get(key)
    if plan is None:
        plan = plans[key] = TablePlan(etas, arrays) if arrays else ScalarPlan(etas)
    if not arrays:
        return plan(shape)
    if points is not None:
        out = plan.point(shape) if plan.usable else None
        if out is None:  # the reference on one-element arrays
            one = {a: np.array([x], dtype=np.float64) if a in points else x
                   for a, x in shape.items()}
            out = [float(np.asarray(eta.reference(**one)).reshape(-1)[0]) for eta in etas]
        return out
    out = plan(shape) if plan.usable else None
    return out if out is not None else [eta.reference(**shape) for eta in etas]
