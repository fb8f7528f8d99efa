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
from typing import Any

import pandas as pd
import yaml
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from analysis.files import write_yaml
from calibration.config import command_main, compose_command
from calibration.job_fit import (
    fit_calibration,
    fit_scalar,
    labelled,
    predict,
    report,
    row_labels,
    rows_on,
    split_rows,
)
from sim.cost.attention_kernels import IMPLS, load_kernel_classes, split_path
from sim.diffusion.pipeline import load_pipeline
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
    return IMPLS.get(load_pipeline(model).attention_impl, "")


def kernel_rows(table: pd.DataFrame, kernel: str, gpus: list[str]) -> pd.DataFrame:
    """The mapped rows on ``gpus`` whose pipeline runs ``kernel``."""
    return rows_on(table, gpus, lambda m: pipeline_kernel(m) == kernel)


def with_share(share: float) -> list[str]:
    return [f"{SHARE}={float(share):.6g}"]


def fit_share(rows: pd.DataFrame, backend: str) -> float:
    """The share in [0, 1] that minimises the rows' squared log error."""
    return fit_scalar(rows, backend, SHARE, (0.0, 1.0), 1e-3)


def run(cfg, outdir: Path) -> dict:
    """Fit on ``gpus``, predict ``held_out_gpus``, print both before and after, write."""
    if cfg.kernel not in set(IMPLS.values()):
        raise ConfigError("kernel", cfg.kernel, f"one of {sorted(set(IMPLS.values()))}")
    calibration = fit_calibration(cfg.gpus, cfg.held_out_gpus)
    if cfg.kernel not in load_kernel_classes(calibration):
        raise ConfigError("kernel", cfg.kernel, f"no measured kernel class of calibration "
                          f"{calibration!r} (python -m calibration fit-attention-kernels)")
    fit_rows, held_rows = split_rows(cfg.csv, cfg.gpus, cfg.held_out_gpus,
                                     lambda m: pipeline_kernel(m) == cfg.kernel)
    if fit_rows.empty:
        raise ConfigError("csv", cfg.csv, f"no row on {list(cfg.gpus)} whose pipeline runs "
                          f"{cfg.kernel}")
    share = fit_share(fit_rows, cfg.backend)
    rows = labelled(fit_rows, held_rows)
    print(f"{cfg.kernel}: SM share {share:.3f} of its time on the GPU it was measured on "
          f"(fitted on {list(cfg.gpus)}, {len(fit_rows)} rows)")
    table_err = report(rows, predict(rows, cfg.backend, with_share(0.0)),
                       predict(rows, cfg.backend, with_share(share)))
    doc = {"written_by": f"python -m calibration fit-attention-split csv={cfg.csv} "
                         f"kernel={cfg.kernel} gpus=[{','.join(cfg.gpus)}] "
                         f"held_out_gpus=[{','.join(cfg.held_out_gpus)}]",
           "fitted_on": date.today().isoformat(), "data": Path(cfg.csv).name,
           "form": "time on a GPU = time carried by the tensor peak x ((1 - share) + share x "
                   "(C_m / C) / (P_m / P)); P tensor (bf16) peak, C FP32 peak, m the GPU the "
                   "kernel was measured on",
           "method": "scipy minimize_scalar of the squared log error of whole jobs on the fit "
                     "GPUs; the held-out GPUs only predicted",
           "fit_rows": row_labels(fit_rows), "held_out_rows": row_labels(held_rows),
           "errors": table_err,
           "sm_share": {cfg.kernel: round(share, 4)}}
    if cfg.write:
        path = Path(str(split_path(calibration)))
        old = yaml.safe_load(path.read_text()) if path.is_file() else {}
        shares = {**((old or {}).get("sm_share") or {}), cfg.kernel: round(share, 4)}
        runs = {**((old or {}).get("fits") or {}), cfg.kernel: {k: v for k, v in doc.items()
                                                               if k != "sm_share"}}
        write_yaml(path, {"sm_share": shares, "fits": runs},
                   "SM share of attention kernel classes (sim/cost/attention_kernels.py); "
                   "written by calibration/fit_attention_split.py")
        print(f"written to {path}")
    return doc


def compose_config(overrides: list[str]):
    return compose_command("fit_attention_split", FitAttentionSplitConfig, overrides)


def main(overrides: list[str] | None = None) -> int:
    """Run with ``key=value`` overrides; 0, or 2 with one line on stderr."""
    return command_main(overrides, compose_config, run)
