"""End-to-end fidelity check: the simulator against measured serving benchmarks (silicon).

    python -m calibration.validate_silicon \
        [--data ../shared/data/aiconfigurator/silicon_sample_h100.csv] [--model llama3_8b] \
        [--out results.csv] [--num-requests-per-client 8] [--rows K]

Each row of aiconfigurator's ``silicon_sample_h100.csv`` with ``mode == "agg"`` whose
``model_path`` names the model (``conf/model/<model>.yaml``'s ``hf_id`` without the org and
the ``-Instruct`` suffix, e.g. ``Llama-3.1-8B``) is a closed-loop benchmark: ``concurrency``
clients, each sending its next request as soon as the previous one completes, every request
with ``isl`` prompt tokens and ``osl`` output tokens, on one replica with ``tp_size`` GPUs.
The concurrency is ``silicon_concurrency=N`` from ``silicon_data_source`` when present, else
``batch_size × attention_dp_size`` (NaN attention DP → 1).

Each row is simulated through the project's own Hydra config (``model=<model>
hardware=h100_sxm workload=closed_loop``, fixed lengths, no think time, ``slo=none``,
``seed=0``) with ``concurrency × num_requests_per_client`` requests. All clients arrive
together at t=0, so each client's first request is a cold start the benchmark does not
resemble, and each client's last request runs while the batch drains (TPOT flattered);
predicted TTFT and TPOT are means over the requests in between (steady state).

Caveats, stated in the printed header too:

- The silicon data does not document whether ``silicon_ttft_ms`` / ``silicon_tpot_ms`` are
  means or medians; we compare with the simulated **mean**.
- The Llama-3.1-8B rows are all **TensorRT-LLM** measurements, while our scheduler imitates
  **vLLM** (``scheduler=vllm``: token budget 8192, chunked prefill) and the cost model is
  calibrated on vLLM's op tables; differences in batching policy and kernels show up here
  as error.

Per row it prints the predicted and measured TTFT and TPOT and the signed % error
``(predicted − measured) / measured``, then the median absolute % error overall, per backend,
per ``tp_size`` and per concurrency, and writes the per-row table to ``--out`` as CSV.
Nothing is fitted or tuned here.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

import sim.app  # noqa: F401  (registers the config schemas with Hydra's ConfigStore)
from analysis.metrics import per_request_latencies, summarize
from scenarios import WorkloadError, requests_for_seed
from sim import Records, simulate
from sim.builders import check_config
from sim.errors import ConfigError

DEFAULT_DATA = "../shared/data/aiconfigurator/silicon_sample_h100.csv"
HARDWARE = "h100_sxm"
HEADER = (
    "Simulator vs silicon (aiconfigurator silicon_sample, {hardware}); model {model}.\n"
    "NOTE: measured rows are {backends} benchmarks; our scheduler imitates vLLM.\n"
    "NOTE: silicon TTFT/TPOT may be means or medians (undocumented); predicted = mean over\n"
    "      steady-state requests (each client's first and last requests excluded).\n"
    "err% = (predicted - measured) / measured * 100."
)
COLUMNS = [
    "id", "backend", "backend_version", "isl", "osl", "concurrency", "tp_size",
    "pred_ttft_ms", "meas_ttft_ms", "ttft_err_pct",
    "pred_tpot_ms", "meas_tpot_ms", "tpot_err_pct",
    "pred_ttft_all_ms", "pred_tpot_all_ms", "steady_requests", "note",
]
BACKEND_NAMES = {"trtllm": "TensorRT-LLM", "vllm": "vLLM", "sglang": "SGLang"}
_CONCURRENCY = re.compile(r"silicon_concurrency=(\d+)")


def model_key(hf_id: str) -> str:
    """The substring of ``model_path`` that names a model: ``org/Name-Instruct`` → ``Name``."""
    name = hf_id.split("/")[-1]
    return name.removesuffix("-Instruct")


def concurrency_of(rows: pd.DataFrame) -> pd.Series:
    """Closed-loop client count per row: ``silicon_concurrency=N`` if stated, else
    ``batch_size × attention_dp_size`` (NaN attention DP counts as 1)."""
    stated = rows["silicon_data_source"].astype(str).str.extract(_CONCURRENCY)[0].astype(float)
    dp = rows["attention_dp_size"].fillna(1.0) if "attention_dp_size" in rows else 1.0
    derived = rows["batch_size"].astype(float) * dp
    return stated.fillna(derived).round().astype(int)


def load_rows(path: Path, key: str) -> pd.DataFrame:
    """The aggregated-serving rows of ``path`` whose ``model_path`` contains ``key``."""
    df = pd.read_csv(path)
    rows = df[df["model_path"].astype(str).str.contains(key, regex=False)
              & (df["mode"] == "agg")].copy()
    rows["concurrency"] = concurrency_of(rows)
    return rows.reset_index(drop=True)


def compose_row(model: str, tp: int, concurrency: int, per_client: int, isl: int, osl: int):
    """The project's composed config of one closed-loop row (needs an initialized Hydra)."""
    from hydra import compose

    return compose("config", overrides=[
        f"model={model}", f"hardware={HARDWARE}", f"cluster.tensor_parallel_size={tp}",
        "workload=closed_loop", f"workload.concurrency={concurrency}",
        f"workload.num_requests={concurrency * per_client}",
        f"workload.input_tokens={isl}", f"workload.output_tokens={osl}",
        "workload.think_time_s=0", "slo=none", "seed=0",
    ])


def steady_state(records: Records) -> pd.DataFrame:
    """Per-request latencies without each client's first (cold start) and last (drain)."""
    req = records.requests
    ids = req.groupby("client")["request_id"]
    keep = req[(req["request_id"] != ids.transform("min"))
               & (req["request_id"] != ids.transform("max"))]
    return per_request_latencies(keep)


def simulate_row(cfg) -> dict:
    """Simulate one composed row; steady-state and all-request mean TTFT/TPOT in ms."""
    check_config(cfg)
    requests = requests_for_seed(cfg.workload, cfg.seed)
    records = simulate(cfg, requests)
    s = summarize(records)
    lat = steady_state(records)
    n_rejected = int((records.requests["status"] == "rejected").sum())
    return {
        "pred_ttft_ms": float(lat["ttft_ms"].mean()) if len(lat) else float("nan"),
        "pred_tpot_ms": float(lat["tpot_ms"].mean()) if len(lat) else float("nan"),
        "pred_ttft_all_ms": s["mean_ttft_ms"], "pred_tpot_all_ms": s["mean_tpot_ms"],
        "steady_requests": len(lat),
        "note": f"{n_rejected} rejected" if n_rejected else "",
    }


def run_rows(rows: pd.DataFrame, model: str, per_client: int) -> pd.DataFrame:
    """Simulate every row; returns the result table (columns ``COLUMNS``)."""
    from hydra import initialize_config_module

    out = []
    with initialize_config_module("conf", version_base=None):
        for r in rows.itertuples(index=False):
            tp, c, isl, osl = int(r.tp_size), int(r.concurrency), int(r.isl), int(r.osl)
            base = {"id": r.id, "backend": r.backend, "backend_version": r.backend_version,
                    "isl": isl, "osl": osl, "concurrency": c, "tp_size": tp,
                    "meas_ttft_ms": float(r.silicon_ttft_ms),
                    "meas_tpot_ms": float(r.silicon_tpot_ms)}
            if not (np.isnan(r.pp_size) or int(r.pp_size) == 1):
                out.append(base | {"note": f"skipped: pp_size={int(r.pp_size)} not modelled"})
                continue
            try:
                pred = simulate_row(compose_row(model, tp, c, per_client, isl, osl))
            except (ConfigError, WorkloadError) as e:
                pred = {"note": f"error: {e}"}
            out.append(base | pred)
    table = pd.DataFrame(out).reindex(columns=COLUMNS)
    table["note"] = table["note"].fillna("")
    for m in ("ttft", "tpot"):
        table[f"{m}_err_pct"] = (table[f"pred_{m}_ms"] / table[f"meas_{m}_ms"] - 1.0) * 100
    return table


def median_abs_errors(table: pd.DataFrame, by: str | None = None) -> pd.DataFrame:
    """Median absolute % error of TTFT and TPOT (and the row count), overall or per ``by``."""
    ape = pd.DataFrame({"rows": table["ttft_err_pct"].notna().astype(int),
                        "mdape_ttft_pct": table["ttft_err_pct"].abs(),
                        "mdape_tpot_pct": table["tpot_err_pct"].abs()})
    agg = {"rows": "sum", "mdape_ttft_pct": "median", "mdape_tpot_pct": "median"}
    out = ape.agg(agg).to_frame("all").T if by is None else ape.groupby(table[by]).agg(agg)
    return out.astype({"rows": int})


def format_report(table: pd.DataFrame, model: str) -> str:
    """The printed report: header, per-row table, and the median-error summaries."""
    backends = ", ".join(f"{BACKEND_NAMES.get(b, b)} ({b})"
                         for b in sorted(table["backend"].dropna().unique())) or "no"
    shown = table[["backend", "isl", "osl", "concurrency", "tp_size", "pred_ttft_ms",
                   "meas_ttft_ms", "ttft_err_pct", "pred_tpot_ms", "meas_tpot_ms",
                   "tpot_err_pct", "note"]]
    parts = [HEADER.format(hardware=HARDWARE, model=model, backends=backends), "",
             shown.to_string(index=False, float_format=lambda v: f"{v:.1f}"), "",
             "Median absolute % error:"]
    for by in (None, "backend", "tp_size", "concurrency"):
        parts.append(median_abs_errors(table, by).to_string(
            float_format=lambda v: f"{v:.1f}"))
        parts.append("")
    return "\n".join(parts).rstrip()


def main(argv: list[str] | None = None) -> int:
    """Simulate the silicon rows of one model, print the comparison and write the CSV."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path(DEFAULT_DATA),
                    help="aiconfigurator silicon_sample CSV")
    ap.add_argument("--model", default="llama3_8b", help="conf/model/<name>.yaml")
    ap.add_argument("--out", type=Path, default=Path("results.csv"), help="CSV to write")
    ap.add_argument("--num-requests-per-client", type=int, default=8,
                    help="requests per closed-loop client; the first and last are discarded")
    ap.add_argument("--rows", type=int, default=None, help="only the first K matching rows")
    a = ap.parse_args(argv)
    if not a.data.is_file():
        print(f"error: --data={a.data}: not found", file=sys.stderr)
        return 2
    if a.num_requests_per_client < 3:
        print(f"error: --num-requests-per-client={a.num_requests_per_client}: must be >= 3 "
              "(each client's first and last requests are discarded)", file=sys.stderr)
        return 2
    if a.rows is not None and a.rows < 1:
        print(f"error: --rows={a.rows}: must be >= 1", file=sys.stderr)
        return 2
    from hydra import compose, initialize_config_module

    try:
        with initialize_config_module("conf", version_base=None):
            hf_id = str(compose("config", overrides=[f"model={a.model}"]).model.hf_id)
    except Exception as e:  # hydra's MissingConfigException and friends: one line, no trace
        print(f"error: --model={a.model}: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    key = model_key(hf_id)
    rows = load_rows(a.data, key)
    if a.rows is not None:
        rows = rows.head(a.rows)
    if rows.empty:
        print(f"error: --data={a.data}: no agg rows whose model_path contains {key!r}",
              file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    table = run_rows(rows, a.model, a.num_requests_per_client)
    elapsed = time.perf_counter() - t0
    print(format_report(table, f"{a.model} ({key})"))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(a.out, index=False)
    print(f"\n{len(table)} rows simulated in {elapsed:.1f} s; table written to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
