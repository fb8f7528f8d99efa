"""``python -m calibration from-bench results=[PATH,...] model=NAME backend=NAME``: make the
simulator match your own deployment before you trust its forecasts.

Reads the result files that ``vllm bench serve --save-result`` (or SGLang's
``bench_serving``) wrote for one deployment (``calibration.bench_runs.read_result_file``),
replays each run as its client ran it (``calibration.bench_replay``), fits the backend's
frontend costs and its per-step host overhead with scipy on the runs not held out
(``calibration.frontend_fit``; every ``held_out_every``-th run is held out), with
``fit_compute=true`` jointly with the deployment's compute speed (``cost_model.compute_scale``:
one scale of every FLOP roof; fitted together so that the frontend costs do not absorb a slow
GPU, nor the scale a slow frontend), and writes a copy of the backend's
calibrated file with the fitted ``frontend:`` and ``host:`` (and ``compute:``) blocks. Select it
in any later run with ``cost_model.calibration=PATH``. Prints the error before and after,
on the training runs and on the held-out ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from analysis.files import write_text
from analysis.inputs import output_file
from calibration import compute_fit, frontend_fit
from calibration.bench_replay import format_split_tables, prefix_caching_override
from calibration.bench_runs import read_result_file
from calibration.config import command_main, compose_command
from calibration.host_fit import write_block
from calibration.silicon_rows import calibration_file
from sim.config.backend import BACKENDS, FRONTEND_CHOICES, frontend_discipline
from sim.errors import ConfigError


@dataclass
class FromBenchConfig:
    """Keys of ``python -m calibration from-bench`` (``conf/calibration/from_bench.yaml``)."""

    defaults: list[Any] = field(default_factory=list)
    results: list[str] = MISSING
    model: str = MISSING
    hardware: str = "h100_sxm"
    backend: str = "vllm"
    tensor_parallel_size: int = 1
    overrides: list[str] = field(default_factory=list)
    held_out_every: int = 3
    # fit the deployment's compute speed too, jointly (cost_model.compute_scale)
    fit_compute: bool = False
    max_evals: int = 30
    n_jobs: int = 2
    out: str | None = None


ConfigStore.instance().store(name="base_from_bench", node=FromBenchConfig)


def check(cfg) -> None:
    """Every key in range; one message naming the first bad one."""
    if cfg.backend not in BACKENDS:
        raise ConfigError("backend", cfg.backend, f"one of {list(BACKENDS)}")
    if not cfg.results:
        raise ConfigError("results", list(cfg.results), "one or more result files")
    for path in cfg.results:
        if not Path(path).is_file():
            raise ConfigError("results", path, "not a file")
    for key in ("tensor_parallel_size", "max_evals", "n_jobs"):
        if cfg[key] < 1:
            raise ConfigError(key, cfg[key], "must be >= 1")
    if cfg.held_out_every < 0:
        raise ConfigError("held_out_every", cfg.held_out_every, "must be >= 0 (0: none)")
    if cfg.out:
        output_file(cfg.out, "out")


def deployment_overrides(cfg) -> list[str]:
    """The simulator overrides of the deployment the results were measured on: the engine
    with its default prefix caching (``bench_replay.prefix_caching_override``) unless the
    user's ``overrides`` set it."""
    engine = [] if any(str(o).startswith("kv_cache.prefix_caching=") for o in cfg.overrides) \
        else [prefix_caching_override(cfg.backend)]
    return [f"model={cfg.model}", f"hardware={cfg.hardware}", f"backend={cfg.backend}",
            f"scheduler={cfg.backend}",
            f"cluster.tensor_parallel_size={cfg.tensor_parallel_size}", "slo=none",
            "plots=false", "progress=false", *engine, *cfg.overrides]


def user_discipline(overrides) -> SimpleNamespace:
    """The frontend's admission and streaming as the user's ``overrides`` set them (None where
    they do not), which the fit keeps rather than the calibrated file's."""
    keys = {f"backend.frontend.{k}": k for k in FRONTEND_CHOICES}
    given = {keys[k]: v for k, _, v in (str(o).partition("=") for o in overrides) if k in keys}
    return SimpleNamespace(**{k: given.get(k) for k in FRONTEND_CHOICES})


def run(cfg, outdir: Path) -> dict:
    """Read, fit, report and write; the fit's summary."""
    runs = [read_result_file(p, cfg.backend, cfg.model) for p in cfg.results]
    overrides = deployment_overrides(cfg)
    for r in runs:
        r.overrides, r.tp = overrides, cfg.tensor_parallel_size
    k = cfg.held_out_every
    held = {r.id for i, r in enumerate(runs) if k and i % k == k - 1 and len(runs) > 1}
    base = calibration_file(cfg.hardware, cfg.backend)
    doc = yaml.safe_load(base.read_text())
    host_ms = float((doc.get("host") or {}).get("overhead_ms", 0.5))
    fit = frontend_fit.fit_frontend(runs, cfg.backend, cfg.hardware, max_evals=cfg.max_evals,
                                    n_jobs=cfg.n_jobs, held_out_runs=held, host_ms=host_ms,
                                    compute_scale=1.0 if cfg.fit_compute else None,
                                    discipline=frontend_discipline(
                                        cfg.backend, doc.get("frontend") or {},
                                        user_discipline(cfg.overrides)))
    print(format_split_tables({"before": fit["before"], "after": fit["after"]}, "the fit"))
    out = Path(cfg.out) if cfg.out else outdir / f"{cfg.backend}.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text(out, base.read_text())
    block = frontend_fit.frontend_block(fit, ", ".join(Path(p).name for p in cfg.results),
                                        0.0, 0)
    block["split"] = (f"every {k}th result file held out: {sorted(held)}" if held
                      else "no run held out")
    write_block(out, "frontend", block)
    host = dict(doc.get("host") or {})
    host.update(overhead_ms=fit["host_overhead_ms"], fitted_on=date.today().isoformat(),
                method="python -m calibration from-bench (with the frontend costs"
                       f"{'' if fit['compute_scale'] is None else ' and the compute scale'})",
                data=block["data"])
    write_block(out, "host", host)
    scale = fit["compute_scale"]
    if scale is not None:
        write_block(out, "compute", compute_fit.compute_block(
            scale, fit["after"], block["data"], block["split"], [],
            compute_fit.JOINT_METHOD))
    print(f"\nfitted {fit['costs']} and host overhead {fit['host_overhead_ms']} ms"
          f"{'' if scale is None else f' and compute scale {scale}'} on "
          f"{len(fit['train_runs'])} runs; written to {out}\n"
          f"use it with: python -m sim ... cost_model.calibration={out}")
    return {"costs": fit["costs"], "host_overhead_ms": fit["host_overhead_ms"],
            "compute_scale": scale, "written_to": str(out)}


def compose_config(overrides: list[str]):
    """The composed config and its run directory."""
    return compose_command("from_bench", FromBenchConfig, overrides)


def main(overrides: list[str] | None = None) -> int:
    """Run with ``key=value`` overrides; 0, or 2 with one line on stderr."""
    return command_main(overrides, compose_config, lambda cfg, outdir: (check(cfg),
                                                                        run(cfg, outdir)))
