"""``python -m calibration validate``: the simulator against measured serving benchmarks.

    python -m calibration validate silicon_csv=PATH hardware=h100_sxm [backend=NAME]
        [models=[a,b]] [limit=N] [harness=burst|ramp|desync] [requests_per_client=10]
        [fit_host=true] [host_keys=[overhead_ms,per_seq_us,per_new_request_us,per_token_us]]
    python -m calibration validate gpustack_csv=PATH [backend=NAME] [fit_frontend=true]
        [fit_compute=true] (both: one joint fit, with write_frontend=false or
        write_compute=true)
        (``vllm bench serve`` runs replayed as their client ran them:
        ``calibration.validate_bench``)

Every row of a CSV in the layout of aiconfigurator's ``silicon_sample_h100.csv`` is a closed-loop
benchmark: ``concurrency`` clients, each sending its next request when the previous one
completes, every request ``isl`` prompt and ``osl`` output tokens.
``calibration.silicon_rows.plan_rows`` maps each row to the project's config (the model whose
``hf_id`` matches ``model_path``, the row's backend and its scheduler, its parallel layout and
dtype), or gives the reason it cannot be simulated.
Each supported row is simulated with ``requests_per_client`` requests per client, in one of two
harnesses (``harness=``):

- ``burst`` (the default) imitates the benchmark tools these rows come from (AIPerf/GenAI-Perf
  with ``--concurrency C --request-count 10·C``, the assumption aiconfigurator states for its
  own agg TTFT estimate): every client sends its first request at t=0, and the prediction is the
  mean over all requests, the first round's burst included, as the tool reports its average.
- ``ramp``: the clients' first requests are spread evenly over one request's estimated latency
  and, with 3 or more requests per client, each client's first (cold start) and last (drain)
  requests are not measured: the steady state of desynchronised clients.
- ``desync``: the first round is a burst as in ``burst``, then the clients drift apart: client
  ``i``'s second request waits ``i/C`` of one request's estimated latency, so later rounds run
  desynchronised, as they do in a long benchmark whose clients' per-request jitter (tokenising,
  network, client scheduling) spreads completions that the simulator's deterministic clients
  never spread. Mean over all requests.

Fixed-length clients started together stay in lockstep (a round's prompts are prefilled in the
same steps), so ``burst`` and ``ramp`` bracket the real phasing; the data does not record it.
The rows of SemiAnalysis InferenceX's exports (``silicon_data_source`` ``source_file=<date>.csv``
or ``db-dump/…``) record their client instead: a fork of vLLM's ``benchmark_serving.py`` run
with ``--random-range-ratio 0.8``, which draws every prompt and reply length uniformly from
``[int(0.8·L), L]``; those rows are simulated with those lengths
(``calibration.silicon_rows.range_ratio_of``), and their clients drift apart as real ones do.
The TensorRT-LLM and vLLM rows of aiconfigurator's own gap analysis run the deployment its
generator writes for the row's batch size: a token budget of batch + isl + 1500 (about one new
prompt per step, which spreads the clients after the first round) behind Dynamo's frontend,
not modelled (``calibration.silicon_rows.generated_deployment_overrides``).
Measured TTFT/TPOT may be means or medians (the data does not say); we compare the mean.

Printed (``calibration.validate_report``): every row's predicted and measured TTFT and TPOT
with the signed error ``(pred − meas) / meas``, the median and p90 absolute % error per backend
and metric, the worst rows, and the rows not simulated with their reasons. Written to the run's
output dir:
``validate.json`` and ``rows.parquet``. ``fit_host=true`` first fits the host costs per
backend (``calibration.host_fit``: the ``host_keys`` coefficients of ``sim.cost.host``) and
validates with the fitted values.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from hydra.core.config_store import ConfigStore

import conf.schema  # noqa: F401  (registers the config schemas)
from analysis.inputs import read_csv
from calibration import host_fit
from calibration.config import command_main, compose_command
from calibration.silicon_replay import HARNESSES, RowSimulator, simulate_plans
from calibration.silicon_rows import calibration_file, plan_rows
from calibration.validate_report import (
    add_errors,
    error_summary,
    format_report,
    write_outputs,
)
from sim.cost.host import KEYS as HOST_KEYS
from sim.errors import ConfigError


@dataclass
class ValidateConfig:
    """Keys of ``python -m calibration validate`` (see ``conf/calibration/validate.yaml``)."""

    defaults: list[Any] = field(default_factory=list)
    silicon_csv: str | None = None
    gpustack_csv: str | None = None
    hardware: str = "h100_sxm"
    backend: str | None = None
    models: list[str] | None = None
    ids: list[str] | None = None
    limit: int | None = None
    requests_per_client: int = 10
    harness: str = "burst"
    seed: int = 0
    worst: int = 10
    fit_host: bool = False
    # the host coefficients fit_host fits (the others keep their calibrated values)
    host_keys: list[str] = field(default_factory=lambda: list(HOST_KEYS))
    held_out_fraction: float = 0.3
    write_host: bool = True
    fit_frontend: bool = False
    write_frontend: bool = True
    fit_compute: bool = False
    write_compute: bool = False
    max_evals: int = 40
    n_jobs: int = 2


ConfigStore.instance().store(name="base_validate", node=ValidateConfig)


SILICON_COLUMNS = ("id", "backend", "model_path", "mode", "isl", "osl", "silicon_ttft_ms",
                   "silicon_tpot_ms")


def check(cfg) -> None:
    """Every key in range; one message naming the first bad one."""
    if (cfg.silicon_csv is None) == (cfg.gpustack_csv is None):
        raise ConfigError("silicon_csv", cfg.silicon_csv,
                          "give exactly one of silicon_csv=PATH and gpustack_csv=PATH")
    key = "silicon_csv" if cfg.silicon_csv is not None else "gpustack_csv"
    if not Path(cfg[key]).is_file():
        raise ConfigError(key, cfg[key], "not a file")
    for key in ("fit_frontend", "fit_compute"):
        if cfg[key] and cfg.gpustack_csv is None:
            raise ConfigError(key, True, "needs gpustack_csv=PATH (measured runs)")
    if cfg.fit_frontend and cfg.fit_compute and cfg.write_frontend != cfg.write_compute:
        # a jointly fitted pair holds only together: one without the other in a file
        # would predict with costs fitted for another compute speed
        raise ConfigError("write_compute", cfg.write_compute,
                          f"fit_frontend=true fit_compute=true fit the frontend and the "
                          f"compute scale jointly: write_frontend (={cfg.write_frontend}) and "
                          f"write_compute must agree")
    if cfg.max_evals < 1 or cfg.n_jobs < 1:
        raise ConfigError("max_evals" if cfg.max_evals < 1 else "n_jobs",
                          min(cfg.max_evals, cfg.n_jobs), "must be >= 1")
    if cfg.backend is not None and cfg.backend not in ("vllm", "sglang", "trtllm"):
        raise ConfigError("backend", cfg.backend, "one of ['vllm', 'sglang', 'trtllm'] or null")
    if cfg.harness not in HARNESSES:
        raise ConfigError("harness", cfg.harness, f"one of {list(HARNESSES)}")
    if cfg.requests_per_client < 1:
        raise ConfigError("requests_per_client", cfg.requests_per_client, "must be >= 1")
    if cfg.limit is not None and cfg.limit < 1:
        raise ConfigError("limit", cfg.limit, "must be >= 1 or null")
    if not 0.0 < cfg.held_out_fraction < 1.0:
        raise ConfigError("held_out_fraction", cfg.held_out_fraction, "must be in (0, 1)")
    if cfg.worst < 0:
        raise ConfigError("worst", cfg.worst, "must be >= 0")
    if cfg.seed < 0:
        raise ConfigError("seed", cfg.seed, "an integer >= 0")
    if not cfg.host_keys or not set(cfg.host_keys) <= set(HOST_KEYS):
        raise ConfigError("host_keys", list(cfg.host_keys),
                          f"a non-empty list of {list(HOST_KEYS)}")


def select_rows(df: pd.DataFrame, cfg) -> pd.DataFrame:
    """The CSV rows the filters keep (``backend``, ``ids``, ``limit``; ``models`` is applied to
    the plans, since it names conf models rather than CSV values)."""
    if cfg.backend is not None:
        df = df[df["backend"] == cfg.backend]
    if cfg.ids is not None:
        df = df[df["id"].isin(list(cfg.ids))]
    return df.reset_index(drop=True)


def run(cfg, outdir: Path) -> dict:
    """Plan, optionally fit the host overheads, simulate, report and write; the json document."""
    t0 = time.perf_counter()
    rows = select_rows(read_csv(cfg.silicon_csv, "silicon_csv", "a silicon benchmark CSV "
                                "(aiconfigurator's silicon_sample layout)", SILICON_COLUMNS),
                       cfg)
    plans = plan_rows(rows, cfg.hardware, list(cfg.models) if cfg.models else None)
    if cfg.limit is not None:
        plans = plans.head(cfg.limit).reset_index(drop=True)
    doc: dict[str, Any] = {"silicon_csv": str(cfg.silicon_csv), "hardware": cfg.hardware,
                           "harness": cfg.harness,
                           "requests_per_client": cfg.requests_per_client}
    with RowSimulator(cfg.requests_per_client, cfg.seed, cfg.harness) as simulator:
        if cfg.fit_host:
            fits, table = _fit_host(plans, simulator, cfg)
            doc["host_fit"] = fits
        else:
            table = add_errors(simulate_plans(plans, simulator))
    summary = error_summary(table)
    print(format_report(table, summary, cfg.worst))
    if cfg.fit_host:
        print("\n" + host_fit.format_fits(doc["host_fit"]))
    doc |= {"rows": len(table), "simulated": int(table["pred_ttft_ms"].notna().sum()),
            "summary": summary,
            "unsupported": table.loc[table["reason"] != "", ["id", "reason"]]
            .to_dict("records"),
            "wall_s": round(time.perf_counter() - t0, 1)}
    write_outputs(outdir, table, doc)
    print(f"\n{doc['simulated']} of {len(table)} rows simulated in {doc['wall_s']} s; "
          f"written to {outdir}/validate.json and rows.parquet")
    return doc


def _fit_host(plans: pd.DataFrame, simulator: RowSimulator, cfg) -> tuple[dict, pd.DataFrame]:
    """Simulate with the current host values, fit per backend, re-simulate every row with the
    fitted values, and (``write_host``) write them; the fits and the final table."""
    backends = sorted(plans.loc[plans["reason"] == "", "backend"].unique())
    files = {b: calibration_file(cfg.hardware, b) for b in backends}
    current = {}
    for b, path in files.items():
        current[b] = host_fit.coefficients(yaml.safe_load(path.read_text()).get("host") or {})
    profiles: dict[str, pd.DataFrame] = {}
    before = add_errors(simulate_plans(plans, simulator, current, profiles))
    fits, skipped = host_fit.fit_backends(before, current, cfg.held_out_fraction, cfg.seed,
                                          tuple(cfg.host_keys), profiles)
    for b, why in skipped.items():
        print(f"host fit: {b} not fitted: {why}")
    hosts = {b: host_fit.coefficients(f) for b, f in fits.items()}
    table = add_errors(simulate_plans(plans, simulator, hosts))
    host_fit.verify(fits, table, before, current, profiles)
    for b, f in fits.items():
        if cfg.write_host:
            host_fit.write_host(files[b], host_fit.host_block(
                f, cfg.held_out_fraction, cfg.seed, cfg.silicon_csv,
                f"{cfg.harness}, {cfg.requests_per_client} requests per client"))
            f["written_to"] = str(files[b])
    return fits, table


def compose_config(overrides: list[str]):
    """The composed validate config and its run directory (``hydra.run.dir`` may be overridden)."""
    return compose_command("validate", ValidateConfig, overrides)


def _check_and_run(cfg, outdir: Path) -> None:
    check(cfg)
    if cfg.gpustack_csv is not None:
        from calibration import validate_bench

        validate_bench.run(cfg, outdir)
    else:
        run(cfg, outdir)


def main(overrides: list[str] | None = None) -> int:
    """Run the command with ``key=value`` overrides; 0, or 2 with one line on stderr."""
    return command_main(overrides, compose_config, _check_and_run)


if __name__ == "__main__":
    raise SystemExit(main())
