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

import numpy as np
import pandas as pd
import yaml
from hydra import compose
from hydra.core.config_store import ConfigStore

import conf.schema  # noqa: F401  (registers the config schemas)
import sim.builders
from analysis.inputs import read_csv
from analysis.metrics import per_request_latencies
from calibration import host_fit
from calibration.config import SimConfigContext, command_main, compose_command
from calibration.silicon_rows import calibration_file, plan_rows
from calibration.validate_report import (
    add_errors,
    error_summary,
    format_report,
    write_outputs,
)
from scenarios import WorkloadError, requests_for_seed
from sim import simulate
from sim.config.cost import HOST_FIELDS
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


# ---- simulation ------------------------------------------------------------
HARNESSES = ("burst", "ramp", "desync")
SILICON_COLUMNS = ("id", "backend", "model_path", "mode", "isl", "osl", "silicon_ttft_ms",
                   "silicon_tpot_ms")


class RowSimulator(SimConfigContext):
    """Composes and simulates planned rows inside one Hydra context, in one of the
    ``HARNESSES`` (see the module docstring)."""

    def __init__(self, requests_per_client: int, seed: int = 0, harness: str = "burst") -> None:
        self.per_client, self.seed, self.harness = requests_per_client, seed, harness

    def compose(self, plan: dict):
        """The simulator's composed config of one plan, checked (``ConfigError`` if refused).

        With ``harness=ramp``, the clients' first requests are spread evenly over one request's
        estimated latency (``request_latency_estimate``), as a benchmark's clients drift apart;
        started together, fixed-length clients would prefill and finish in lockstep forever.
        """
        c = plan["concurrency"]
        cfg = compose("config", overrides=[*plan["overrides"], f"seed={self.seed}",
                                           f"workload.num_requests={c * self.per_client}"])
        sim.builders.check_config(cfg)
        if self.harness == "ramp":
            cfg.workload.ramp_up_s = request_latency_estimate(cfg)
        return cfg

    def run(self, cfg, host: tuple[float, ...] | None = None) -> dict:
        """Simulate; steady-state mean TTFT/TPOT (ms) and step diagnostics. ``host`` (the
        ``sim.cost.host.KEYS`` coefficients) overrides the calibrated file's host block."""
        if host is not None:
            for field, value in zip(HOST_FIELDS, host, strict=True):
                setattr(cfg.cost_model, field, float(value))
        requests = requests_for_seed(cfg.workload, cfg.seed)
        if self.harness == "desync":
            requests = desynchronise(requests, request_latency_estimate(cfg))
        records = simulate(cfg, requests)
        return measure(records, trim=self.harness == "ramp" and self.per_client >= 3)


def desynchronise(requests: pd.DataFrame, spread_s: float) -> pd.DataFrame:
    """Closed-loop requests whose clients drift apart after their first request: client ``i``
    of ``C`` waits ``i/C · spread_s`` before its second request (a one-off think time; the
    first round stays a burst, TTFT and TPOT do not include think times)."""
    out = requests.copy()
    client = out["client"].to_numpy()
    clients = int(client.max()) + 1
    second = out.groupby("client").cumcount().to_numpy() == 1
    think = out["think_time_s"].to_numpy(np.float64).copy()
    think[second] += client[second] * (spread_s / clients)
    out["think_time_s"] = think
    return out


def _mean_tokens(w, side: str) -> int:
    """A planned row's mean prompt (``side="input"``) or reply length: fixed, or the middle of
    its uniform range (``calibration.silicon_rows.length_overrides``)."""
    fixed = getattr(w, f"{side}_tokens")
    if fixed is not None:
        return int(fixed)
    length = getattr(w, side)
    return int(round((length.low + length.high) / 2))


def request_latency_estimate(cfg) -> float:
    """Seconds one request of the row takes on its own terms: its prompt's prefill (in chunks
    of the token budget) plus ``osl`` decode steps of all ``concurrency`` sequences at the mean
    context. From the cost model alone; nothing measured enters."""
    cost = sim.builders.build_cost_model(sim.builders.plain(cfg))
    w = cfg.workload
    isl, osl, c = _mean_tokens(w, "input"), _mean_tokens(w, "output"), int(w.concurrency)
    budget = int(cfg.scheduler.max_num_batched_tokens)
    prefill, done = 0.0, 0
    while done < isl:
        n = min(budget, isl - done)
        prefill += cost.step_cost(np.array([n]), np.array([done])).time_s
        done += n
    ctx = np.full(c, isl + osl // 2, np.int64)
    decode = cost.step_cost(np.ones(c, np.int64), ctx).time_s
    return float(prefill + osl * decode)


def measure(records, trim: bool) -> dict:
    """Mean TTFT/TPOT over the measured requests (all of them, or with ``trim`` without each
    client's first and last), over all requests, and step diagnostics of the timeline."""
    req = records.requests
    lat = per_request_latencies(req)
    steady = lat
    if trim:
        ids = req.groupby("client")["request_id"]
        inner = (req["request_id"] != ids.transform("min")) & \
            (req["request_id"] != ids.transform("max"))
        steady = lat[lat["request_id"].isin(req.loc[inner, "request_id"])]
    tl = records.timeline
    decode = tl[tl["prefill_tokens"] == 0]
    rejected = int((req["status"] == "rejected").sum())
    return host_terms(steady, req, tl) | {
        "pred_ttft_ms": float(steady["ttft_ms"].mean()),
        "pred_tpot_ms": float(steady["tpot_ms"].mean()),
        "pred_ttft_all_ms": float(lat["ttft_ms"].mean()),
        "pred_tpot_all_ms": float(lat["tpot_ms"].mean()),
        # the rows do not say whether they report means or medians (InferenceX's own summary
        # reports medians): the medians, for comparison
        "pred_ttft_median_ms": float(steady["ttft_ms"].median()),
        "pred_tpot_median_ms": float(steady["tpot_ms"].median()),
        "steady_requests": len(steady),
        "pred_decode_step_ms": float(decode["step_time_s"].median() * 1e3)
        if len(decode) else float("nan"),
        "pred_decode_batch": float(decode["batch_size"].mean()) if len(decode) else float("nan"),
        "pred_host_share": float(tl["host_s"].sum() / tl["step_time_s"].sum()),
        "sim_note": f"{rejected} rejected" if rejected else "",
    }


def host_terms(steady: pd.DataFrame, req: pd.DataFrame, tl: pd.DataFrame) -> dict:
    """How the steady-state means depend on the host costs: the mean number of steps
    (``<m>_steps``), of sequence-steps (``<m>_seq_steps``, summed batch sizes), of new-request
    steps (``<m>_new_steps``, requests first scheduled in them) and of token-steps
    (``<m>_token_steps``, summed scheduled tokens) inside each request's TTFT and inside its
    decode span per output token. In a closed loop the schedule does not depend on step
    durations, so the means are exactly linear in the four coefficients
    (``calibration.host_fit``)."""
    if not len(steady):
        return {c: float("nan") for c in host_fit.term_columns()}
    ends = (tl["time_s"] + tl["step_time_s"]).to_numpy()
    order = np.argsort(ends, kind="stable")
    ends = ends[order]
    started = np.isin(tl["time_s"].to_numpy(), req["first_scheduled_s"].dropna().to_numpy())
    new = np.zeros(len(tl))
    if started.any():  # a step's new requests: those first scheduled at its start
        firsts = req["first_scheduled_s"].value_counts()
        new[started] = firsts.loc[tl["time_s"].to_numpy()[started]].to_numpy()
    per_step = {"seq_steps": tl["batch_size"].to_numpy(), "new_steps": new,
                "token_steps": tl["scheduled_tokens"].to_numpy()}
    cum = {k: np.concatenate([[0], np.cumsum(v[order])]) for k, v in per_step.items()}
    r = req.set_index("request_id").loc[steady["request_id"]]
    eps = 1e-9  # an arrival is the end of the step that completed the client's previous request
    per_tok = 1.0 / np.maximum(r["generated_tokens"].to_numpy() - 1, 1)
    out = {}
    for m, (t0, t1), weight in (("ttft", ("arrival_s", "first_token_s"), 1.0),
                                ("tpot", ("first_token_s", "completion_s"), per_tok)):
        i0 = np.searchsorted(ends, r[t0].to_numpy() + eps, side="right")
        i1 = np.searchsorted(ends, r[t1].to_numpy() + eps, side="right")
        out[f"{m}_steps"] = float(((i1 - i0) * weight).mean())
        for k, c in cum.items():
            out[f"{m}_{k}"] = float(((c[i1] - c[i0]) * weight).mean())
    return out


def simulate_plans(plans: pd.DataFrame, simulator: RowSimulator,
                   host: dict[str, tuple[float, float]] | None = None) -> pd.DataFrame:
    """Simulate every plan without a reason (``host`` per backend overrides the calibrated host
    block); a config the simulator refuses becomes the row's reason."""
    out = []
    for plan in plans.to_dict("records"):
        res: dict[str, Any] = {}
        if not plan["reason"]:
            try:
                cfg = simulator.compose(plan)
                res = simulator.run(cfg, (host or {}).get(plan["backend"]))
            except (ConfigError, WorkloadError) as e:
                res = {"reason": f"refused by the simulator: {e}"}
            except RuntimeError as e:  # a stalled simulation
                res = {"reason": f"simulation failed: {e}"}
        note = "; ".join(x for x in (plan["note"], res.pop("sim_note", "")) if x)
        out.append(plan | res | {"note": note})
    table = pd.DataFrame(out)
    for col in ("pred_ttft_ms", "pred_tpot_ms", "pred_ttft_all_ms", "pred_tpot_all_ms",
                "pred_ttft_median_ms", "pred_tpot_median_ms", "steady_requests",
                "pred_decode_step_ms", "pred_decode_batch", "pred_host_share",
                *host_fit.term_columns()):
        table[col] = table[col].astype(float) if col in table else np.nan
    return table


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
    before = add_errors(simulate_plans(plans, simulator, current))
    fits = host_fit.fit_backends(before, current, cfg.held_out_fraction, cfg.seed,
                                 tuple(cfg.host_keys))
    hosts = {b: host_fit.coefficients(f) for b, f in fits.items()}
    table = add_errors(simulate_plans(plans, simulator, hosts))
    host_fit.verify(fits, table, before, current)
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
