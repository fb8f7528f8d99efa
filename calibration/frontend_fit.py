"""Fit a backend's frontend costs (``sim.engine.frontend``) on measured benchmark runs.

The four costs — per request and per prompt token (admission), per streamed token, and the
request path's fixed latency — and optionally the per-step host overhead and the
deployment's compute speed (``cost_model.compute_scale``, fitted jointly with the costs so
that neither absorbs what the other explains) are fitted with
``scipy.optimize.least_squares`` (soft-L1,
stopped after ``max_evals`` simulated trials, Jacobian columns included; the best trial
wins) on ``log(pred / meas)`` of each training run's mean and median TTFT, request
throughput, mean TPOT and mean ITL (the gaps streaming leaves between tokens), every run
replayed in full by the simulator for each trial (``calibration.bench_replay``; the runs of
one trial are simulated in parallel processes). The split is by model: a share of the
backend's models (whole models, all their runs) is held out of the fit and its error reported
beside the training error.
"""

from __future__ import annotations

from datetime import date

import numpy as np
import pandas as pd
from joblib import Parallel, delayed
from scipy.optimize import least_squares

from calibration.bench_replay import error_table, plan_run, replay
from calibration.bench_runs import BenchRun
from sim.config.backend import frontend_discipline
from sim.engine.frontend import FRONTEND_KEYS

FIT_METRICS = ("mean_ttft_ms", "median_ttft_ms", "request_throughput", "mean_tpot_ms",
               "mean_itl_ms")
START = {"per_request_ms": 2.0, "per_prompt_token_us": 1.0, "per_output_token_us": 50.0,
         "latency_ms": 20.0}
SCALE_BOUNDS = (0.3, 1.5)  # a GPU at 30% .. 150% of the profiled tables' compute speed
# each fitted parameter → the simulator key it sets
OVERRIDES = {**{k: f"backend.frontend.{k}" for k in FRONTEND_KEYS},
             "host_overhead_ms": "cost_model.host_overhead_ms",
             "compute_scale": "cost_model.compute_scale"}
MISS = 3.0  # the residual of a run the trial could not simulate (a factor of e^3)
F_SCALE = 0.2  # soft-L1 scale: a log error past 0.2 (22%) counts less than squared


class _OutOfTrials(Exception):
    """The fit has simulated as many trials as it may."""


def soft_l1(r: np.ndarray) -> np.ndarray:
    """scipy's soft-L1 loss of residuals ``r`` at ``F_SCALE``."""
    z = (r / F_SCALE) ** 2
    return F_SCALE**2 * 2 * (np.sqrt(1 + z) - 1)


def held_out_models(models: list[str], fraction: float, seed: int) -> list[str]:
    """The models held out of the fit: ``fraction`` of them (at least one when there are two
    or more), drawn with ``seed``."""
    models = sorted(set(models))
    if len(models) < 2:
        return []
    k = min(len(models) - 1, max(1, round(fraction * len(models))))
    rng = np.random.default_rng(seed)
    return sorted(rng.choice(models, size=k, replace=False).tolist())


def param_overrides(params: dict[str, float]) -> list[str]:
    """The simulator overrides that set fitted parameters (names of ``OVERRIDES``)."""
    return [f"{OVERRIDES[k]}={float(v):.6g}" for k, v in params.items()]


def simulate_runs(runs: list[BenchRun], backend: str, params: dict[str, float] | None,
                  hardware: str, n_jobs: int, more: tuple[str, ...] = ()) -> pd.DataFrame:
    """``replay`` of ``runs`` with the parameters ``params`` (None: the calibrated ones) and
    the overrides ``more``, in ``n_jobs`` processes."""
    extra = {backend: [*param_overrides(params or {}), *more]}
    if n_jobs == 1 or len(runs) < 2:
        return replay(runs, hardware, extra)
    parts = Parallel(n_jobs=n_jobs)(delayed(replay)([r], hardware, extra) for r in runs)
    return pd.concat(parts, ignore_index=True)


def residuals(table: pd.DataFrame) -> np.ndarray:
    """``log(pred / meas)`` of ``FIT_METRICS`` per run (``MISS`` where one is missing)."""
    out = []
    for m in FIT_METRICS:
        pred = table.get(f"pred_{m}", pd.Series(np.nan, index=table.index)).to_numpy(float)
        meas = table[f"meas_{m}"].to_numpy(float)
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.log(pred / meas)
        out.append(np.where(np.isfinite(r), np.clip(r, -MISS, MISS), MISS))
    return np.concatenate(out)


def fit_frontend(runs: list[BenchRun], backend: str, hardware: str = "h100_sxm",
                 held_out_fraction: float = 0.3, seed: int = 0, max_evals: int = 40,
                 n_jobs: int = 2, log=print, held_out_runs: set[str] | None = None,
                 host_ms: float | None = None, compute_scale: float | None = None,
                 held_out: list[str] | None = None, discipline: dict | None = None) -> dict:
    """Fit ``backend``'s frontend on its simulatable runs of the models not held out (or,
    with ``held_out_runs``, on the runs not named there); the fitted costs, the split, and
    the per-run tables before (every cost 0, the calibrated host and compute speed) and
    after. The held-out models are ``held_out`` where given (a split kept from an earlier
    fit), else drawn (``held_out_fraction``, ``seed``). ``discipline``: the frontend's
    admission and streaming the costs are fitted under (default: the engine's,
    ``sim.config.backend.frontend_discipline``). ``host_ms``: also fit
    the per-step host overhead (``cost_model.host_overhead_ms``), from that value;
    ``compute_scale``: also fit the compute speed, from that value, within
    ``SCALE_BOUNDS``."""
    plans = {r.id: plan_run(r, hardware) for r in runs if r.backend == backend}
    mine = [r for r in runs if r.id in plans and not plans[r.id]["reason"]]
    models = {r.id: plans[r.id]["model"] for r in mine}
    discipline = frontend_discipline(backend, discipline or {})
    more = tuple(f"backend.frontend.{k}={v}" for k, v in discipline.items())
    if held_out_runs is None:
        held = (sorted(held_out) if held_out is not None else
                held_out_models(list(models.values()), held_out_fraction, seed))
        is_held = {r.id: models[r.id] in held for r in mine}
    else:
        held = []
        is_held = {r.id: r.id in held_out_runs for r in mine}
    train = [r for r in mine if not is_held[r.id]]
    if not train:
        raise ValueError(f"no simulatable {backend} run to fit on")
    start = {k: START[k] for k in FRONTEND_KEYS}
    if host_ms is not None:
        start["host_overhead_ms"] = host_ms or 0.5
    if compute_scale is not None:
        start["compute_scale"] = float(np.clip(compute_scale, *SCALE_BOUNDS))
    keys, x0 = list(start), np.array(list(start.values()))
    scale = [k == "compute_scale" for k in keys]
    lower = np.where(scale, SCALE_BOUNDS[0], 0.0)
    upper = np.where(scale, SCALE_BOUNDS[1], np.inf)
    evals, best = [], {}

    def fun(x):
        if len(evals) >= max_evals:  # the budget of simulations (Jacobian columns included)
            raise _OutOfTrials
        res = residuals(simulate_runs(train, backend, dict(zip(keys, x, strict=True)),
                                      hardware, n_jobs, more))
        cost = float(np.sum(soft_l1(res)))
        evals.append(float(np.median(np.abs(res))))
        if not best or cost < best["cost"]:
            best.update(cost=cost, x=np.array(x, float))
        log(f"  {backend} trial {len(evals)}: "
            f"{ {k: round(float(v), 4) for k, v in zip(keys, x, strict=True)} } "
            f"median |log error| {evals[-1]:.3f}")
        return res

    try:
        least_squares(fun, x0, bounds=(lower, upper), x_scale=x0, diff_step=0.15,
                      loss="soft_l1", f_scale=F_SCALE)
    except _OutOfTrials:
        pass
    fitted = {k: round(float(v), 4)  # the best trial simulated
              for k, v in zip(keys, np.clip(best["x"], lower, upper), strict=True)}
    zero = {k: 0.0 for k in FRONTEND_KEYS} | (
        {} if host_ms is None else {"host_overhead_ms": host_ms})
    before = simulate_runs(mine, backend, zero, hardware, n_jobs, more)
    after = simulate_runs(mine, backend, fitted, hardware, n_jobs, more)
    for t in (before, after):
        t["split"] = np.where(t["id"].map(is_held), "held_out", "train")
    return {"backend": backend, "costs": {k: fitted[k] for k in FRONTEND_KEYS},
            "discipline": discipline,
            "host_overhead_ms": fitted.get("host_overhead_ms"),
            "compute_scale": fitted.get("compute_scale"),
            "held_out_models": held, "train_models": sorted(set(models.values()) - set(held)),
            "train_runs": [r.id for r in train], "evaluations": len(evals),
            "before": before, "after": after}


def split_errors(after: pd.DataFrame) -> dict:
    """Per split (train, held_out) and ``FIT_METRICS`` metric: n, median and p90 absolute
    error (%) of a fit's table, as a calibrated file's ``errors:`` records them."""
    errors = {}
    for split in ("train", "held_out"):
        tab = error_table(after[after["split"] == split], FIT_METRICS)
        errors[split] = {r.metric: {"n": int(r.n), "median_abs_pct": round(r.median_abs_pct, 1),
                                    "p90_abs_pct": round(r.p90_abs_pct, 1)}
                         for r in tab.itertuples()}
    return errors


def frontend_block(fit: dict, data: str, fraction: float, seed: int,
                   split: str | None = None) -> dict:
    """The calibrated file's ``frontend:`` block of a fit, with its held-out errors;
    ``split``: how its held-out models were chosen (default: drawn with ``fraction``,
    ``seed``)."""
    errors = split_errors(fit["after"])
    joint = ("" if fit.get("compute_scale") is None else
             f", jointly with the compute scale ({fit['compute_scale']}: the compute: block)")
    return {**fit["costs"], **fit["discipline"], "fitted": True,
            "fitted_on": date.today().isoformat(),
            "method": "scipy least_squares (soft-L1) on log(pred/meas) of mean and median "
                      "TTFT, request throughput, mean TPOT and mean ITL, every run replayed "
                      f"in full{joint}",
            "data": data,
            "split": split or (f"{round(fraction * 100)}% of the backend's models held out "
                               f"(whole models), seed {seed}"),
            "held_out_models": fit["held_out_models"], "train_models": fit["train_models"],
            "errors": errors}
