"""The fitting engine: smooth efficiency tables, held-out split, error statistics.

An efficiency ``Eta`` (``sim.cost.operators``) is ``scale × Π term``, each term a table of
log-factors at knots in log2 of one or two shape variables. For given shapes, ln η is linear
in the log-factors (``TableBasis.matrix``), so a roofline ``max(A/η_c, B/η_m) + launch`` has a
sparse, exact Jacobian and ``scipy.optimize.least_squares`` fits hundreds of table entries to
tens of thousands of rows in seconds. A second-difference penalty keeps the tables smooth, so
held-out shapes between the knots are interpolated, not memorised.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pandas as pd
import scipy.sparse as sp
from scipy.optimize import least_squares

from sim.cost.eta import Eta, Term, knot_cell

LOSS_SCALE = 0.05  # soft-L1 transition in log-residual units: rows off by >5% count linearly


@dataclass(frozen=True)
class TableSpec:
    """Axes and knots (log2) of one smooth term, before its values are fitted."""

    axes: tuple[str, ...]
    log2_knots: tuple[tuple[float, ...], ...]

    @property
    def size(self) -> int:
        """Number of table entries."""
        return int(np.prod([len(k) for k in self.log2_knots]))


def knots(lo: float, hi: float, step: float = 2.0) -> tuple[float, ...]:
    """Evenly spaced log2 knots from ``lo`` to at least ``hi``."""
    n = int(np.ceil((hi - lo) / step - 1e-9)) + 1
    return tuple(float(lo + i * step) for i in range(max(n, 1)))


class TableBasis:
    """The linear map from table entries to ln η for a list of ``TableSpec`` terms."""

    def __init__(self, specs: list[TableSpec]) -> None:
        self.specs = specs
        self.offsets = np.cumsum([0] + [s.size for s in specs])

    @property
    def size(self) -> int:
        """Number of parameters (all tables' entries)."""
        return int(self.offsets[-1])

    def matrix(self, shape: dict) -> sp.csr_matrix:
        """Sparse (rows × size) matrix M with ``M @ params == ln η`` at ``shape``."""
        n = len(np.asarray(next(iter(shape.values()))).reshape(-1))
        blocks = []
        for spec in self.specs:
            cols, weights = [np.zeros(n, dtype=np.int64)], [np.ones(n)]
            stride = spec.size
            for axis, kn in zip(spec.axes, spec.log2_knots, strict=True):
                kn = np.asarray(kn)
                stride //= len(kn)
                x = np.broadcast_to(np.log2(np.asarray(shape[axis], dtype=np.float64)), (n,))
                i, w = knot_cell(x, kn)
                i1 = np.minimum(i + 1, len(kn) - 1)
                cols = [c + j * stride for c in cols for j in (i, i1)]
                weights = [wt * f for wt in weights for f in (1 - w, w)]
            data = np.concatenate(weights)
            rows = np.tile(np.arange(n), len(cols))
            blocks.append(sp.csr_matrix((data, (rows, np.concatenate(cols))),
                                        shape=(n, spec.size)))
        return sp.hstack(blocks, format="csr")

    def penalty(self) -> sp.csr_matrix:
        """Second differences of ln-factor along every axis of every table."""
        blocks = []
        for spec in self.specs:
            dims = [len(k) for k in spec.log2_knots]
            rows = []
            for a, d in enumerate(dims):
                if d < 3:
                    continue
                d2 = sp.diags([1.0, -2.0, 1.0], [0, 1, 2], shape=(d - 2, d))
                eyes = [sp.identity(dd) if b != a else d2 for b, dd in enumerate(dims)]
                m = eyes[0]
                for e in eyes[1:]:
                    m = sp.kron(m, e)
                rows.append(m)
            blocks.append(sp.vstack(rows) if rows else sp.csr_matrix((0, spec.size)))
        return sp.block_diag(blocks, format="csr")

    def eta(self, params: np.ndarray) -> Eta:
        """The ``Eta`` of fitted parameters, each table 1 at its largest-shape corner, so the
        scale reads as the efficiency of large shapes and the factors as the losses below."""
        terms, log_scale = [], 0.0
        for spec, a, b in zip(self.specs, self.offsets[:-1], self.offsets[1:], strict=True):
            v = np.asarray(params[a:b], dtype=np.float64)
            log_scale += v[-1]
            table = (v - v[-1]).reshape([len(k) for k in spec.log2_knots])
            terms.append(Term(spec.axes, tuple(np.asarray(k) for k in spec.log2_knots), table))
        return Eta(float(np.exp(log_scale)), tuple(terms))


def fit_roofline_tables(a, b, y, Xc, Xm, penalty_c, penalty_m, smoothing: float, Z=None,
                        z0_s: float = 3e-6):
    """Fit ``max(a·e^{−Xc·pc}, b·e^{−Xm·pm}) + Z·c`` to ``y`` in log space.

    ``a``/``b`` are the compute and memory times at η = 1 (``a is None``: memory roof only);
    ``Xc``/``Xm`` the sparse table bases; ``Z`` (rows × J, default one column of ones: a launch
    latency) the additive overhead features whose non-negative coefficients ``c`` (seconds per
    unit) are fitted too. Returns ``(pc, pm, c)``.
    """
    n = len(y)
    Z = np.ones((n, 1)) if Z is None else np.asarray(Z, dtype=np.float64).reshape(n, -1)
    nz = Z.shape[1]
    nc = 0 if a is None else Xc.shape[1]
    nm = Xm.shape[1]
    lam = smoothing * np.sqrt(n / 1000.0)
    pens = [p for p in ((penalty_c if nc else None), penalty_m) if p is not None]
    P = sp.block_diag(pens + [sp.csr_matrix((0, nz))], format="csr") * lam
    ridge = sp.hstack([sp.identity(nc + nm) * (lam * 1e-3), sp.csr_matrix((nc + nm, nz))])
    logy = np.log(y)
    Zs = Z * 1e-6  # coefficients in microseconds per unit keep the parameters O(1)

    def parts(p):
        tm = b * np.exp(-(Xm @ p[nc:nc + nm]))
        tc = a * np.exp(-(Xc @ p[:nc])) if nc else np.zeros(n)
        return tc, tm, np.maximum(tc, tm) + Zs @ p[nc + nm:]

    def res(p):
        return np.concatenate([np.log(parts(p)[2]) - logy, P @ p, ridge @ p])

    def jac(p):
        tc, tm, t = parts(p)
        wc, wm = (tc >= tm) * tc / t, (tc < tm) * tm / t
        cols = [sp.diags(-wm) @ Xm, sp.csr_matrix(Zs / t[:, None])]
        if nc:
            cols.insert(0, sp.diags(-wc) @ Xc)
        return sp.vstack([sp.hstack(cols), P, ridge], format="csr")

    x0 = np.zeros(nc + nm + nz)
    x0[nc + nm] = z0_s * 1e6
    lo, hi = np.full(len(x0), -12.0), np.full(len(x0), 6.0)
    lo[nc + nm:], hi[nc + nm:] = 0.0, 1e4
    x0 = np.clip(x0, lo, hi)
    r = least_squares(res, x0, jac=jac, bounds=(lo, hi), method="trf", tr_solver="lsmr",
                      loss="soft_l1", f_scale=LOSS_SCALE, x_scale="jac", max_nfev=200)
    return r.x[:nc], r.x[nc:nc + nm], r.x[nc + nm:] * 1e-6


def held_out_mask(df: pd.DataFrame, keys: list[str], fraction: float, seed: int) -> np.ndarray:
    """True for rows whose shape (the ``keys`` columns) is held out: a seeded hash of the shape
    falls below ``fraction``. Whole shapes are held out, never single rows of a shape, and the
    choice depends on the shape alone, so ``check`` finds the same shapes in any table."""
    shapes = df[keys].drop_duplicates()
    digest = [hashlib.sha256(f"{seed}|{'|'.join(map(str, row))}".encode()).digest()[:8]
              for row in shapes.itertuples(index=False)]
    u = np.array([int.from_bytes(d, "big") for d in digest], dtype=np.float64) / 2.0**64
    chosen = shapes[u < fraction]
    merged = df[keys].merge(chosen.assign(_held=True), on=keys, how="left")["_held"]
    return merged.fillna(False).to_numpy(bool)


def subsample(mask: np.ndarray, max_rows: int, seed: int) -> np.ndarray:
    """Indices of at most ``max_rows`` rows where ``mask`` is true (seeded, sorted)."""
    idx = np.flatnonzero(mask)
    if len(idx) > max_rows:
        idx = np.sort(np.random.default_rng(seed).choice(idx, max_rows, replace=False))
    return idx


def error_stats(pred, meas) -> dict:
    """Absolute percentage error statistics of predictions against measurements."""
    pred, meas = np.asarray(pred, dtype=np.float64), np.asarray(meas, dtype=np.float64)
    if len(meas) == 0:
        return {"rows": 0, "median_ape_pct": None, "mean_ape_pct": None, "p90_ape_pct": None}
    ape = np.abs(pred / meas - 1.0) * 100
    return {
        "rows": int(len(ape)),
        "median_ape_pct": round(float(np.median(ape)), 2),
        "mean_ape_pct": round(float(np.mean(ape)), 2),
        "p90_ape_pct": round(float(np.percentile(ape, 90)), 2),
    }


def signed_error_summary(err_pct) -> dict:
    """n, median and p90 absolute error and the signed median of signed % errors ``err_pct``
    (rounded to 0.1; None with no error to summarise), as the calibrated files record them.
    ``n`` counts every row; the statistics leave missing (NaN) errors out, as pandas' median
    and quantile do."""
    e = np.asarray(err_pct, dtype=np.float64)
    n, e = len(e), e[~np.isnan(e)]
    if len(e) == 0:
        return {"n": n, "median_abs_pct": None, "p90_abs_pct": None, "signed_median_pct": None}
    return {"n": n, "median_abs_pct": round(float(np.median(np.abs(e))), 1),
            "p90_abs_pct": round(float(np.quantile(np.abs(e), 0.9)), 1),
            "signed_median_pct": round(float(np.median(e)), 1)}
