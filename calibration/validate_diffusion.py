"""``python -m calibration validate-diffusion csv=PATH``: the diffusion cost model against
measured end-to-end job latencies.

Every row of a CSV in the layout of ``../shared/data/diffusion/xdit_dev.csv`` (``model``,
``gpu``, ``num_gpus``, ``parallel_config``, ``resolution``, ``frames``, ``steps``, ``metric``
= ``end_to_end_latency`` in ``value`` seconds) that maps onto the simulator is priced as one
job (``DiffusionCostModel.timing``: text encoders, steps, VAE decode):

- the model: the ``conf/model`` diffusion pipeline whose name or Hugging Face id matches the
  row's name without its parenthesis (``FLUX.1-dev (12B)`` -> ``flux1_dev``);
- the GPU: the ``conf/hardware`` file of that name (``H100`` -> ``h100_sxm``, ``H20`` ->
  ``h20``);
- the plan: ``1 GPU``, ``Ulysses-u``, ``Ring-r``, ``Ulysses-u x Ring-r``, ``Ulysses SP=u``;
- the execution mode: ``(PyTorch eager)`` / ``(torch.compile)`` in the plan's text, else the
  pipeline's own ``model.diffusion.execution``.
- what the row's reference script set that the CSV has no column for (``SOURCE_SETTINGS``:
  xDiT's FLUX.1 rows ran 256 text tokens).

Printed: every row's predicted and measured seconds and signed error ``(pred - meas) /
meas``, the median absolute and signed error per (model, GPU, mode), the 1 -> N speed-up
measured beside predicted (per model, GPU, mode and plan family), the serial and per-step
parts fitted to the one-GPU and Ulysses rows of three or more GPU counts (``serial_parts``),
and the rows not simulated with their reasons. Written to the run's output dir:
``validate_diffusion.json``, ``validate_diffusion.md`` and ``rows.parquet``.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from hydra import compose
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

import conf
import conf.schema  # noqa: F401  (registers the config schemas)
from analysis.files import atomic_write, write_text
from analysis.inputs import read_csv
from calibration.config import SimConfigContext, command_main, compose_command
from sim.builders import plain
from sim.diffusion.cost import DiffusionCostModel
from sim.diffusion.job import JobShape, ParallelPlan
from sim.diffusion.plans import parse_plan
from sim.errors import ConfigError

MODES = {"pytorch eager": "eager", "torch.compile": "compiled"}
# Settings a row's reference script ran with that the CSV has no column for, by (pattern of
# the row's ``source``, pipeline): xDiT's FLUX.1 table (``docs/performance/flux.md``, added in
# 8275240, 2024-11-28) was measured with ``examples/flux_example.py``, which calls the pipeline
# with ``max_sequence_length=256`` — the T5 tokens the DiT attends to (FluxPipeline's default,
# the pipeline's own here, is 512); ``text_encoders.1`` is its T5 encoder.
SOURCE_SETTINGS = (
    (r"xdit-project/xdit.*docs/performance/flux\.md", "flux1_dev",
     ("model.diffusion.dit.text_tokens=256", "model.diffusion.text_encoders.1.tokens=256")),
)


def source_overrides(source: str, model: str) -> tuple[str, ...]:
    """The overrides of ``SOURCE_SETTINGS`` for a row of ``source`` priced as ``model``."""
    return tuple(o for pattern, pipe, overrides in SOURCE_SETTINGS
                 if pipe == model and re.search(pattern, str(source), re.IGNORECASE)
                 for o in overrides)
CSV_COLUMNS = ("model", "gpu", "num_gpus", "parallel_config", "resolution", "steps", "value")


@dataclass
class ValidateDiffusionConfig:
    """Keys of ``python -m calibration validate-diffusion``."""

    defaults: list[Any] = field(default_factory=list)
    csv: str = MISSING
    backend: str = "vllm"  # whose calibration prices the GEMMs (as a diffusion run's does)
    overrides: list[str] = field(default_factory=list)  # more simulator overrides, every row


ConfigStore.instance().store(name="base_validate_diffusion", node=ValidateDiffusionConfig)


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", str(text).lower())


def pipelines() -> dict[str, str]:
    """Normalised names and Hugging Face ids of the diffusion pipelines -> their conf name."""
    import yaml

    out = {}
    for p in sorted((Path(conf.__file__).parent / "model").glob("*.yaml")):
        doc = yaml.safe_load(p.read_text()) or {}
        if doc.get("kind") == "diffusion":
            out[_norm(p.stem)] = p.stem
            if doc.get("hf_id"):
                out[_norm(str(doc["hf_id"]).split("/")[-1])] = p.stem
    return out


def hardware_names() -> list[str]:
    return sorted(p.stem for p in (Path(conf.__file__).parent / "hardware").glob("*.yaml")
                  if not p.stem.startswith("base"))


# A bare GPU name that several hardware files start with: the variant the development set's
# multi-GPU servers have (H100: the SXM; its 4- and 6-GPU plans need one NVLink node).
BARE_NAMES = {"h100": "h100_sxm"}


def map_hardware(gpu: str) -> str | None:
    """``H100`` -> ``h100_sxm``: the file of that name, the variant ``BARE_NAMES`` names, or
    the one name that starts with it and an underscore."""
    g = str(gpu).strip().lower().replace("-", "_").replace(" ", "_")
    names = hardware_names()
    if g in names:
        return g
    if g in BARE_NAMES:
        return BARE_NAMES[g]
    hits = [n for n in names if n.startswith(g + "_")]
    return hits[0] if len(hits) == 1 else None


def parse_parallel(text: str) -> tuple[ParallelPlan | None, str, str]:
    """The plan, the execution mode named in the text ("" if none) and a reason if the
    text is not understood."""
    t = str(text).lower()
    mode = next((m for k, m in MODES.items() if k in t), "")
    core = re.sub(r"\(.*?\)", "", t).strip()
    if re.fullmatch(r"1 gpu", core):
        return ParallelPlan(), mode, ""
    u = re.search(r"ulysses(?:-| sp=)(\d+)", core)
    r = re.search(r"ring-(\d+)", core)
    if not (u or r):
        return None, mode, f"parallel_config {text!r}: not a Ulysses/Ring plan"
    return ParallelPlan(ulysses=int(u.group(1)) if u else 1,
                        ring=int(r.group(1)) if r else 1), mode, ""


def family(plan: ParallelPlan) -> str:
    """``ulysses``, ``ring`` or ``ulysses+ring`` (``single`` for one GPU)."""
    kinds = [k for k in ("ulysses", "ring") if getattr(plan, k) > 1]
    return "+".join(kinds) or "single"


def plan_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """Each row's mapping (model, hardware, plan, mode, shape) or its ``reason``."""
    pipes = pipelines()
    out = []
    for i, r in rows.reset_index(drop=True).iterrows():
        reason = ""
        model = pipes.get(_norm(re.sub(r"\(.*?\)", "", str(r["model"]))))
        hw = map_hardware(r["gpu"])
        plan, mode, why = parse_parallel(r["parallel_config"])
        size = re.fullmatch(r"\s*(\d+)\s*x\s*(\d+)\s*", str(r["resolution"]))
        if str(r.get("metric", "end_to_end_latency")) != "end_to_end_latency":
            reason = f"metric {r['metric']!r}: only end_to_end_latency"
        elif model is None:
            reason = f"model {r['model']!r}: no diffusion pipeline in conf/model"
        elif hw is None:
            reason = f"gpu {r['gpu']!r}: no conf/hardware file of that name"
        elif why:
            reason = why
        elif size is None:
            reason = f"resolution {r['resolution']!r}: not WIDTHxHEIGHT"
        elif plan is not None and int(r["num_gpus"]) != plan.gpus:
            reason = f"num_gpus {r['num_gpus']} but the plan uses {plan.gpus}"
        frames = r.get("frames")
        out.append({"row": i, "model_name": r["model"], "gpu": r["gpu"],
                    "num_gpus": int(r["num_gpus"]), "parallel_config": r["parallel_config"],
                    "model": model or "", "hardware": hw or "",
                    "plan": plan.label() if plan else "", "family": family(plan) if plan
                    else "", "mode": mode,
                    "width": int(size.group(1)) if size else 0,
                    "height": int(size.group(2)) if size else 0,
                    "frames": int(frames) if frames == frames and frames not in ("", None)
                    else 1,
                    "steps": int(r["steps"]) if r["steps"] == r["steps"] else 0,
                    "meas_s": float(r["value"]), "reason": reason,
                    "overrides": source_overrides(r.get("source", ""), model or "")})
    return pd.DataFrame(out)


def simulate_rows(table: pd.DataFrame, cfg) -> pd.DataFrame:
    """``pred_s`` (and the stages) of every mapped row; a refused row gets its reason."""
    costs: dict[tuple, DiffusionCostModel] = {}
    preds = []
    with SimConfigContext():
        for r in table.itertuples():
            res = {"pred_s": math.nan, "encode_s": math.nan, "steps_s": math.nan,
                   "decode_s": math.nan, "execution": ""}
            if r.reason:
                preds.append(res)
                continue
            extra = [f"model.diffusion.execution={r.mode}"] if r.mode else []
            extra += list(r.overrides)
            key = (r.model, r.hardware, r.mode, r.overrides)
            try:
                if key not in costs:
                    c = compose("config", overrides=[f"model={r.model}",
                                                     f"hardware={r.hardware}",
                                                     f"backend={cfg.backend}", *extra,
                                                     *cfg.overrides])
                    costs[key] = DiffusionCostModel.from_config(plain(c))
                cost = costs[key]
                shape = JobShape(r.model, r.height, r.width, r.frames, r.steps)
                t = cost.timing(shape, parse_plan(r.plan))
                res |= {"pred_s": t.total_s, "encode_s": t.encode_s,
                        "steps_s": t.steps * t.step_s, "decode_s": t.decode_s,
                        "execution": cost.pipeline(r.model).execution}
            except ConfigError as e:
                res["refused"] = f"refused by the simulator: {e}"
            preds.append(res)
    p = pd.DataFrame(preds, index=table.index)
    table = pd.concat([table, p.drop(columns=["refused"], errors="ignore")], axis=1)
    if "refused" in p:
        table["reason"] = table["reason"].where(p["refused"].isna(), p["refused"])
    table["err_pct"] = (table["pred_s"] / table["meas_s"] - 1) * 100
    return table


def summary(done: pd.DataFrame) -> pd.DataFrame:
    """Per (model, GPU, mode): n, median absolute and signed % error."""
    g = done.groupby(["model", "hardware", "execution"])["err_pct"]
    return pd.DataFrame({"n": g.size(), "median_abs_pct": g.apply(lambda x: x.abs().median()),
                         "p90_abs_pct": g.apply(lambda x: x.abs().quantile(0.9)),
                         "signed_median_pct": g.median()}).reset_index()


def speedups(done: pd.DataFrame) -> pd.DataFrame:
    """1 -> N speed-ups per (model, GPU, mode, job shape): measured and predicted."""
    rows = []
    for (m, hw, mode, *_), g in done.groupby(["model", "hardware", "execution", "width",
                                             "height", "frames", "steps"]):
        one = g[g["num_gpus"] == 1]
        if one.empty:
            continue
        m1, p1 = float(one["meas_s"].iloc[0]), float(one["pred_s"].iloc[0])
        for r in g[g["num_gpus"] > 1].itertuples():
            ms, ps = m1 / r.meas_s, p1 / r.pred_s
            rows.append({"model": m, "hardware": hw, "execution": mode, "plan": r.plan,
                         "gpus": r.num_gpus, "measured_speedup": ms, "predicted_speedup": ps,
                         "err_pct": (ps / ms - 1) * 100})
    return pd.DataFrame(rows)


def serial_parts(done: pd.DataFrame) -> pd.DataFrame:
    """Per (model, GPU, mode, job shape) with Ulysses (or one-GPU) rows on at least three GPU
    counts: ``T(N) = serial + steps × step / N`` fitted by least squares to the measured and
    to the predicted seconds. Sequence parallelism splits the DiT's steps, not the text
    encoders or the decode, so the fit separates the two parts a whole-job error mixes (its
    serial part also takes the communication's growth with N); ``pred_encode_decode_s`` is
    the model's own serial stages on one GPU."""
    rows = []
    keys = ["model", "hardware", "execution", "width", "height", "frames", "steps"]
    for (m, hw, mode, *_, steps), g in done.groupby(keys):
        g = g[g["family"].isin(["single", "ulysses"])]
        if g["num_gpus"].nunique() < 3:
            continue
        a = np.column_stack([np.ones(len(g)), 1.0 / g["num_gpus"].to_numpy(float)])
        (ms, mb), (ps, pb) = (np.linalg.lstsq(a, g[c].to_numpy(float), rcond=None)[0]
                              for c in ("meas_s", "pred_s"))
        one = g[g["num_gpus"] == 1]
        own = float((one["encode_s"] + one["decode_s"]).iloc[0]) if len(one) else math.nan
        rows.append({"model": m, "hardware": hw, "execution": mode, "n": len(g),
                     "gpus": ",".join(str(n) for n in sorted(g["num_gpus"])),
                     "measured_serial_s": ms, "predicted_serial_s": ps,
                     "pred_encode_decode_s": own, "measured_step_s": mb / steps,
                     "predicted_step_s": pb / steps, "step_err_pct": (pb / mb - 1) * 100})
    return pd.DataFrame(rows)


def _md(df: pd.DataFrame, digits: int = 1) -> str:
    if df.empty:
        return "(none)"
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in df.itertuples(index=False):
        lines.append("| " + " | ".join(f"{v:.{digits}f}" if isinstance(v, float) else str(v)
                                       for v in r) + " |")
    return "\n".join(lines)


def read_rows(path: Path) -> pd.DataFrame:
    """The rows of a ``csv=`` file in ``xdit_dev.csv``'s layout."""
    return read_csv(path, "csv", "a diffusion benchmark CSV (xdit_dev.csv's layout)",
                    CSV_COLUMNS)


def run(cfg, outdir: Path) -> dict:
    """Map, simulate, print, write."""
    t0 = time.perf_counter()
    path = Path(cfg.csv)
    table = simulate_rows(plan_rows(read_rows(path)), cfg)
    done = table[table["reason"] == ""]
    shown = done[["model", "hardware", "plan", "execution", "width", "height", "frames",
                  "steps", "meas_s", "pred_s", "err_pct"]]
    sums, ups, serial = summary(done), speedups(done), serial_parts(done)
    parts = ["### every row (err % = (pred - meas) / meas)", _md(shown),
             "### per (model, GPU, mode)", _md(sums), "### 1 -> N speed-ups", _md(ups, 2),
             "### serial and step parts (T(N) = serial + steps x step / N, least squares "
             "over the one-GPU and Ulysses rows)", _md(serial, 2)]
    skipped = table[table["reason"] != ""]
    if len(skipped):
        parts += [f"### {len(skipped)} rows not simulated",
                  "\n".join(f"- row {r.row} ({r.model_name}, {r.gpu}, {r.parallel_config}): "
                            f"{r.reason}" for r in skipped.itertuples())]
    text = "\n\n".join(parts)
    print(text)
    doc = {"csv": str(path), "rows": len(table), "simulated": len(done),
           "per_model_gpu_mode": sums.to_dict("records"), "speedups": ups.to_dict("records"),
           "serial_parts": serial.to_dict("records"),
           "not_simulated": skipped[["row", "reason"]].to_dict("records"),
           "wall_s": round(time.perf_counter() - t0, 2)}
    outdir.mkdir(parents=True, exist_ok=True)
    atomic_write(outdir / "rows.parquet", lambda p: table.to_parquet(p, index=False))
    write_text(outdir / "validate_diffusion.json", json.dumps(doc, indent=2, default=str) + "\n")
    write_text(outdir / "validate_diffusion.md", text + "\n")
    print(f"\n{len(done)} of {len(table)} rows simulated; written to {outdir}")
    return doc


def compose_config(overrides: list[str]):
    return compose_command("validate_diffusion", ValidateDiffusionConfig, overrides)


def main(overrides: list[str] | None = None) -> int:
    """Run with ``key=value`` overrides; 0, or 2 with one line on stderr."""
    return command_main(overrides, compose_config, run)
