"""``python -m calibration fit-vae-conv3d csv=PATH``: fit the efficiency of the channels-first
3D convolution class (``sim.cost.conv3d``: a video VAE's ``nn.Conv3d`` on the CUDA cores, a
fraction of ``hardware.fp32_flops``).

No kernel measurement of these convolutions is in ``../shared/data``; whole jobs are. Rows of
a CSV in the layout of ``../shared/data/diffusion/xdit_dev.csv`` are mapped and priced as
``validate-diffusion`` does (``calibration.validate_diffusion``); those on the ``gpus``
(default the H100) whose pipeline decodes with a channels-first 3D VAE are the fit,
``held_out_gpus`` (default H20 and L20: other FP32-to-tensor ratios, another architecture)
are only predicted. The efficiency minimises the fit rows' squared log error (scipy
``minimize_scalar`` on [0.01, 1]). The decode is the serial stage of a sequence-parallel
video job, so the rows of several GPU counts separate it from the DiT's steps
(``validate-diffusion``'s table of serial and step parts). Written to
``sim/cost/calibrated/<calibration>/kernels/conv3d.yaml`` with the errors before (the
convolutions as tensor-core GEMMs, ``conv3d_layout=channels_last``) and after, per GPU and
split. The held-out GPUs are never refitted: they stay a standing check.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import pandas as pd
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
from sim.cost.conv3d import conv3d_path
from sim.diffusion.pipeline import load_pipeline
from sim.diffusion.vae import channels_first_3d as vae_channels_first_3d
from sim.errors import ConfigError

EFFICIENCY = "model.diffusion.vae.conv3d_efficiency"
TENSOR_CORES = "model.diffusion.vae.conv3d_layout=channels_last"


@dataclass
class FitVaeConv3dConfig:
    """Keys of ``python -m calibration fit-vae-conv3d``."""

    defaults: list[Any] = field(default_factory=list)
    csv: str = MISSING
    gpus: list[str] = field(default_factory=lambda: ["h100_sxm"])  # hardware fitted on
    held_out_gpus: list[str] = field(default_factory=lambda: ["h20", "l20"])  # only predicted
    backend: str = "vllm"  # whose calibration prices the GEMMs (as validate-diffusion's)
    write: bool = True


ConfigStore.instance().store(name="base_fit_vae_conv3d", node=FitVaeConv3dConfig)


def channels_first_3d(model: str) -> bool:
    """Whether ``model``'s pipeline decodes with channels-first 3D convolutions."""
    return vae_channels_first_3d(load_pipeline(model).vae)


def conv3d_rows(table: pd.DataFrame, gpus: list[str]) -> pd.DataFrame:
    """The mapped rows on ``gpus`` whose pipeline runs the class."""
    return rows_on(table, gpus, channels_first_3d)


def fit_efficiency(rows: pd.DataFrame, backend: str) -> float:
    """The efficiency in [0.01, 1] that minimises the rows' squared log error."""
    return fit_scalar(rows, backend, EFFICIENCY, (0.01, 1.0), 1e-4)


def run(cfg, outdir: Path) -> dict:
    """Fit on ``gpus``, predict ``held_out_gpus``, print both before and after, write."""
    calibration = fit_calibration(cfg.gpus, cfg.held_out_gpus)
    fit_rows, held_rows = split_rows(cfg.csv, cfg.gpus, cfg.held_out_gpus, channels_first_3d)
    if fit_rows.empty:
        raise ConfigError("csv", cfg.csv, f"no row on {list(cfg.gpus)} whose pipeline decodes "
                          "with channels-first 3D convolutions")
    eff = fit_efficiency(fit_rows, cfg.backend)
    rows = labelled(fit_rows, held_rows)
    print(f"channels-first 3D convolutions: {eff:.3f} of the FP32 peak (fitted on "
          f"{list(cfg.gpus)}, {len(fit_rows)} rows)")
    table_err = report(rows, predict(rows, cfg.backend, [TENSOR_CORES]),
                       predict(rows, cfg.backend, [f"{EFFICIENCY}={eff:.6g}"]))
    doc = {"written_by": f"python -m calibration fit-vae-conv3d csv={cfg.csv} "
                         f"gpus=[{','.join(cfg.gpus)}] "
                         f"held_out_gpus=[{','.join(cfg.held_out_gpus)}]",
           "fitted_on": date.today().isoformat(), "data": Path(cfg.csv).name,
           "form": "a channels-first 3D convolution takes max(flops / (fp32_flops x "
                   "efficiency), bytes / bandwidth); other GPUs at their own FP32 peak",
           "method": "scipy minimize_scalar of the squared log error of whole jobs on the fit "
                     "GPUs; the held-out GPUs only predicted; before: tensor-core GEMMs",
           "fit_rows": row_labels(fit_rows), "held_out_rows": row_labels(held_rows),
           "errors": table_err,
           "channels_first": {"efficiency": round(eff, 4)}}
    if cfg.write:
        path = Path(str(conv3d_path(calibration)))
        write_yaml(path, doc, "Channels-first 3D convolutions on the CUDA cores "
                   "(sim/cost/conv3d.py); written by calibration/fit_vae_conv3d.py")
        print(f"written to {path}")
    return doc


def compose_config(overrides: list[str]):
    return compose_command("fit_vae_conv3d", FitVaeConv3dConfig, overrides)


def main(overrides: list[str] | None = None) -> int:
    """Run with ``key=value`` overrides; 0, or 2 with one line on stderr."""
    return command_main(overrides, compose_config, run)
