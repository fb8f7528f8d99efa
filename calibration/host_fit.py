"""Fit of the per-step host costs per backend (``validate fit_host=true``).

The cost model charges ``host.overhead_ms + per_seq_us × sequences + per_new_request_us × new
requests + per_token_us × scheduled tokens`` to every step (``sim.cost.host``: scheduling and
input preparation). In a closed-loop fixed-length run the schedule does not depend on step
durations, so where that time adds to every step a row's steady-state TTFT and TPOT are exactly
linear in the four coefficients: ``pred = base + Σ_k coefficient_k · scale_k · terms_k``, the
terms being the steps, sequence-steps, new-request-steps and token-steps inside the span, read
from one simulation (``calibration.silicon_replay.host_terms``). Under an overlap scheduler
(SGLang's and TensorRT-LLM's defaults, vLLM's ``--async-scheduling``) a step takes
max(GPU, host + kernel launches): only host time that outlasts the GPU's work shows, so a row
is modelled step by step instead (``silicon_replay.step_profile``: each distinct step's GPU
time, its kernel launches, its terms and its weight in the means), exact as long as the
schedule does not move. The fit is a ``scipy.optimize.least_squares`` on the
relative errors of TTFT and TPOT of a backend's training rows (soft-L1 loss, so a few rows the
model cannot explain do not dominate); whole configurations — (model, isl, osl, tp) groups —
are held out. The fitted values are then checked with real simulations of every row, and
written into the ``host:`` block of ``sim/cost/calibrated/<hardware>/<backend>.yaml``.
"""

from __future__ import annotations

from datetime import date
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from scipy.optimize import least_squares

from analysis.files import write_text
from sim.cost.host import KEYS

METRICS = ("ttft", "tpot")
GROUP = ["model", "isl", "osl", "tp"]
# per coefficient of ``sim.cost.host.KEYS``: the span term it multiplies, its unit in ms, and
# a bound far above any measured engine
TERMS = ("steps", "seq_steps", "new_steps", "token_steps")
TO_MS = np.array([1.0, 1e-3, 1e-3, 1e-3])
UPPER = np.array([20.0, 500.0, 5000.0, 50.0])
TYPICAL = np.array([1.0, 10.0, 100.0, 1.0])  # least_squares' x_scale


def held_out(table: pd.DataFrame, fraction: float, seed: int) -> np.ndarray:
    """Boolean mask of held-out rows: per backend, a seeded ``fraction`` of its distinct
    (model, isl, osl, tp) groups (at least one when it has two or more), drawn for each
    backend alone, so a backend's split does not depend on which others the table holds."""
    mask = np.zeros(len(table), dtype=bool)
    keys = table[GROUP].astype(str).agg("|".join, axis=1)
    for backend in sorted(table["backend"].unique()):
        rng = np.random.default_rng(seed)
        sel = (table["backend"] == backend).to_numpy()
        groups = np.array(sorted(keys[sel].unique()))
        k = int(round(fraction * len(groups)))
        k = max(k, 1) if len(groups) >= 2 else 0
        out = rng.choice(groups, size=k, replace=False) if k else []
        mask |= sel & keys.isin(out).to_numpy()
    return mask


def term_columns() -> list[str]:
    """The per-row span terms the linear model reads (``<metric>_<term>``)."""
    return [f"{m}_{k}" for m in METRICS for k in TERMS]


def linear_predictions(rows: pd.DataFrame, current, host) -> dict[str, np.ndarray]:
    """Each row's TTFT/TPOT (ms) with ``host`` (the ``sim.cost.host.KEYS`` coefficients)
    instead of the ``current`` values it was simulated with, host time adding to every step."""
    d = (np.asarray(host, dtype=float) - np.asarray(current, dtype=float)) * TO_MS
    return {m: rows[f"pred_{m}_ms"].to_numpy()
            + sum(d[i] * rows[f"{m}_{k}"].to_numpy() for i, k in enumerate(TERMS))
            for m in METRICS}


def adds_to_every_step(rows: pd.DataFrame) -> np.ndarray:
    """Whether each row's host time adds to every step (``RowSimulator.run``'s ``host_adds``;
    a table without the column: yes)."""
    if "host_adds" not in rows:
        return np.ones(len(rows), dtype=bool)
    return rows["host_adds"].fillna(True).to_numpy(bool)


class StepStack:
    """The step profiles (``silicon_replay.step_profile``) of the rows of ``rows`` whose host
    time does not add to every step, stacked for vectorized predictions."""

    def __init__(self, rows: pd.DataFrame, profiles: dict[str, pd.DataFrame]) -> None:
        ids = rows["id"].to_numpy()
        self.rows = ~adds_to_every_step(rows)
        missing = [i for i, r in zip(ids, self.rows, strict=True) if r and i not in profiles]
        if missing:
            raise ValueError(f"row {missing[0]}: its host time does not add to every step and "
                             f"it has no step profile to model it with")
        parts = [profiles[i].assign(row=j) for j, i in enumerate(ids) if self.rows[j]]
        p = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
            columns=[*TERMS, "gpu_ms", "launch_ms", "host_ms", "w_ttft", "w_tpot", "row"])
        self.terms = p[list(TERMS)].to_numpy(float)
        self.gpu, self.launch = p["gpu_ms"].to_numpy(float), p["launch_ms"].to_numpy(float)
        self.host, self.row = p["host_ms"].to_numpy(float), p["row"].to_numpy(int)
        self.w = {m: p[f"w_{m}"].to_numpy(float) for m in METRICS}

    def shifts(self, host, n: int) -> dict[str, np.ndarray]:
        """Per row (``n`` of them) and metric, how much the mean moves (ms) when each step's
        shown host time becomes max(0, host + launches − GPU) with the coefficients ``host``."""
        shown = np.maximum(self.terms @ (np.asarray(host, dtype=float) * TO_MS) + self.launch
                           - self.gpu, 0.0)
        return {m: np.bincount(self.row, weights=self.w[m] * (shown - self.host), minlength=n)
                for m in METRICS}


def predictions(rows: pd.DataFrame, current, host,
                profiles: dict[str, pd.DataFrame] | StepStack | None = None
                ) -> dict[str, np.ndarray]:
    """Each row's TTFT/TPOT (ms) with ``host`` instead of the ``current`` values it was
    simulated with: linear where host time adds to every step, through its step profile (in
    ``profiles``, by row id) where a step takes max(GPU, host + launches)."""
    pred = linear_predictions(rows, current, host)
    stack = profiles if isinstance(profiles, StepStack) else StepStack(rows, profiles or {})
    if stack.rows.any():
        shift = stack.shifts(host, len(rows))
        for m in METRICS:
            pred[m] = np.where(stack.rows, rows[f"pred_{m}_ms"].to_numpy() + shift[m], pred[m])
    return pred


def abs_errors(pred: dict[str, np.ndarray], rows: pd.DataFrame) -> dict:
    """``{metric: {n, median_abs_pct_error, p90_abs_pct_error, signed_median_pct_error}}``."""
    out = {}
    for m in METRICS:
        err = (pred[m] / rows[f"meas_{m}_ms"].to_numpy() - 1.0) * 100
        err = err[np.isfinite(err)]
        ape = np.abs(err)
        out[m] = {"n": int(len(ape)),
                  "median_abs_pct_error": round(float(np.median(ape)), 2) if len(ape) else None,
                  "p90_abs_pct_error": round(float(np.percentile(ape, 90)), 2) if len(ape)
                  else None,
                  "signed_median_pct_error": round(float(np.median(err)), 2) if len(err)
                  else None}
    return out


def fit_host(rows: pd.DataFrame, current, free=KEYS,
             profiles: dict[str, pd.DataFrame] | None = None) -> tuple[float, ...] | None:
    """The ``sim.cost.host.KEYS`` coefficients minimizing the soft-L1 relative error of TTFT
    and TPOT (``predictions``); those not in ``free`` stay at their ``current`` values. None
    when no fit does better than the ``current`` values (the rows do not identify them: host
    time that hides under every step's GPU time moves nothing)."""
    ok = rows[term_columns()].notna().all(axis=1)
    rows = rows[ok & rows["pred_ttft_ms"].notna()].reset_index(drop=True)
    if rows.empty:
        raise ValueError("no simulated training rows to fit the host overhead on")
    current = np.asarray(current, dtype=float)
    mask = np.array([k in free for k in KEYS])
    stack = StepStack(rows, profiles or {})
    f_scale = 0.1

    def full(x):
        h = current.copy()
        h[mask] = x
        return h

    def residuals(x):
        pred = predictions(rows, current, full(x), stack)
        return np.concatenate([pred[m] / rows[f"meas_{m}_ms"].to_numpy() - 1.0
                               for m in METRICS])

    def cost(x):  # least_squares' soft-L1 cost
        z = (residuals(x) / f_scale) ** 2
        return float(0.5 * f_scale**2 * np.sum(2 * (np.sqrt(1 + z) - 1)))

    # from a start where the host time hides everywhere the gradient is zero: start also from
    # typical and ten-fold typical values
    best = None
    for x0 in (current[mask], TYPICAL[mask], 10 * TYPICAL[mask]):
        res = least_squares(residuals, np.clip(x0, 0.0, UPPER[mask]),
                            bounds=(np.zeros(mask.sum()), UPPER[mask]), loss="soft_l1",
                            f_scale=f_scale, x_scale=TYPICAL[mask])
        if best is None or res.cost < best.cost:
            best = res
    if best.cost >= cost(current[mask]) * (1 - 1e-6):
        return None
    return tuple(float(v) for v in full(best.x))


def fitted_rows(table: pd.DataFrame, profiles: dict[str, pd.DataFrame] | None = None
                ) -> pd.DataFrame:
    """The rows a host fit can use: simulated aggregated rows whose host time adds to every
    step, or that have a step profile (a disaggregated row's KV transfers make its schedule
    depend on step durations)."""
    usable = adds_to_every_step(table) | table["id"].isin(list(profiles or {})).to_numpy()
    return table[table["pred_ttft_ms"].notna().to_numpy() & (table["mode"] == "agg").to_numpy()
                 & usable].reset_index(drop=True)


def fit_backends(table: pd.DataFrame, current: dict[str, tuple[float, ...]],
                 fraction: float, seed: int, free=KEYS,
                 profiles: dict[str, pd.DataFrame] | None = None
                 ) -> tuple[dict, dict[str, str]]:
    """Per backend: the fitted host values and the fit's model's train and held-out errors;
    and the backends with simulated rows left unfitted, with why. ``table`` holds every row
    simulated with the ``current`` host values of its backend, and ``profiles`` the step
    profiles of those whose host time does not add (``fitted_rows`` says which enter)."""
    done = fitted_rows(table, profiles)
    hold = held_out(done, fraction, seed)
    fits, skipped = {}, {}
    for backend in sorted(table.loc[table["pred_ttft_ms"].notna(), "backend"].unique()):
        sel = (done["backend"] == backend).to_numpy()
        train = done[sel & ~hold].reset_index(drop=True)
        test = done[sel & hold].reset_index(drop=True)
        if not sel.any():
            skipped[backend] = ("no aggregated row to fit on whose host time adds to every "
                                "step or that has a step profile; the calibrated values are kept")
            continue
        if train.empty:
            skipped[backend] = "every row is held out; the calibrated values are kept"
            continue
        h = fit_host(train, current[backend], free, profiles)
        if h is None:
            skipped[backend] = ("no fit does better than the calibrated values (host time that "
                                "hides under the GPU's moves nothing): they are kept")
            continue
        fits[backend] = {
            **{k: round(v, 4) for k, v in zip(KEYS, h, strict=True)}, "fitted_keys": list(free),
            "train_ids": train["id"].tolist(), "held_out_ids": test["id"].tolist(),
            "model": {split: abs_errors(predictions(rows, current[backend], h, profiles), rows)
                      for split, rows in (("train", train), ("held_out", test))},
        }
    return fits, skipped


def coefficients(f: dict) -> tuple[float, ...]:
    """A fit's (or host block's) ``KEYS`` coefficients, 0 for a key it lacks."""
    return tuple(float(f.get(k, 0.0)) for k in KEYS)


def verify(fits: dict, table: pd.DataFrame, before: pd.DataFrame,
           current: dict[str, tuple[float, ...]],
           profiles: dict[str, pd.DataFrame] | None = None) -> None:
    """Add the errors of the real simulations with the fitted values (``table``), per split,
    and the largest gap between them and the fit's model (from ``before`` and ``profiles``)."""
    for backend, f in fits.items():
        for split, ids in (("train", f["train_ids"]), ("held_out", f["held_out_ids"])):
            rows = table.set_index("id").loc[ids].reset_index()
            pred = {m: rows[f"pred_{m}_ms"].to_numpy() for m in METRICS}
            f.setdefault("simulated", {})[split] = abs_errors(pred, rows)
        ids = f["train_ids"] + f["held_out_ids"]
        model = predictions(before.set_index("id").loc[ids].reset_index(), current[backend],
                            coefficients(f), profiles)
        sim = table.set_index("id").loc[ids]
        f["max_model_gap_pct"] = round(float(max(
            np.nanmax(np.abs(model[m] / sim[f"pred_{m}_ms"].to_numpy() - 1.0)) * 100
            for m in METRICS)), 6)


def host_block(f: dict, fraction: float, seed: int, csv: str, harness: str = "") -> dict:
    """The ``host:`` block written into the calibrated file (``harness``: how the rows were
    simulated, e.g. ``burst, 10 requests per client``)."""
    return {
        **{k: f[k] for k in KEYS}, "fitted": True,
        "fitted_on": date.today().isoformat(),
        "method": "python -m calibration validate fit_host=true: scipy least_squares "
                  "(soft-L1) on relative TTFT and TPOT errors of closed-loop silicon rows "
                  "(linear where host time adds to every step, step profiles under an "
                  "overlap scheduler)",
        "data": Path(csv).name,
        **({"harness": harness} if harness else {}),
        "fitted_keys": f.get("fitted_keys", list(KEYS)),
        "split": f"{fraction:.0%} of the backend's (model, isl, osl, tp) groups held out, "
                 f"seed {seed}",
        "rows": {"train": len(f["train_ids"]), "held_out": len(f["held_out_ids"])},
        "train_ids": f["train_ids"],
        "errors": f.get("simulated", f["model"]),
    }


def write_host(path: Path, block: dict) -> None:
    """Replace the ``host:`` block of ``path`` (``write_block``)."""
    write_block(path, "host", block)


def write_block(path: Path, key: str, block: dict) -> None:
    """Replace the top-level ``key:`` block (the key and its indented lines) of ``path``, or
    append it, leaving every other line of the file as it is."""
    lines = path.read_text().splitlines(keepends=True)
    start = next((i for i, ln in enumerate(lines) if ln.startswith(f"{key}:")), None)
    new = yaml.safe_dump({key: block}, sort_keys=False, width=100)
    if start is None:
        lines.append(new)
    else:
        end = start + 1
        while end < len(lines) and (lines[end].startswith((" ", "-")) or not lines[end].strip()):
            end += 1
        lines[start:end] = [new]
    write_text(path, "".join(lines))


def format_fits(fits: dict) -> str:
    """Printed table of the fitted values and their errors per split."""
    rows = []
    for backend, f in fits.items():
        for kind in ("model", "simulated"):
            for split, errs in f.get(kind, {}).items():
                for m, e in errs.items():
                    rows.append({"backend": backend, **{k: f[k] for k in KEYS},
                                 "errors_of": kind,
                                 "split": split, "metric": m, **e})
    if not rows:
        return "Host fit: no backend had simulated rows"
    return "Host overhead fit per backend:\n" + pd.DataFrame(rows).to_string(index=False)
