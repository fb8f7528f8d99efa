"""``python -m calibration fit-attention-kernels csv=PATH hardware=NAME``: fit the attention
kernel classes (``sim.cost.attention_kernels``) on measured kernel throughput.

Reads a CSV in the layout of ``../shared/data/diffusion/attention_kernels_h100.csv`` (the
FlashAttention-3 paper's forward-pass figures on H100: ``op`` names the kernel,
``shape_params`` carries ``seq=`` and ``head_dim=``, ``metric=throughput`` in TFLOP/s). Only
16-bit rows are used (DiTs run bf16). The figures come in a causal and a non-causal panel
that the transcription does not label; DiT attention is non-causal, and causal attention
runs below non-causal at every point of those figures, so each (kernel, head dim, sequence)
keeps the larger of its values. Throughput / the GPU's bf16 peak is the efficiency.

Each (kernel, head dim) curve ``eta_max * s^p / (s^p + s_half^p)`` is fitted with scipy
``least_squares`` on log efficiency. Held out first: whole sequence lengths
(``held_out_seqs``, default 1024 and 8192), fitted on the rest, and their error reported;
then every point is fitted and written to
``sim/cost/calibrated/<hardware.calibration>/kernels/attention.yaml`` with both errors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING
from scipy.optimize import least_squares

from analysis.files import write_yaml
from analysis.inputs import read_csv
from calibration.config import command_main, compose_command
from calibration.fitting import signed_error_summary
from calibration.silicon_rows import hardware_doc
from sim.cost.attention_kernels import KernelCurve, kernel_classes_path
from sim.errors import ConfigError

# the CSV's kernel names -> kernel classes
KERNELS = {"FlashAttention-2": "fa2", "FlashAttention-3": "fa3", "Triton": "triton",
           "cuDNN": "cudnn", "Standard attention": "standard"}


@dataclass
class FitAttentionKernelsConfig:
    """Keys of ``python -m calibration fit-attention-kernels``."""

    defaults: list[Any] = field(default_factory=list)
    csv: str = MISSING
    hardware: str = "h100_sxm"
    held_out_seqs: list[int] = field(default_factory=lambda: [1024, 8192])
    write: bool = True


ConfigStore.instance().store(name="base_fit_attention_kernels", node=FitAttentionKernelsConfig)


def read_kernel_csv(path: str, peak_flops: float) -> pd.DataFrame:
    """One row per (kernel class, head dim, sequence): the non-causal efficiency (module doc)."""
    d = read_csv(path, "csv", "a kernel benchmark CSV", ("op", "dtype", "shape_params",
                                                         "metric", "value"))
    d = d[(d["metric"] == "throughput") & d["dtype"].astype(str).str.startswith(("fp16", "bf16"))]
    kernel = d["op"].astype(str).map(lambda op: next((v for k, v in KERNELS.items()
                                                     if op.endswith(k)), None))
    seq = d["shape_params"].astype(str).map(lambda s: _number(s, "seq"))
    dim = d["shape_params"].astype(str).map(lambda s: _number(s, "head_dim"))
    rows = pd.DataFrame({"kernel": kernel, "head_dim": dim, "seq": seq,
                         "tflops": pd.to_numeric(d["value"], errors="coerce")}).dropna()
    rows = rows.groupby(["kernel", "head_dim", "seq"], as_index=False)["tflops"].max()
    rows["head_dim"] = rows["head_dim"].astype(int)
    rows["eta"] = rows["tflops"] * 1e12 / peak_flops
    if rows.empty:
        raise ConfigError("csv", path, "no 16-bit throughput rows of a known kernel "
                          f"({sorted(KERNELS)})")
    return rows


def _number(text: str, key: str) -> float | None:
    m = re.search(rf"\b{key}=(\d+)", text)
    return float(m.group(1)) if m else None


def fit_curve(seq, eta) -> KernelCurve:
    """The saturating curve through ``(seq, eta)`` (least squares on log efficiency)."""
    s, e = np.asarray(seq, float), np.asarray(eta, float)
    top = float(e.max())

    def res(x):
        c = KernelCurve(float(np.exp(x[0])), float(np.exp(x[1])), float(x[2]))
        return np.log(c.eta(s)) - np.log(e)

    x0 = np.array([np.log(top * 1.05), np.log(float(np.median(s)) / 4), 1.0])
    sol = least_squares(res, x0, bounds=([np.log(top * 0.5), np.log(1.0), 0.3],
                                         [np.log(1.0), np.log(1e6), 4.0]))
    return KernelCurve(float(np.exp(sol.x[0])), float(np.exp(sol.x[1])), float(sol.x[2]))


def fit_classes(rows: pd.DataFrame, held_out_seqs=()) -> tuple[dict, pd.DataFrame]:
    """Curves per kernel and head dim fitted on the rows whose sequence is not held out, and
    every row with its prediction and split."""
    curves: dict[str, dict[int, KernelCurve]] = {}
    out = []
    for (k, d), g in rows.groupby(["kernel", "head_dim"]):
        held = g["seq"].isin(list(held_out_seqs))
        train = g[~held]
        if len(train) < 3:
            continue  # three parameters need three points
        c = fit_curve(train["seq"], train["eta"])
        curves.setdefault(k, {})[int(d)] = c
        out.append(g.assign(pred_eta=c.eta(g["seq"]), split=np.where(held, "held_out",
                                                                     "train")))
    table = pd.concat(out, ignore_index=True) if out else rows.iloc[:0]
    table["err_pct"] = (table["pred_eta"] / table["eta"] - 1) * 100
    return curves, table


def error_summary(table: pd.DataFrame) -> dict:
    """Per kernel and split: n, median and p90 absolute % error, signed median."""
    out: dict = {}
    for (k, split), g in table.groupby(["kernel", "split"]):
        out.setdefault(k, {})[split] = signed_error_summary(g["err_pct"])
    return out


def document(curves: dict, held: dict, final: dict, cfg, rows: pd.DataFrame,
             hw: dict) -> dict:
    """The calibrated file's contents."""
    ranges = {k: {"head_dims": sorted(int(d) for d in g["head_dim"].unique()),
                  "seq": [int(g["seq"].min()), int(g["seq"].max())]}
              for k, g in rows.groupby("kernel")}
    return {
        "written_by": f"python -m calibration fit-attention-kernels csv={cfg.csv} "
                      f"hardware={cfg.hardware}",
        "fitted_on": date.today().isoformat(),
        "data": Path(cfg.csv).name,
        # the GPU the curves were measured on: another GPU carries them over by these peaks
        # (sim.cost.attention_kernels)
        "measured_on": {"hardware": cfg.hardware, "bf16_flops": float(hw["bf16_flops"]),
                        "fp32_flops": float(hw.get("fp32_flops") or 0.0)},
        "form": "eta(s, d) = eta_max(d) * s^p / (s^p + s_half^p) of the bf16 peak, s = keys "
                "per query; time = max(flops / (peak * eta), bytes / bandwidth)",
        "measured": ranges,
        "assumptions": [
            "non-causal = the larger of each point's two transcribed values (the causal and "
            "non-causal panels are not labelled; causal runs below non-causal everywhere)",
            "head dims between measured ones: parameters interpolated in log2(head dim); "
            "outside them: the nearest measured head dim's curve",
            "sequences beyond the longest measured: the fitted curve (it saturates at eta_max)",
            "sdpa_flash is priced as fa2 (PyTorch's flash SDPA backend is FlashAttention-2), "
            "sdpa_math as standard attention, sdpa_cudnn as cudnn",
        ],
        "held_out": f"whole sequence lengths {list(cfg.held_out_seqs)} held out, fitted on "
                    "the rest; then refitted on every point",
        "errors": {"held_out_fit": held, "final_fit": final},
        "classes": {k: {int(d): {"eta_max": round(c.eta_max, 5), "s_half": round(c.s_half, 2),
                                 "power": round(c.power, 4)} for d, c in sorted(v.items())}
                    for k, v in sorted(curves.items())},
    }


def run(cfg, outdir: Path) -> dict:
    """Fit with held-out sequences, then on every point; print both errors; write the file."""
    hw = hardware_doc(cfg.hardware)
    if not hw:
        raise ConfigError("hardware", cfg.hardware, "no conf/hardware/<name>.yaml")
    rows = read_kernel_csv(cfg.csv, float(hw["bf16_flops"]))
    _, held_table = fit_classes(rows, cfg.held_out_seqs)
    curves, final_table = fit_classes(rows)
    held = error_summary(held_table)
    final = error_summary(final_table)
    print("| kernel | split | n | median abs % | p90 abs % | signed median % |")
    print("|---|---|---:|---:|---:|---:|")
    for k in sorted(held):
        for split, e in sorted(held[k].items(), reverse=True):
            print(f"| {k} | {split} | {e['n']} | {e['median_abs_pct']} | {e['p90_abs_pct']} | "
                  f"{e['signed_median_pct']:+} |")
    doc = document(curves, held, final, cfg, rows, hw)
    for k, v in doc["classes"].items():
        for d, c in v.items():
            print(f"{k} d={d}: eta_max {c['eta_max']:.3f} "
                  f"({c['eta_max'] * float(hw['bf16_flops']) / 1e12:.0f} TFLOP/s), "
                  f"s_half {c['s_half']:.0f}, p {c['power']:.2f}")
    if cfg.write:
        path = Path(str(kernel_classes_path(hw.get("calibration", cfg.hardware))))
        write_yaml(path, doc, "Attention kernel classes (sim/cost/attention_kernels.py); written "
                   "by calibration/fit_attention_kernels.py")
        print(f"written to {path}")
    return doc


def compose_config(overrides: list[str]):
    return compose_command("fit_attention_kernels", FitAttentionKernelsConfig, overrides)


def main(overrides: list[str] | None = None) -> int:
    """Run with ``key=value`` overrides; 0, or 2 with one line on stderr."""
    return command_main(overrides, compose_config, run)

