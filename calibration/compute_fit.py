"""Fit a deployment's compute speed (``cost_model.compute_scale``) on measured benchmark runs.

The efficiencies of ``sim/cost/calibrated/`` were fitted on operator tables profiled at
locked clocks (aiconfigurator's collector asks for them); a serving GPU runs its SM clock at
whatever its power and thermal limits allow under load (``nvidia-smi -q -d PERFORMANCE``:
"SW Power Cap", "HW Slowdown"), which slows compute-bound kernels (prefill GEMMs, prefill
attention) and leaves memory-bound ones (decode) at the HBM's speed. One number carries that:
every FLOP roof times ``scale``. It is fitted with ``scipy.optimize.minimize_scalar``
(bounded) on the soft-L1 cost of ``log(pred / meas)`` of the training runs' TTFT, request
throughput, TPOT and ITL (``calibration.frontend_fit.residuals``), with the calibrated
frontend costs; held-out runs are only reported. Fitted together with
the frontend costs it is one parameter of ``calibration.frontend_fit.fit_frontend``
(``compute_scale=``); ``compute_block`` writes either fit's scale.
"""

from __future__ import annotations

from datetime import date

import numpy as np
from scipy.optimize import minimize_scalar

from calibration.bench_replay import plan_run
from calibration.bench_runs import BenchRun
from calibration.frontend_fit import (
    SCALE_BOUNDS,
    param_overrides,
    residuals,
    simulate_runs,
    soft_l1,
    split_errors,
)

SCALAR_METHOD = ("scipy minimize_scalar (bounded) of the soft-L1 cost of log(pred/meas) of "
                 "mean and median TTFT, request throughput, mean TPOT and mean ITL, every run "
                 "replayed in full")
JOINT_METHOD = ("scipy least_squares (soft-L1) on log(pred/meas) of mean and median TTFT, "
                "request throughput, mean TPOT and mean ITL, every run replayed in full, "
                "jointly with the frontend costs (calibration.frontend_fit)")


def scale_override(scale: float) -> tuple[str, ...]:
    """The override that sets the compute scale."""
    return tuple(param_overrides({"compute_scale": scale}))


def fit_compute_scale(runs: list[BenchRun], backend: str, hardware: str,
                      held_out: set[str], max_evals: int = 12, n_jobs: int = 2,
                      log=print) -> dict:
    """Fit ``backend``'s compute scale on its simulatable runs whose id is not in ``held_out``,
    with the calibrated frontend costs. The scale, the
    trials, and the per-run tables before (scale 1) and after, with their split."""
    mine = [r for r in runs if r.backend == backend and not plan_run(r, hardware)["reason"]]
    train = [r for r in mine if r.id not in held_out]
    if not train:
        raise ValueError(f"no {backend} run to fit the compute scale on")
    trials: list[tuple[float, float]] = []

    def cost(scale: float) -> float:
        res = residuals(simulate_runs(train, backend, None, hardware, n_jobs,
                                      scale_override(scale)))
        trials.append((float(scale), float(np.sum(soft_l1(res)))))
        log(f"  {backend} compute scale {scale:.4f}: cost {trials[-1][1]:.3f}, "
            f"median |log error| {float(np.median(np.abs(res))):.3f}")
        return trials[-1][1]

    minimize_scalar(cost, bounds=SCALE_BOUNDS, method="bounded",
                    options={"maxiter": max_evals, "xatol": 0.01})
    scale = round(min(trials, key=lambda t: t[1])[0], 3)  # the best trial simulated
    before = simulate_runs(mine, backend, None, hardware, n_jobs, scale_override(1.0))
    after = simulate_runs(mine, backend, None, hardware, n_jobs, scale_override(scale))
    for t in (before, after):
        t["split"] = np.where(t["id"].isin(held_out), "held_out", "train")
    return {"backend": backend, "scale": scale, "trials": trials,
            "train_runs": [r.id for r in train], "before": before, "after": after}


def compute_block(scale: float, after, data: str, split: str, held_out_models: list[str],
                  method: str) -> dict:
    """The calibrated file's ``compute:`` block of a fitted ``scale``, with the errors per
    split of its table ``after``; ``method`` says how it was fitted."""
    return {"scale": scale, "fitted": True, "fitted_on": date.today().isoformat(),
            "method": method, "data": data, "split": split,
            "held_out_models": held_out_models, "errors": split_errors(after)}
