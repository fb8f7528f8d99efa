"""Schema and checks of ``python -m analysis.capacity`` (``conf/capacity.yaml``): the SLO to
hold, the rate search, the traffic forecast, the cluster verification, the GPU price and the
optional configuration search. The simulator's own groups (model, hardware, backend,
scheduler, kv_cache, cluster, workload, slo, cost_model) are the same as ``python -m sim``'s."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field, make_dataclass
from typing import Optional

from hydra import compose, initialize_config_module
from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from analysis.config import slo_is_set
from analysis.inputs import output_dir
from analysis.steady import LATENCIES, STATS
from cli.preflight import expand_model_path, one_line
from conf.schema import Config
from sim.errors import ConfigError

# SLO metrics and their direction: latencies are upper bounds, attainment a lower bound
UPPER_BOUNDED = tuple(f"{s}_{n}" for n in LATENCIES for s, _ in STATS)
LOWER_BOUNDED = ("slo_attainment",)
MAX_HORIZON_MONTHS = 1200
# the busiest hour of any month: far above what 10,000 replicas (cluster.replicas' limit)
# serve, and low enough that its day's tokens and costs stay finite floats
MAX_PEAK_RATE = 1e9
# a typical interactive service's hourly traffic, relative to its busiest hour (00:00 first)
DIURNAL = [0.35, 0.28, 0.24, 0.22, 0.22, 0.26, 0.35, 0.5, 0.66, 0.8, 0.9, 0.96,
           0.98, 1.0, 1.0, 0.98, 0.95, 0.92, 0.88, 0.84, 0.78, 0.68, 0.55, 0.44]


# metric → bound (null: no bound); a typo in a metric name fails at compose time
SLOBounds = make_dataclass(
    "SLOBounds", [(m, Optional[float], None) for m in UPPER_BOUNDED + LOWER_BOUNDED],  # noqa: UP045
    namespace={"__doc__": "The plan's SLO: a bound per metric, over the steady state."})


def slo_bounds(slo) -> dict[str, float]:
    """The bounds that are set, as {metric: bound}."""
    return {m: float(getattr(slo, m)) for m in UPPER_BOUNDED + LOWER_BOUNDED
            if getattr(slo, m, None) is not None}


@dataclass
class SearchConfig:
    """Bracketing and bisection of one replica's maximum sustainable rate."""

    rate_start: float | None = None  # first rate tried (req/s); null: workload.rate
    rel_tol: float = 0.02  # stop when the bracket [lo, hi] has hi / lo − 1 <= this
    min_rate: float = 0.01  # no rate down to this meets the SLO: it cannot be met
    max_rate: float = 10000.0  # search no higher
    max_simulations: int = 40
    seeds: list[int] = field(default_factory=lambda: [0])  # metrics averaged over these
    warmup: str = "auto"  # auto (MSER-5 on TTFT) or seconds from the first arrival
    # keeps up: completions / arrivals per second over the run's steady window (see
    # analysis.capacity_search.throughput_ratio); catches overload that no SLO bound sees
    min_throughput_ratio: float = 0.95


@dataclass
class ForecastConfig:
    """Traffic over the horizon: the busiest hour of month 0, monthly growth, daily shape."""

    peak_rate: float = 20.0  # req/s in the busiest hour of the first month
    growth_per_month: float = 0.1  # 0.1 = +10% per month
    growth: str = "compound"  # compound: × (1 + g)^m; linear: × (1 + g·m)
    horizon_months: int = 6
    diurnal: list[float] = field(default_factory=lambda: list(DIURNAL))  # 24 hourly weights


@dataclass
class VerifyConfig:
    """Verification of each period's replica count by simulating the whole cluster."""

    enabled: bool = True
    # a cluster run simulates this × replicas requests, so each replica serves as long as the
    # single-replica search ran (null: workload.num_requests); shorter runs flatter overload
    requests_per_replica: int | None = None
    max_adjustments: int = 6  # replicas added or removed before giving up


@dataclass
class DayConfig:
    """Each forecast month's whole day simulated with the autoscaler in the loop
    (``cluster.autoscaler``): traffic by ``forecast.diurnal`` at the month's peak, what the
    day costs and in which hours the SLO is missed (``analysis.capacity_day``)."""

    enabled: bool = False
    # seconds of one simulated hour: 3600 is the real day (slow: every request of the day is
    # simulated); less compresses the day, while the scale-up delay keeps its length
    hour_s: float = 3600.0
    seed: int = 0


@dataclass
class ConfigSearchConfig:
    """The cheapest configuration meeting the SLO over a small space: every combination of
    the values listed (an empty list keeps the configured value; all empty: no search)."""

    tensor_parallel_size: list[int] = field(default_factory=list)
    max_num_seqs: list[int] = field(default_factory=list)
    # a step's prefill chunk: scheduler.chunk_size for sarathi and sglang (sarathi's token
    # budget follows it), scheduler.max_num_batched_tokens for the others
    chunk: list[int] = field(default_factory=list)
    backend: list[str] = field(default_factory=list)


@dataclass
class CapacitySettings:
    """What ``python -m analysis.capacity`` plans for."""

    # latencies (e.g. p99_ttft_ms, mean_wait_ms) at most their bound, slo_attainment at
    # least (the share of requests meeting the per-request bounds of the slo group)
    slo: SLOBounds = field(default_factory=lambda: SLOBounds(p99_ttft_ms=500.0, p99_tpot_ms=50.0))
    gpu_hour_price: float = 3.0  # USD per GPU-hour
    search: SearchConfig = field(default_factory=SearchConfig)
    forecast: ForecastConfig = field(default_factory=ForecastConfig)
    verify: VerifyConfig = field(default_factory=VerifyConfig)
    config_search: ConfigSearchConfig = field(default_factory=ConfigSearchConfig)
    day: DayConfig = field(default_factory=DayConfig)


@dataclass
class CapacityAppConfig(Config):
    """Root schema of ``python -m analysis.capacity``: one simulation's config plus the plan."""

    capacity: CapacitySettings = field(default_factory=CapacitySettings)


def register() -> None:
    """Register ``base_capacity`` (the simulator's groups are registered by ``conf.schema``)."""
    ConfigStore.instance().store(name="base_capacity", node=CapacityAppConfig)


def _positive(name: str, v: float) -> None:
    if v is None or not math.isfinite(float(v)) or v <= 0:
        raise ConfigError(name, v, "must be a finite number > 0")


def check_capacity(c, workload, slo) -> None:
    """Ranges and names of the capacity settings (``c``), a workload with an offered rate,
    and per-request bounds in ``slo`` when the plan asks for an attainment."""
    bounds = slo_bounds(c.slo)
    if not bounds:
        raise ConfigError("capacity.slo", "{}", "at least one metric bound, e.g. "
                          "capacity.slo.p99_ttft_ms=500")
    for metric, bound in bounds.items():
        _positive(f"capacity.slo.{metric}", bound)
        if metric in LOWER_BOUNDED and bound > 1:
            raise ConfigError(f"capacity.slo.{metric}", bound, "a fraction in (0, 1]")
    if "slo_attainment" in bounds and not slo_is_set(slo):
        raise ConfigError("capacity.slo.slo_attainment", bounds["slo_attainment"],
                          "needs per-request bounds in the slo group (e.g. slo=chat)")
    if workload.arrival not in ("poisson", "gamma"):
        raise ConfigError("workload.arrival", workload.arrival,
                          "poisson or gamma (capacity search varies an open-loop rate)")
    s = c.search
    _positive("capacity.gpu_hour_price", c.gpu_hour_price)
    _positive("capacity.search.rel_tol", s.rel_tol)
    _positive("capacity.search.min_rate", s.min_rate)
    if not s.max_rate > s.min_rate:
        raise ConfigError("capacity.search.max_rate", s.max_rate,
                          f"must be > capacity.search.min_rate={s.min_rate}")
    if s.rate_start is not None:
        _positive("capacity.search.rate_start", s.rate_start)
    elif math.isinf(workload.rate):
        raise ConfigError("workload.rate", workload.rate, "a finite first rate for the search "
                          "(or set capacity.search.rate_start)")
    if s.max_simulations < 2:
        raise ConfigError("capacity.search.max_simulations", s.max_simulations, "must be >= 2")
    if not s.seeds:
        raise ConfigError("capacity.search.seeds", list(s.seeds), "at least one seed")
    if any(seed < 0 for seed in s.seeds):
        raise ConfigError("capacity.search.seeds", list(s.seeds), "each an integer >= 0 "
                          "(a seed of the simulations' random streams)")
    if s.warmup != "auto":
        try:
            ok = math.isfinite(float(s.warmup)) and float(s.warmup) >= 0
        except ValueError:
            ok = False
        if not ok:
            raise ConfigError("capacity.search.warmup", s.warmup,
                              "auto or a finite number of seconds >= 0")
    if not 0 < s.min_throughput_ratio <= 1:
        raise ConfigError("capacity.search.min_throughput_ratio", s.min_throughput_ratio,
                          "a fraction in (0, 1]")
    if c.verify.requests_per_replica is not None and c.verify.requests_per_replica < 50:
        raise ConfigError("capacity.verify.requests_per_replica",
                          c.verify.requests_per_replica, "must be >= 50")
    check_forecast(c.forecast)
    if c.day.enabled:
        _positive("capacity.day.hour_s", c.day.hour_s)


def check_forecast(f) -> None:
    """A forecast whose traffic stays positive over the whole horizon."""
    _positive("capacity.forecast.peak_rate", f.peak_rate)
    if not 1 <= f.horizon_months <= MAX_HORIZON_MONTHS:
        raise ConfigError("capacity.forecast.horizon_months", f.horizon_months,
                          f"must be in [1, {MAX_HORIZON_MONTHS}] (months, each one planned)")
    if f.growth not in ("compound", "linear"):
        raise ConfigError("capacity.forecast.growth", f.growth, "compound or linear")
    g, last = float(f.growth_per_month), f.horizon_months - 1
    if not math.isfinite(g):
        raise ConfigError("capacity.forecast.growth_per_month", g, "a finite number")
    if f.growth == "compound" and g <= -1:
        raise ConfigError("capacity.forecast.growth_per_month", g,
                          "must be > -1 (compound growth of -100% or less leaves no traffic)")
    if f.growth == "linear" and 1 + g * last <= 0:
        zero = math.ceil(-1 / g)
        raise ConfigError("capacity.forecast.growth_per_month", g,
                          f"traffic reaches zero or below at month {zero} of the "
                          f"{f.horizon_months}-month horizon (linear growth); shorten "
                          "capacity.forecast.horizon_months or raise the growth")
    check_forecast_peak(f)
    d = list(f.diurnal)
    if len(d) != 24 or any(not math.isfinite(float(x)) or x < 0 for x in d) or max(d) <= 0:
        raise ConfigError("capacity.forecast.diurnal", d,
                          "24 hourly weights >= 0, at least one > 0")


def check_forecast_peak(f) -> None:
    """The busiest hour of the horizon's last month stays at most ``MAX_PEAK_RATE`` (so no
    compounding overflows), computed in logarithms."""
    g, last = float(f.growth_per_month), f.horizon_months - 1
    growth = math.log1p(g) * last if f.growth == "compound" else math.log1p(g * last)
    log_peak = math.log10(f.peak_rate) + growth / math.log(10)
    if log_peak <= math.log10(MAX_PEAK_RATE):
        return
    if f.peak_rate > MAX_PEAK_RATE:
        raise ConfigError("capacity.forecast.peak_rate", f.peak_rate,
                          f"must be at most {MAX_PEAK_RATE:.0e} req/s")
    raise ConfigError("capacity.forecast.growth_per_month", g,
                      f"{f.growth} growth from capacity.forecast.peak_rate={f.peak_rate:g} "
                      f"reaches about 1e{log_peak:.0f} req/s by month {last}; at most "
                      f"{MAX_PEAK_RATE:.0e} req/s: lower the growth or shorten "
                      "capacity.forecast.horizon_months")


def preflight(argv: list[str]) -> None:
    """Compose ``conf/capacity.yaml`` with the command line's overrides before Hydra runs,
    so a bad override (an unknown SLO metric, say) is one line and exit code 2."""
    if any(a.startswith("-") for a in argv):
        return  # --help, --cfg, -m: Hydra's own
    overrides = [a for a in argv if not a.lstrip("+~").startswith(("hydra.", "hydra/"))]
    run_dir = [a for a in argv if a.lstrip("+~").startswith("hydra.run.dir=")]
    try:
        for a in overrides:
            key, _, value = a.lstrip("+~").partition("=")
            metric = key.removeprefix("capacity.slo.")
            if metric != key and metric not in UPPER_BOUNDED + LOWER_BOUNDED:
                raise ConfigError(key, value, "an SLO metric, one of "
                                  f"{list(UPPER_BOUNDED + LOWER_BOUNDED)}")
        overrides = expand_model_path(overrides)
        with initialize_config_module("conf", version_base=None):
            cfg = compose("capacity", overrides=[*overrides, *run_dir],
                          return_hydra_config=True)
        output_dir(cfg.hydra.run.dir, "hydra.run.dir")
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except (HydraException, OmegaConfBaseException) as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        sys.exit(2)
