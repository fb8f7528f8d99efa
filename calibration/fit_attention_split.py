"""``python -m calibration fit-attention-split csv=PATH``: fit how much of an attention kernel
class's time is SM work (``sim.cost.attention_kernels``: the softmax on the CUDA cores and
special-function units, which another GPU runs at its FP32 rate, not its tensor peak).

One GPU's kernel measurements cannot split a kernel's time into its tensor and SM parts; a
second GPU whose tensor and FP32 peaks stand in another ratio can. Rows of a CSV in the
layout of ``../shared/data/diffusion/xdit_dev.csv`` are mapped and priced as
``validate-diffusion`` does (``calibration.validate_diffusion``); those on the ``gpus`` whose
pipeline runs the kernel class (``kernel``, default ``fa2``: also ``sdpa_flash``) are the fit,
``held_out_gpus`` (default ``l20``: another architecture) are only predicted. The share
minimises the fit rows' squared log error (scipy ``minimize_scalar`` on [0, 1]); each row is
the whole job, so the fit also carries the rest of the cost model's error on those GPUs
(attention is ~90% of a video job's time there). Rows on the GPU the kernel was measured on
do not move. Written to ``sim/cost/calibrated/<calibration>/kernels/attention_split.yaml``
with the errors before (share 0: carried by the tensor peak alone) and after, per GPU and
split. The held-out GPUs are never refitted: they stay a standing check.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import yaml
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING
from scipy.optimize import minimize_scalar

import conf
from calibration.config import command_main, compose_command
from calibration.fitting import signed_error_summary
from calibration.silicon_rows import hardware_doc
from calibration.validate_diffusion import plan_rows, read_rows, simulate_rows
from sim.cost.attention_kernels import CALIBRATED, IMPLS, load_kernel_classes, split_path
from sim.errors import ConfigError

SHARE = "model.diffusion.attention_sm_share"


@dataclass
class FitAttentionSplitConfig:
    """Keys of ``python -m calibration fit-attention-split``."""

    defaults: list[Any] = field(default_factory=list)
    csv: str = MISSING
    kernel: str = "fa2"  # the kernel class whose split is fitted
    gpus: list[str] = field(default_factory=lambda: ["h20"])  # hardware names fitted on
    held_out_gpus: list[str] = field(default_factory=lambda: ["l20"])  # only predicted
    backend: str = "vllm"  # whose calibration prices the GEMMs (as validate-diffusion's)
    write: bool = True


ConfigStore.instance().store(name="base_fit_attention_split", node=FitAttentionSplitConfig)


def pipeline_kernel(model: str) -> str:
    """The kernel class ``model``'s pipeline runs by default ("" for the backend's tables)."""
    doc = yaml.safe_load((Path(conf.__file__).parent / "model" / f"{model}.yaml").read_text())
    impl = ((doc or {}).get("diffusion") or {}).get("attention_impl", CALIBRATED)
    return IMPLS.get(impl, "")


def kernel_rows(table: pd.DataFrame, kernel: str, gpus: list[str]) -> pd.DataFrame:
    """The mapped rows on ``gpus`` whose pipeline runs ``kernel``."""
    ok = table[(table["reason"] == "") & table["hardware"].isin(list(gpus))]
    runs = ok["model"].map({m: pipeline_kernel(m) for m in ok["model"].unique()})
    return ok[runs == kernel].reset_index(drop=True)


def predict(rows: pd.DataFrame, backend: str, share: float) -> pd.DataFrame:
    """Every row priced with the kernel's SM share ``share``; ``err_pct`` signed. A row the
    simulator refuses (a plan that does not fit in memory) has ``reason`` and no prediction."""
    cfg = SimpleNamespace(backend=backend, overrides=[f"{SHARE}={float(share):.6g}"])
    return simulate_rows(rows.drop(columns=["pred_s", "err_pct"], errors="ignore"), cfg)


def fit_share(rows: pd.DataFrame, backend: str) -> float:
    """The share in [0, 1] that minimises the rows' squared log error."""
    def loss(x: float) -> float:
        p = predict(rows, backend, x)
        p = p[p["reason"] == ""]
        return float(np.sum(np.log(p["pred_s"] / p["meas_s"]) ** 2))

    return float(minimize_scalar(loss, bounds=(0.0, 1.0), method="bounded",
                                 options={"xatol": 1e-3}).x)


def errors(p: pd.DataFrame) -> dict:
    """n, median and p90 absolute % error and the signed median of the predicted rows."""
    return signed_error_summary(p.loc[p["reason"] == "", "err_pct"])


def run(cfg, outdir: Path) -> dict:
    """Fit on ``gpus``, predict ``held_out_gpus``, print both before and after, write."""
    if cfg.kernel not in set(IMPLS.values()):
        raise ConfigError("kernel", cfg.kernel, f"one of {sorted(set(IMPLS.values()))}")
    if not cfg.gpus:
        raise ConfigError("gpus", list(cfg.gpus), "at least one hardware name to fit on")
    if set(cfg.gpus) & set(cfg.held_out_gpus):
        raise ConfigError("held_out_gpus", list(cfg.held_out_gpus),
                          f"must not hold out a GPU it fits on ({list(cfg.gpus)})")
    cals = {g: (hardware_doc(g) or {}).get("calibration") for g in cfg.gpus}
    if None in cals.values() or len(set(cals.values())) != 1:
        raise ConfigError("gpus", list(cfg.gpus), "hardware names of one calibration "
                          f"(conf/hardware/<name>.yaml calibration:), got {cals}")
    calibration = next(iter(cals.values()))
    if cfg.kernel not in load_kernel_classes(calibration):
        raise ConfigError("kernel", cfg.kernel, f"no measured kernel class of calibration "
                          f"{calibration!r} (python -m calibration fit-attention-kernels)")
    table = plan_rows(read_rows(Path(cfg.csv)))
    fit_rows = kernel_rows(table, cfg.kernel, cfg.gpus)
    held_rows = kernel_rows(table, cfg.kernel, cfg.held_out_gpus)
    if fit_rows.empty:
        raise ConfigError("csv", cfg.csv, f"no row on {list(cfg.gpus)} whose pipeline runs "
                          f"{cfg.kernel}")
    share = fit_share(fit_rows, cfg.backend)
    rows = pd.concat([fit_rows.assign(split="fit"), held_rows.assign(split="held_out")],
                     ignore_index=True)
    before, after = predict(rows, cfg.backend, 0.0), predict(rows, cfg.backend, share)
    shown = rows[["split", "model", "hardware", "plan", "meas_s"]].assign(
        pred_before_s=before["pred_s"], err_before_pct=before["err_pct"],
        pred_after_s=after["pred_s"], err_after_pct=after["err_pct"],
        reason=after["reason"].str.slice(0, 70))
    print(f"{cfg.kernel}: SM share {share:.3f} of its time on the GPU it was measured on "
          f"(fitted on {list(cfg.gpus)}, {len(fit_rows)} rows)")
    print(shown.round(1).to_string(index=False))
    table_err = {}
    print("\n| split | hardware | n | median abs % before -> after | p90 abs % | signed median % |")
    print("|---|---|---:|---:|---:|---:|")
    for (split, hw), idx in rows.groupby(["split", "hardware"]).groups.items():
        b, a = errors(before.loc[idx]), errors(after.loc[idx])
        table_err.setdefault(split, {})[hw] = {"before": b, "after": a}
        if a["signed_median_pct"] is not None and b["signed_median_pct"] is not None:
            print(f"| {split} | {hw} | {a['n']} | {b['median_abs_pct']} -> "
                  f"{a['median_abs_pct']} | {b['p90_abs_pct']} -> {a['p90_abs_pct']} | "
                  f"{b['signed_median_pct']:+} -> {a['signed_median_pct']:+} |")
    doc = {"written_by": f"python -m calibration fit-attention-split csv={cfg.csv} "
                         f"kernel={cfg.kernel} gpus=[{','.join(cfg.gpus)}] "
                         f"held_out_gpus=[{','.join(cfg.held_out_gpus)}]",
           "fitted_on": date.today().isoformat(), "data": Path(cfg.csv).name,
           "form": "time on a GPU = time carried by the tensor peak x ((1 - share) + share x "
                   "(C_m / C) / (P_m / P)); P tensor (bf16) peak, C FP32 peak, m the GPU the "
                   "kernel was measured on",
           "method": "scipy minimize_scalar of the squared log error of whole jobs on the fit "
                     "GPUs; the held-out GPUs only predicted",
           "fit_rows": [f"{r.model} {r.hardware} {r.plan}" for r in fit_rows.itertuples()],
           "held_out_rows": [f"{r.model} {r.hardware} {r.plan}"
                             for r in held_rows.itertuples()],
           "errors": table_err,
           "sm_share": {cfg.kernel: round(share, 4)}}
    if cfg.write:
        path = Path(str(split_path(calibration)))
        old = yaml.safe_load(path.read_text()) if path.is_file() else {}
        shares = {**((old or {}).get("sm_share") or {}), cfg.kernel: round(share, 4)}
        runs = {**((old or {}).get("fits") or {}), cfg.kernel: {k: v for k, v in doc.items()
                                                               if k != "sm_share"}}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("# SM share of attention kernel classes (sim/cost/attention_kernels.py); "
                        "written by calibration/fit_attention_split.py\n"
                        + yaml.safe_dump({"sm_share": shares, "fits": runs}, sort_keys=False,
                                         width=100))
        print(f"written to {path}")
    return doc


def compose_config(overrides: list[str]):
    return compose_command("fit_attention_split", FitAttentionSplitConfig, overrides)


def main(overrides: list[str] | None = None) -> int:
    """Run with ``key=value`` overrides; 0, or 2 with one line on stderr."""
    return command_main(overrides, compose_config, run)
