"""``python -m analysis.capacity [group=option ...] [capacity.key=value ...]``: a capacity plan.

A Hydra app on ``conf/capacity.yaml`` (the simulator's config groups plus ``capacity``):

1. the maximum rate one replica sustains under the SLO (``capacity.slo``), by bracketing and
   bisection on simulations (``analysis.capacity_search``);
2. optionally first, the cheapest configuration of a small space of overrides
   (``capacity.config_search.space``), by GPU-hours per request;
3. for each month of the traffic forecast, the replicas and GPUs its busiest hour needs,
   verified by simulating the whole cluster with its router at that size and at one replica
   fewer (which must miss the SLO);
4. the cost from ``capacity.gpu_hour_price``;
5. with ``capacity.day.enabled``, each month's whole day on the autoscaled cluster
   (``cluster.autoscaler``): its cost and the hours in which the SLO is missed
   (``analysis.capacity_day``). The search and the verification run a fixed replica
   count.

Writes ``capacity.json`` and ``capacity_gpus.png`` into the Hydra output dir. Bad input: one
line on stderr, exit code 2. An SLO that no rate meets: one line naming the closest result,
``capacity.json`` with ``feasible: false``, exit code 1.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import re
import sys
import time
from pathlib import Path

import hydra
from hydra import compose
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from analysis.capacity_config import check_capacity, preflight, register, slo_bounds
from analysis.capacity_day import check_day, simulate_day
from analysis.capacity_report import plot_gpus
from analysis.capacity_search import Evaluator, RateSearch, max_rate, replicas_for
from analysis.files import json_safe, write_text
from analysis.forecast import autoscaled_replicas, costs, peak_rates
from analysis.metrics import DEFAULT_PERCENTILES
from cli.preflight import one_line
from cli.validation import MAX_REPLICAS, validate_config
from conf.schema import register_configs
from scenarios import WorkloadError, requests_for_seed
from scenarios.rate_profile import has_profile
from sim.errors import ConfigError, OutputError, ctrl_c_exits, report_error
from sim.schedulers import SCHEDULERS

log = logging.getLogger("capacity")


def check(cfg) -> None:
    """Every check of the simulator's groups and of the plan, before any simulation."""
    validate_config(cfg)
    check_capacity(cfg.capacity, cfg.workload, cfg.slo)
    if cfg.cluster.get("disaggregated", False):
        raise ConfigError("cluster", cfg.cluster.name, "a single-pool cluster: capacity plans "
                          "replicate one serving engine (disaggregated pools are not planned)")
    if has_profile(cfg.workload):
        raise ConfigError("workload.rate_profile", "set", "unset: the plan searches a constant "
                          "rate, and its days follow capacity.forecast.diurnal")
    check_day(cfg)


def gpus_per_replica(cfg) -> int:
    """GPUs of one serving engine: tensor × pipeline parallel."""
    return int(cfg.cluster.tensor_parallel_size * cfg.cluster.pipeline_parallel_size)


def evaluator(cfg) -> Evaluator:
    """The simulation runner of ``cfg``'s plan settings."""
    s = cfg.capacity.search
    return Evaluator(cfg, slo_bounds(cfg.capacity.slo), list(s.seeds), s.warmup,
                     s.min_throughput_ratio)


def search_rate(cfg, ev: Evaluator) -> RateSearch:
    """One replica's maximum sustainable rate under ``cfg``."""
    s = cfg.capacity.search
    start = s.rate_start if s.rate_start is not None else cfg.workload.rate
    return max_rate(lambda r: ev(r, 1), float(start), s.rel_tol, s.min_rate, s.max_rate,
                    s.max_simulations)


def _chunk_overrides(scheduler: str, chunk: int) -> list[str]:
    """The scheduler fields that set a step's prefill chunk, as the policy declares them."""
    return [f"scheduler.{f}={chunk}" for f in SCHEDULERS[scheduler].chunk_fields]


def candidates(cfg, base: list[str]) -> list[tuple[list[str], DictConfig]]:
    """Every configuration of ``capacity.config_search``, composed with the command line's
    overrides (those of a searched field replaced)."""
    s = cfg.capacity.config_search
    axes = {"cluster.tensor_parallel_size": list(s.tensor_parallel_size),
            "scheduler.max_num_seqs": list(s.max_num_seqs), "backend": list(s.backend),
            "chunk": list(s.chunk)}
    axes = {k: v for k, v in axes.items() if v}
    chunk_keys = ("scheduler.chunk_size", "scheduler.max_num_batched_tokens")
    searched = {*axes, *(chunk_keys if "chunk" in axes else ())}
    keep = [o for o in base if o.split("=", 1)[0].lstrip("+~") not in searched]
    out = []
    for values in itertools.product(*axes.values()):
        choice = dict(zip(axes, values, strict=True))
        over = [f"{k}={v}" for k, v in choice.items() if k != "chunk"]
        try:
            composed = compose("capacity", overrides=[*keep, *over])
            if "chunk" in choice:
                over += _chunk_overrides(composed.scheduler.name, int(choice["chunk"]))
                composed = compose("capacity", overrides=[*keep, *over])
        except (HydraException, OmegaConfBaseException) as e:
            raise ConfigError("capacity.config_search", " ".join(over), one_line(e)) from e
        out.append((over, composed))
    return out


def config_search(cfg, base: list[str]) -> tuple[DictConfig, Evaluator, RateSearch, list[dict]]:
    """The configuration of the space with the fewest GPU-hours per request that meets the
    SLO, with its evaluator and rate search (None for both when no candidate meets it), and
    every candidate's result."""
    table, best = [], None
    for over, c in candidates(cfg, base):
        row = {"overrides": over, "gpus_per_replica": gpus_per_replica(c)}
        try:
            check(c)
        except (ConfigError, WorkloadError) as e:
            table.append({**row, "error": str(e)})
            continue
        t0 = time.perf_counter()
        ev = evaluator(c)
        r = search_rate(c, ev)
        row.update(max_rate_per_replica=r.rate, wall_s=round(time.perf_counter() - t0, 2))
        if r.rate:
            row["gpu_hours_per_million_requests"] = row["gpus_per_replica"] / r.rate / 3600 * 1e6
            if best is None or row["gpu_hours_per_million_requests"] < best[0]:
                best = (row["gpu_hours_per_million_requests"], c, over, ev, r)
        table.append(row)
        log.info("candidate %s: max rate %s", " ".join(over), r.rate)
    for row in table:
        row["chosen"] = best is not None and row["overrides"] == best[2]
    return (best[1], best[3], best[4], table) if best else (cfg, None, None, table)


def plan_periods(cfg, ev: Evaluator, rate1: float) -> list[dict]:
    """Replicas, GPUs and cost of each month of the forecast, each verified on the cluster."""
    f, v = cfg.capacity.forecast, cfg.capacity.verify
    per_gpu = gpus_per_replica(cfg)
    per_replica = int(v.requests_per_replica or cfg.workload.num_requests)
    sample = requests_for_seed(cfg.workload, int(cfg.capacity.search.seeds[0]))
    tokens = float((sample["input_tokens"] + sample["output_tokens"]).mean())
    out_tokens = float(sample["output_tokens"].mean())
    peaks = peak_rates(f.peak_rate, f.growth_per_month, f.horizon_months, f.growth)
    need = math.ceil(float(peaks.max()) / rate1 - 1e-9)
    if need > MAX_REPLICAS:
        raise ConfigError("capacity.forecast.peak_rate", f.peak_rate,
                          f"a forecast that at most {MAX_REPLICAS:,} replicas (cluster.replicas' "
                          f"limit) of {rate1:.4g} req/s serve; its busiest hour "
                          f"({float(peaks.max()):.4g} req/s, with its growth) needs {need:,}")
    periods = []
    for month, peak in enumerate(peaks):
        estimate = max(1, math.ceil(peak / rate1 - 1e-9))
        row = {"month": month, "peak_rate": float(peak), "estimate": estimate}
        if v.enabled:
            p = replicas_for(lambda r, n: ev(r, n, per_replica * n), float(peak),
                             estimate, v.max_adjustments)
            row.update(replicas=p.replicas, verified=p.verified, note=p.note,
                       at_size=p.at_size.as_dict(ev.slo) if p.at_size else None,
                       one_fewer=p.one_fewer.as_dict(ev.slo) if p.one_fewer else None)
        else:
            row.update(replicas=estimate, verified=False, note="verification disabled")
        hourly = autoscaled_replicas(float(peak), f.diurnal, rate1, row["replicas"])
        row.update(costs(float(peak), f.diurnal, row["replicas"], per_gpu,
                         cfg.capacity.gpu_hour_price, tokens, out_tokens, hourly))
        row["autoscaled_replicas_by_hour"] = hourly.tolist()
        if cfg.capacity.day.enabled:  # the whole day, the autoscaler in the loop
            row["day"] = simulate_day(cfg, float(peak), int(hourly[0]), row["replicas"],
                                      ev.slo, ev.min_ratio)
            log.info("month %d: a day on the autoscaler: %.1f GPU-hours, $%.2f, SLO missed "
                     "in hours %s", month, row["day"]["gpu_hours"], row["day"]["cost"],
                     row["day"]["hours_missing_slo"] or "none")
        periods.append(row)
        log.info("month %d: peak %.3g req/s → %d replicas (%d GPUs)%s", month, peak,
                 row["replicas"], row["gpus"], "" if row["verified"] else " (not verified)")
    return periods


def plan(cfg, outdir: Path, base_overrides: list[str]) -> dict:
    """The whole capacity plan; writes ``capacity.json`` and its plot into ``outdir``."""
    check(cfg)
    asked = list(getattr(getattr(cfg, "metrics", None), "percentiles", DEFAULT_PERCENTILES))
    if asked != list(DEFAULT_PERCENTILES):
        log.warning("metrics.percentiles=%s is ignored: a capacity plan is judged by "
                    "capacity.slo, which names its own percentiles (capacity.slo.p99_ttft_ms)",
                    asked)
    t0 = time.perf_counter()
    table, ev, search = None, None, None
    s = cfg.capacity.config_search
    if any(len(v) for v in (s.tensor_parallel_size, s.max_num_seqs, s.chunk, s.backend)):
        cfg, ev, search, table = config_search(cfg, base_overrides)
    if search is None:
        t1 = time.perf_counter()
        ev = evaluator(cfg)
        search = search_rate(cfg, ev)
        search_s = time.perf_counter() - t1
    else:
        search_s = next(r["wall_s"] for r in table if r["chosen"])
    best = search.best()
    result = {
        "feasible": search.rate is not None,
        "slo": slo_bounds(cfg.capacity.slo),
        "config": {"model": cfg.model.name, "hardware": cfg.hardware.name,
                   "backend": cfg.backend.name, "scheduler": cfg.scheduler.name,
                   "workload": cfg.workload.name, "router": cfg.cluster.router,
                   "tensor_parallel_size": cfg.cluster.tensor_parallel_size,
                   "pipeline_parallel_size": cfg.cluster.pipeline_parallel_size,
                   "gpus_per_replica": gpus_per_replica(cfg),
                   "num_requests_per_search_run": cfg.workload.num_requests,
                   "seeds": list(cfg.capacity.search.seeds)},
        "max_rate_per_replica": search.rate,
        "search": {"bracket": [search.low, search.high],
                   "rel_tol": cfg.capacity.search.rel_tol,
                   "simulations": len(search.evaluations) * len(ev.seeds),
                   "wall_s": round(search_s, 2),
                   "evaluations": [e.as_dict(ev.slo) for e in search.evaluations]},
        "best_found": best.as_dict(ev.slo),
        "config_search": table,
        "gpu_hour_price": cfg.capacity.gpu_hour_price,
    }
    if result["feasible"]:
        periods = plan_periods(cfg, ev, search.rate)
        result.update({
            "forecast": OmegaConf.to_container(cfg.capacity.forecast),
            "periods": periods,
            "replicas_needed": [p["replicas"] for p in periods],
            "gpus_needed": [p["gpus"] for p in periods],
            "cost_per_hour": [p["cost_per_hour"] for p in periods],
            "cost_per_million_tokens": [p["cost_per_million_tokens"] for p in periods],
            "all_verified": all(p["verified"] for p in periods),
        })
        plot_gpus(periods, outdir / "capacity_gpus.png")
    result["wall_s"] = round(time.perf_counter() - t0, 2)
    outdir.mkdir(parents=True, exist_ok=True)
    text = compact_json(result) + "\n"
    write_text(outdir / "capacity.json", text)
    return result


_SCALAR = r"(?:-?[\d.eE+-]+|null|true|false)"
_SCALAR_LIST = re.compile(rf"\[\s*({_SCALAR}(?:,\s*{_SCALAR})*)\s*\]")


def compact_json(obj) -> str:
    """Indented JSON with lists of numbers on one line (hourly profiles stay readable)."""
    text = json.dumps(json_safe(obj), indent=2, allow_nan=False, default=str)
    return _SCALAR_LIST.sub(lambda m: "[" + ", ".join(re.split(r",\s*", m.group(1))) + "]",
                            text)


def describe(result: dict) -> str:
    """The plan in a few lines for the terminal."""
    if not result["feasible"]:
        b = result["best_found"]
        return (f"error: the SLO cannot be met: no rate down to the search's minimum meets "
                f"it; best found {b['rate']:.4g} req/s on one replica, which misses "
                f"{'; '.join(b['violations'])}")
    lines = [f"max rate per replica: {result['max_rate_per_replica']:.4g} req/s "
             f"({result['search']['simulations']} simulations, "
             f"{result['search']['wall_s']:.1f} s)"]
    for p in result["periods"]:
        lines.append(f"month {p['month']}: peak {p['peak_rate']:.4g} req/s → {p['replicas']} "
                     f"replicas, {p['gpus']} GPUs, ${p['cost_per_hour']:.2f}/h, "
                     f"${p['cost_per_million_tokens']:.3f} per million tokens"
                     f"{'' if p['verified'] else ' (not verified: ' + p['note'] + ')'}")
        if "day" in p:
            d = p["day"]
            lines.append(f"  its day on the autoscaler: {d['gpu_hours']:.1f} GPU-hours, "
                         f"${d['cost']:.2f}, {d['mean_replicas']:.2f} replicas on average "
                         f"(peak {d['peak_replicas']}), SLO missed in hours "
                         f"{d['hours_missing_slo'] or 'none'}")
    return "\n".join(lines)


register_configs()
register()


@hydra.main(version_base=None, config_path="pkg://conf", config_name="capacity")
def main(cfg: DictConfig) -> None:
    """Hydra entry point of the capacity plan."""
    hc = HydraConfig.get()
    outdir = Path(hc.runtime.output_dir)
    try:
        result = plan(cfg, outdir, list(hc.overrides.task))
    except (ConfigError, WorkloadError, OutputError) as e:
        sys.exit(report_error(e))
    text = describe(result)
    if not result["feasible"]:
        print(text, file=sys.stderr)
        sys.exit(1)
    print(text)
    print(f"outputs: {outdir / 'capacity.json'}")


if __name__ == "__main__":
    with ctrl_c_exits():
        preflight(sys.argv[1:])
        main()
