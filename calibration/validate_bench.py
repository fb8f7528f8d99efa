"""``python -m calibration validate gpustack_csv=PATH``: replay measured ``vllm bench serve``
runs as their client ran them (``calibration.bench_replay``) and report the error of every
metric per backend, on all runs and on the runs of models held out of the frontend fit, and
predicted ÷ measured request throughput per model (where the error lives).

``fit_frontend=true`` first fits each backend's frontend costs (``calibration.frontend_fit``)
on the runs of the models not held out and writes them into the backend's calibrated file
(``write_frontend=false``: report only); the split is whatever the calibrated file's
``frontend:`` block records. ``fit_compute=true`` fits each backend's compute speed too: with
``fit_frontend=true`` jointly with the frontend costs (one fit), else alone with the
calibrated frontend on the runs of its training models (``calibration.compute_fit``); it
writes the calibrated file's ``compute:`` block with ``write_compute=true`` (default: report
only; the shipped files carry none, docs/fidelity.md says why).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import yaml

from analysis.files import atomic_write, write_text
from calibration import compute_fit, frontend_fit
from calibration.bench_replay import (
    error_table,
    format_error_table,
    format_ratio_table,
    format_split_tables,
    model_ratio_table,
    plan_run,
    replay,
)
from calibration.bench_runs import read_gpustack
from calibration.host_fit import write_block
from calibration.silicon_rows import calibration_file


def calibrated_frontend(hardware: str, backend: str) -> dict:
    """The backend's calibrated ``frontend:`` block ({} where there is none)."""
    path = calibration_file(hardware, backend)
    doc = yaml.safe_load(path.read_text()) if path.is_file() else {}
    return doc.get("frontend") or {}


def held_out_of(hardware: str, backend: str) -> list[str]:
    """The models the backend's calibrated ``frontend:`` block held out of its fit."""
    return list(calibrated_frontend(hardware, backend).get("held_out_models") or [])


def fit_compute(runs, backend: str, cfg, joint: dict | None = None) -> dict:
    """``backend``'s compute scale: the one the joint fit ``joint`` (``fit_frontend=true``)
    just made (its tables are the frontend fit's), else fitted alone on the runs of the
    models the calibrated frontend was trained on, with its before/after tables printed;
    ``write_compute``: write its ``compute:`` block."""
    split = "the frontend fit's split (whole models)"
    if joint is None:
        print(f"fitting the {backend} compute scale ...", flush=True)
        models = held_out_of(cfg.hardware, backend)
        held = {r.id for r in runs if r.backend == backend
                and plan_run(r, cfg.hardware)["model"] in models}
        fit = compute_fit.fit_compute_scale(runs, backend, cfg.hardware, held, cfg.max_evals,
                                            cfg.n_jobs)
        block = compute_fit.compute_block(
            fit["scale"], fit["after"], Path(cfg.gpustack_csv).name, split, models,
            f"{compute_fit.SCALAR_METHOD}, with the calibrated frontend")
        print(format_split_tables({"before (scale 1)": fit["before"],
                                   f"after (scale {fit['scale']})": fit["after"]},
                                  f"the {backend} compute fit"))
    else:
        block = compute_fit.compute_block(
            joint["compute_scale"], joint["after"], Path(cfg.gpustack_csv).name, split,
            joint["held_out_models"], compute_fit.JOINT_METHOD)
    if cfg.write_compute:
        write_block(calibration_file(cfg.hardware, backend), "compute", block)
        block["written_to"] = str(calibration_file(cfg.hardware, backend))
    return block


def run(cfg, outdir: Path) -> dict:
    """Fit (optionally), replay, report, write ``validate.json`` and ``runs.parquet``."""
    t0 = time.perf_counter()
    runs = read_gpustack(cfg.gpustack_csv)
    if cfg.backend is not None:
        runs = [r for r in runs if r.backend == cfg.backend]
    doc: dict[str, Any] = {"gpustack_csv": str(cfg.gpustack_csv), "hardware": cfg.hardware}
    backends = sorted({r.backend for r in runs})
    fronts: dict[str, dict] = {}
    if cfg.fit_frontend:
        doc["frontend_fit"] = {}
        for b in backends:
            print(f"fitting the {b} frontend ...", flush=True)
            # the calibrated block's split and discipline are kept, so that a refit's
            # held-out models stay unseen (a split drawn afresh moves as models are added)
            shipped = calibrated_frontend(cfg.hardware, b)
            held = shipped.get("held_out_models")
            fit = fronts[b] = frontend_fit.fit_frontend(
                runs, b, cfg.hardware, cfg.held_out_fraction, cfg.seed, cfg.max_evals,
                cfg.n_jobs, compute_scale=1.0 if cfg.fit_compute else None,
                held_out=held, discipline=shipped)
            block = frontend_fit.frontend_block(
                fit, Path(cfg.gpustack_csv).name, cfg.held_out_fraction, cfg.seed,
                split=None if held is None else shipped.get("split"))
            doc["frontend_fit"][b] = {k: v for k, v in block.items()}
            print(format_split_tables({"before (no frontend)": fit["before"],
                                       "after": fit["after"]}, f"the {b} frontend fit"))
            if cfg.write_frontend:
                write_block(calibration_file(cfg.hardware, b), "frontend", block)
                doc["frontend_fit"][b]["written_to"] = str(calibration_file(cfg.hardware, b))
            if cfg.fit_compute:  # the pair fitted together is written together
                doc.setdefault("compute_fit", {})[b] = fit_compute(runs, b, cfg, fit)
    if cfg.fit_compute and not cfg.fit_frontend:
        doc["compute_fit"] = {b: fit_compute(runs, b, cfg) for b in backends}
    table = replay(runs, cfg.hardware)
    held = {b: held_out_of(cfg.hardware, b) for b in backends}
    table["split"] = [("held_out" if m in held.get(b, []) else "train")
                      for b, m in zip(table["backend"], table["model"], strict=True)]
    done = table[table["reason"] == ""]
    report = [format_error_table(error_table(done), "every simulated run"),
              format_error_table(error_table(done[done["split"] == "held_out"]),
                                 "runs of models held out of the frontend fit"),
              format_ratio_table(model_ratio_table(done), "predicted / measured request "
                                 "throughput by model (every simulated run)")]
    print("\n\n".join(report))
    skipped = table[table["reason"] != ""]
    if len(skipped):
        print(f"\n{len(skipped)} runs not simulated:")
        for r in skipped.itertuples():
            print(f"  {r.id} {r.backend} {r.model_path}: {r.reason}")
    doc |= {"runs": len(table), "simulated": len(done), "held_out_models": held,
            "errors": error_table(done).to_dict("records"),
            "held_out_errors": error_table(done[done["split"] == "held_out"]).to_dict("records"),
            "throughput_ratio_by_model": model_ratio_table(done).to_dict("records"),
            "not_simulated": skipped[["id", "reason"]].to_dict("records"),
            "wall_s": round(time.perf_counter() - t0, 1)}
    outdir.mkdir(parents=True, exist_ok=True)
    atomic_write(outdir / "runs.parquet", lambda p: table.to_parquet(p, index=False))
    write_text(outdir / "validate.json", json.dumps(doc, indent=2, default=str) + "\n")
    write_text(outdir / "validate.md", "\n\n".join(report) + "\n")
    print(f"\n{len(done)} of {len(table)} runs simulated in {doc['wall_s']} s; written to "
          f"{outdir}/validate.json, validate.md and runs.parquet")
    return doc
