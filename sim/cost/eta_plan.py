"""Fast evaluation of efficiency tables on the simulator's hot path, bit for bit as ``Eta``'s
reference evaluation (``sim.cost.eta``).

The reference interpolates each ``Term`` on its own: terms whose shape variables are all
scalars in plain Python (``math.log2``), the others with a dozen small numpy calls per axis,
~0.1 ms per efficiency. A ``TablePlan`` evaluates the array-valued terms of one or more
``Eta`` (a kernel's compute and memory η) together: one ``np.log2`` over every variable, one
knot search per distinct (variable, knots) pair, then the interpolation, on Python floats for
one point (one step) or in a few numpy calls over all terms and points (a decode window),
with knot cells and table corners looked up in tables built once. Scalar-only terms go through
``Term.scalar`` (a bounded memo of the reference's scalar path). Every value takes the
reference's operations in the reference's order, and numpy's float64 ufuncs give an element
the same result wherever it sits in an array (``tests/sim/cost/test_fast_pricing.py`` checks
both), so the results are identical, not merely close.
"""

from __future__ import annotations

import math
from bisect import bisect_right

import numpy as np

MAX_PLANNED_POINTS = 8192  # beyond, the reference is as fast (memory-bound either way)


class TablePlan:
    """Evaluates the ``Eta``s ``etas`` together at shapes whose variables in ``array_axes``
    are arrays and all others scalars, exactly as ``Eta.reference`` (module doc).
    ``usable`` is False for tables it cannot take (the caller then uses the reference)."""

    def __init__(self, etas: tuple, array_axes: frozenset) -> None:
        self.etas = etas
        terms = []  # the array-valued terms, in order of appearance
        self.layout = []  # per eta: one (scalar Term, None) or (None, array term) per term
        for eta in etas:
            items = []
            for t in eta.terms:
                if any(a in array_axes for a in t.axes):
                    items.append((None, len(terms)))
                    terms.append(t)
                else:
                    items.append((t, None))
            self.layout.append(items)
        self.axes = list(dict.fromkeys(a for t in terms for a in t.axes))
        self.usable = bool(terms) and all(
            len(t.axes) in (1, 2) and np.shape(t.log_factor) == tuple(map(len, t.log2_knots))
            and all(len(k) for k in t.log2_knots) for t in terms)
        if not self.usable:
            return
        # per eta: the variables of its array terms (they set the shape of its value)
        self.eta_axes = [sorted({self.axes.index(a) for t, r in items if t is None
                                 for a in terms[r].axes}) for items in self.layout]
        unit = len(self.axes)  # a variable fixed at 1 (log2 = 0): the 2nd axis of 1-axis terms
        cells: dict = {}  # (variable, knots) -> cell row
        self.terms = []  # (cell row of axis 0, of axis 1, 2-D table)
        for t in terms:
            rows = [cells.setdefault((self.axes.index(a), tuple(map(float, kn))), len(cells))
                    for a, kn in zip(t.axes, t.log2_knots, strict=True)]
            if len(rows) == 1:
                rows.append(cells.setdefault((unit, (0.0,)), len(cells)))
            f = np.asarray(t.log_factor, dtype=np.float64)
            self.terms.append((rows[0], rows[1], f.reshape(len(f), -1)))
        self.cells = [(a, list(kn), max(len(kn) - 2, 0), kn[0], kn[-1], len(kn) > 1)
                      for a, kn in cells]
        self.py_terms = [(u, v, f.tolist(), f.shape[0] - 1, f.shape[1] - 1)
                         for u, v, f in self.terms]
        self._cell_tables()
        self._sum_tables()

    def _cell_tables(self) -> None:
        """For ``_vector``: each cell row's knot index, left knot and knot gap as a function of
        the position of x among all knots, and the four corners of every table entry."""
        knots = [np.array(kn) for _, kn, *_ in self.cells]
        self.merged = np.unique(np.concatenate(knots))
        width = len(self.merged) + 1
        # position m (searchsorted "right" in merged): merged[m-1] ≤ x < merged[m]
        edges = np.concatenate(([-np.inf], self.merged))
        ti, tk0, tdk = [], [], []
        for kn, (_, _, imax, *_) in zip(knots, self.cells, strict=True):
            i = np.minimum(np.maximum(np.searchsorted(kn, edges, side="right") - 1, 0), imax)
            ti.append(i)
            tk0.append(kn[i])
            # the reference's divisor (1 for one knot, where w is set to 0 instead)
            tdk.append(kn[i + 1] - kn[i] if len(kn) > 1 else np.ones(width))
        # every table padded to one width, so a corner's flat index is off + i·width + j
        tw = max(f.shape[1] for _, _, f in self.terms)
        tr = max(f.shape[0] for _, _, f in self.terms)
        self.ti, self.tk0, self.tdk = (np.concatenate(t) for t in (ti, tk0, tdk))
        self.tiw = self.ti * tw
        self.cell_axis = [a for a, *_ in self.cells]
        self.lo = np.array([[c[3]] for c in self.cells])
        self.hi = np.array([[c[4]] for c in self.cells])
        self.rowoff = (np.arange(len(self.cells), dtype=np.intp) * width)[:, None]
        single = [r for r, c in enumerate(self.cells) if not c[5]]
        self.single = np.array(single, dtype=np.intp) if single else None
        self.cu = np.array([u for u, _, _ in self.terms], dtype=np.intp)
        self.cv = np.array([v for _, v, _ in self.terms], dtype=np.intp)
        corners = np.zeros((4, len(self.terms), tr, tw))
        for t, (_, _, f) in enumerate(self.terms):
            i = np.arange(f.shape[0])[:, None]
            j = np.arange(f.shape[1])[None, :]
            i1, j1 = np.minimum(i + 1, f.shape[0] - 1), np.minimum(j + 1, f.shape[1] - 1)
            corners[:, t, :f.shape[0], :f.shape[1]] = [f[i, j], f[i, j1], f[i1, j], f[i1, j1]]
        self.corners = [c.ravel() for c in corners]  # f[i, j], f[i, j1], f[i1, j], f[i1, j1]
        self.off = (np.arange(len(self.terms), dtype=np.intp) * (tr * tw))[:, None]

    def _sum_tables(self) -> None:
        """For ``_vector``: each eta's terms as rows of [0, array terms…, scalar terms…],
        front-padded with the zero row to a common length (the reference starts at 0.0)."""
        self.vec_etas = [e for e, items in enumerate(self.layout)
                         if any(t is None for t, _ in items)]
        self.scalar_terms = [(t, t.axes) for items in self.layout for t, _ in items
                             if t is not None]
        order, s = [], 1 + len(self.terms)
        for e in self.vec_etas:
            rows = []
            for t, r in self.layout[e]:
                rows.append(1 + r if t is None else s)
                s += t is not None
            order.append(rows)
        n = max(len(r) for r in order)
        self.order = np.array([[0] * (n + 1 - len(r)) + r for r in order], dtype=np.intp)
        self.vec_scales = np.array([[self.etas[e].scale] for e in self.vec_etas])

    def __call__(self, shape: dict) -> list | None:
        """Each eta's value at ``shape``, as ``Eta.reference`` returns it; None where the
        shape is not one the plan takes (the caller then uses the reference)."""
        vals = [np.asarray(shape[a], dtype=np.float64) for a in self.axes]
        n = 0
        for v in vals:
            if v.ndim:
                if v.ndim > 1 or (n and len(v) != n):
                    return None  # broadcasting: left to the reference
                n = len(v)
        if n <= 1:
            return self._one(shape, vals)
        return self._vector(shape, vals, n) if n <= MAX_PLANNED_POINTS else None

    def _scalar_sum(self, shape: dict, items) -> float:
        """Σ of an eta's terms when all are scalar (the reference's scalar path)."""
        log = 0.0
        for t, _ in items:
            log = log + t.scalar(tuple([shape[a] for a in t.axes]))
        return log

    def _one_logs(self, shape: dict, xs: list) -> list | None:
        """Σ ln factor of each eta (None: it has no terms) at one point whose variables
        ``xs`` (in ``axes`` order) are floats: the reference's arithmetic on Python floats,
        with numpy's log2 as the reference's array terms use it."""
        logs = np.log2(xs + [1.0]).tolist()  # + the unit variable
        ci, ci1, cw = [], [], []
        for a, kn, imax, lo, hi, many in self.cells:
            x = logs[a]
            if x < lo:
                x = lo
            elif x > hi:
                x = hi
            elif x != x:
                return None  # NaN: numpy orders it its own way
            i = bisect_right(kn, x) - 1
            if i > imax:
                i = imax
            elif i < 0:
                i = 0
            if many:  # the table has a next row: i + 1 ≤ its last
                ci.append(i)
                ci1.append(i + 1)
                cw.append((x - kn[i]) / (kn[i + 1] - kn[i]))
            else:
                ci.append(0)
                ci1.append(0)
                cw.append(0.0)
        values = []
        for cu, cv, f, _, _ in self.py_terms:
            j, j1, u, v = ci[cv], ci1[cv], cw[cu], cw[cv]
            fi, fi1 = f[ci[cu]], f[ci1[cu]]
            values.append((1 - u) * ((1 - v) * fi[j] + v * fi[j1])
                          + u * ((1 - v) * fi1[j] + v * fi1[j1]))
        out = []
        for items in self.layout:
            log = 0.0 if items else None
            for t, r in items:
                log = log + (values[r] if t is None
                             else t.scalar(tuple([shape[a] for a in t.axes])))
            out.append(log)
        return out

    def point(self, shape: dict) -> list | None:
        """Each eta as a float, where the variables in ``array_axes`` are floats standing for
        one-element arrays: equal to the reference's one-element results."""
        sums = self._one_logs(shape, [float(shape[a]) for a in self.axes])
        if sums is None:
            return None
        exps = np.exp([s for s, a in zip(sums, self.eta_axes, strict=True) if a]).tolist()
        out = []
        for eta, log, axes in zip(self.etas, sums, self.eta_axes, strict=True):
            if log is None:
                out.append(eta.scale)
            elif axes:
                out.append(eta.scale * exps.pop(0))
            else:
                out.append(eta.scale * math.exp(log))
        return out

    def _one(self, shape: dict, vals: list) -> list | None:
        """One point given as 0-d or one-element arrays: each eta as the reference returns it
        (a one-element array where any of its array terms' variables has a shape)."""
        sums = self._one_logs(shape, [v.item(0) for v in vals])
        if sums is None:
            return None
        shaped = [any(vals[a].ndim for a in axes) for axes in self.eta_axes]
        exps = np.exp([s for s, sh in zip(sums, shaped, strict=True) if sh]).tolist()
        out = []
        for eta, log, sh in zip(self.etas, sums, shaped, strict=True):
            if log is None:
                out.append(eta.scale)
            elif sh:
                out.append(np.array([eta.scale * exps.pop(0)]))
            else:  # a float (or numpy float) sum: the reference exponentiates it in math
                out.append(eta.scale * math.exp(log))
        return out

    def _vector(self, shape: dict, vals: list, n: int) -> list:
        """Several points: every cell and term in a few numpy calls over all of them."""
        X = np.empty((len(self.cells), n))
        for r, a in enumerate(self.cell_axis):
            X[r] = vals[a] if a < len(vals) else 1.0  # (the unit variable)
        x = np.minimum(np.maximum(np.log2(X), self.lo), self.hi)
        pos = np.searchsorted(self.merged, x, side="right") + self.rowoff
        k0 = self.tk0.take(pos)
        w = (x - k0) / self.tdk.take(pos)
        if self.single is not None:  # one knot: the reference takes w = 0 without dividing
            w[self.single] = 0.0
        idx = self.tiw.take(pos).take(self.cu, 0) + self.ti.take(pos).take(self.cv, 0)
        idx += self.off
        f00, f01, f10, f11 = (c.take(idx) for c in self.corners)
        u, v = w.take(self.cu, 0), w.take(self.cv, 0)
        v1 = 1 - v
        rows = np.empty((1 + len(self.terms) + len(self.scalar_terms), n))
        rows[0] = 0.0
        rows[1:1 + len(self.terms)] = (1 - u) * (v1 * f00 + v * f01) + u * (v1 * f10 + v * f11)
        if self.scalar_terms:
            rows[1 + len(self.terms):] = np.array(
                [t.scalar(tuple([shape[a] for a in axes])) for t, axes in self.scalar_terms]
            )[:, None]
        # left to right, the reference's ((0 + t1) + t2) + … (a sum would pair them up)
        z = rows.take(self.order, 0)
        logs = z[:, 0]
        for j in range(1, z.shape[1]):
            logs = logs + z[:, j]
        etas = self.vec_scales * np.exp(logs)
        out = []
        for eta, items, axes in zip(self.etas, self.layout, self.eta_axes, strict=True):
            if not items:
                out.append(eta.scale)
            elif not axes:
                out.append(eta.scale * math.exp(self._scalar_sum(shape, items)))
            else:
                row = self.vec_etas.index(len(out))
                if any(vals[a].ndim for a in axes):
                    out.append(etas[row])
                else:  # all its variables 0-d: the reference's sum is a float, math's exp
                    out.append(eta.scale * math.exp(logs[row, 0]))
        return out
