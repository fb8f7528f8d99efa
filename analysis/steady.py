"""Steady-state metrics of one run: the warm-up that MSER-5 finds in the TTFT series, and the
vLLM-named latency, throughput and goodput metrics of the requests that arrive after it.

A simulation starts with an empty server, so its first requests see less queueing than the
system's steady state. ``warmup_cut`` orders completed requests by arrival and applies MSER-5
(``analysis.stats.mser``) to their TTFTs; ``steady_metrics`` then measures only the requests
that arrived at or after the cut. Only the start is trimmed: an open-loop run's last requests
still compete with every request that arrived before them.

``request_load`` and ``job_load`` give one run's verdict on its load from the same warm-up:
the rate offered, the rate served, whether the latency settled and whether arrivals were
served as fast as they came (``throughput_ratio`` after the warm-up); a run that is
not keeping up is overloaded, and its latencies grow with the run's length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.config import slo_is_set
from analysis.metrics import meets_slo, per_request_latencies, value_stats
from analysis.stats import MSER_BATCH, mser

LATENCIES = ("ttft_ms", "tpot_ms", "e2el_ms", "wait_ms")
STATS = (("mean", None), ("median", 50), ("p90", 90), ("p99", 99))
THROUGHPUTS = ("request_throughput", "output_throughput", "total_token_throughput")
GOODPUT = ("request_goodput", "slo_attainment")
# every metric steady_metrics can return; "higher" ones are better when larger
STEADY_METRICS = (*(f"{s}_{n}" for n in LATENCIES for s, _ in STATS), *THROUGHPUTS,
                  *GOODPUT, "median_tps", "completed", "rejected", "failed")
HIGHER_IS_BETTER = (*THROUGHPUTS, *GOODPUT, "median_tps", "completed",
                    "output_throughput_per_gpu")


@dataclass(frozen=True)
class WarmUp:
    """The warm-up of one run: requests dropped (by arrival order), the arrival time from
    which requests count, and whether MSER-5 found the series settled (see ``stats.mser``)."""

    dropped: int
    cut_s: float
    settled: bool
    rule: str


def latencies(requests: pd.DataFrame) -> pd.DataFrame:
    """Per completed request: arrival, TTFT, TPOT, E2E latency and the wait before its first
    step (``wait_ms``: first scheduled − arrival), in arrival order."""
    lat = per_request_latencies(requests)
    done = requests.loc[lat.index]
    lat = lat.assign(arrival_s=done["arrival_s"],
                     wait_ms=(done["first_scheduled_s"] - done["arrival_s"]) * 1e3)
    return lat.sort_values("arrival_s", kind="stable")


def warmup_cut(requests: pd.DataFrame, warmup: str | float = "auto") -> WarmUp:
    """The warm-up of a run: ``auto`` applies MSER-5 to the TTFT series in arrival order;
    a number of seconds cuts at that time after the first arrival."""
    start = float(requests["arrival_s"].min()) if len(requests) else 0.0
    if warmup != "auto":
        cut = start + float(warmup)
        n = int((requests["arrival_s"] < cut).sum())
        return WarmUp(n, cut, True, f"fixed {float(warmup):g} s")
    lat = latencies(requests)
    return mser_warmup(lat["arrival_s"], lat["ttft_ms"], start, "MSER-5 on TTFT")


def mser_warmup(arrival_s: pd.Series, values: pd.Series, start: float, rule: str) -> WarmUp:
    """MSER-5 on a latency series (one value per request, in arrival order ``arrival_s``):
    the warm-up it ends, from ``start`` when it drops nothing."""
    t = mser(values.to_numpy(float))
    cut = float(arrival_s.iloc[t.drop]) if t.drop and len(arrival_s) else start
    return WarmUp(t.drop, cut, t.settled, rule)


def throughput_ratio(requests: pd.DataFrame, cut_s: float,
                     served: pd.Series | None = None) -> float:
    """Completions over admitted arrivals in the window from the warm-up cut (or a quarter
    of the arrival span, if later) to the last arrival: about 1 when the deployment keeps
    up (as many requests are in the system at both ends), about capacity / rate when it
    cannot. ``served`` (per request, when it counts as served; NaN: never) counts another
    event than the completion, e.g. the first token."""
    req, start, end = _ratio_window(requests, cut_s)
    arrived = window_arrivals(requests, cut_s)
    if not arrived:
        return float("nan")
    if served is None:  # a failed request ends without finishing
        served = req["completion_s"].where(req["status"] == "completed")
    served = served.loc[req.index]
    done = int(((served >= start) & (served <= end)).sum())
    return done / arrived


def _ratio_window(requests: pd.DataFrame, cut_s: float) -> tuple[pd.DataFrame, float, float]:
    """The admitted (not rejected) requests and the window ``throughput_ratio`` counts."""
    req = requests[requests["status"] != "rejected"]
    if not len(req):
        return req, math.nan, math.nan
    first, end = float(req["arrival_s"].min()), float(req["arrival_s"].max())
    return req, max(cut_s, first + 0.25 * (end - first)), end


def window_arrivals(requests: pd.DataFrame, cut_s: float) -> int:
    """How many admitted requests arrived in ``throughput_ratio``'s window."""
    req, start, end = _ratio_window(requests, cut_s)
    return int(((req["arrival_s"] >= start) & (req["arrival_s"] <= end)).sum())


def _latency_stats(lat: pd.DataFrame) -> dict:
    out = {}
    for name in LATENCIES:
        out.update(value_stats(name, lat[name].to_numpy(float)))
    return out


def steady_metrics(requests: pd.DataFrame, cut_s: float, slo=None) -> dict:
    """Metrics of the requests that arrived at or after ``cut_s`` (names of
    ``STEADY_METRICS``): latency statistics, and throughputs over the span from ``cut_s``
    to the last completion among them."""
    req = requests[requests["arrival_s"] >= cut_s]
    lat = latencies(req)
    done = req.loc[lat.index]
    rejected = int((req["status"] == "rejected").sum())
    failed = int((req["status"] == "failed").sum())
    span = float(done["completion_s"].max() - cut_s) if len(done) else 0.0
    rate = (lambda x: x / span) if span > 0 else (lambda x: float("nan"))
    out = {"completed": len(lat), "rejected": rejected, "failed": failed,
           "request_throughput": rate(len(lat)),
           "output_throughput": rate(float(done["generated_tokens"].sum())),
           "total_token_throughput": rate(float(done["generated_tokens"].sum()
                                                + done["input_tokens"].sum()))}
    out.update(_latency_stats(lat))
    tpot = lat["tpot_ms"].to_numpy(float)
    tpot = tpot[np.isfinite(tpot) & (tpot > 0)]
    out["median_tps"] = float(np.median(1e3 / tpot)) if len(tpot) else float("nan")
    if slo_is_set(slo):
        good = int(meets_slo(lat, slo).sum())
        total = len(lat) + rejected + failed
        out["request_goodput"] = rate(good)
        out["slo_attainment"] = good / total if total else float("nan")
    return out


KEEP_UP = 0.95  # served share of arrivals that keeps up (the capacity search's default bound)
MIN_SETTLED = 4 * MSER_BATCH  # fewer latencies than MSER's four batches cannot show a trend
# fewer arrivals after the warm-up leave MSER-5 and the served share to chance (short stable
# runs of the default chat workload: a quarter of 20-request runs look unsettled)
MIN_WINDOW = 50


@dataclass(frozen=True)
class Load:
    """One run's load: what was offered and served, and whether it reached a steady state.

    ``served_share`` is ``throughput_ratio`` on the first token (a job's first start) after
    the warm-up: the share of arrivals that started being served by the last arrival, which
    a stable system keeps near 1 even in short runs (a completion would lag by a whole
    request). ``arrived`` is its sample size; ``judged``: enough requests to tell (at least
    ``MIN_SETTLED`` latencies and ``MIN_WINDOW`` arrivals after the warm-up); ``clients``
    the closed-loop clients (0: open loop), whose offered rate is what they sent, each
    waiting for its response.
    """

    offered_rate: float
    served_rate: float
    served_share: float
    arrived: int
    settled: bool
    judged: bool
    clients: int
    unit: str  # of the rates: "req" (req/s) or "jobs" (jobs/s)
    noun: str  # what arrives: "requests" or "jobs"
    latency: str

    @property
    def keeps_up(self) -> bool:
        """Arrivals were served as they came: ``served_share`` is at least ``KEEP_UP``, less
        two standard errors of a count of ``arrived`` (short runs are noisy)."""
        if not self.arrived or not math.isfinite(self.served_share):
            return True
        return self.served_share >= KEEP_UP - 2.0 / math.sqrt(self.arrived)

    @property
    def overloaded(self) -> bool:
        """Served below offered, so the queue was still growing at the end of the run: by
        more than a short run's noise, or with the latency still growing (MSER-5 found no
        steady state, as ``analysis.compare`` reads it) and under ``KEEP_UP`` served."""
        if self.burst:  # its queue only drains
            return False
        growing = self.judged and not self.settled and self.served_share < KEEP_UP
        return not self.keeps_up or growing

    @property
    def steady(self) -> bool:
        """The latency settled (MSER-5, on enough requests) and arrivals were served."""
        return self.settled and self.judged and self.keeps_up and not self.burst

    @property
    def burst(self) -> bool:
        """Every arrival at one instant (``workload.rate=inf``, vllm bench serve's default):
        the run measures how a queue of them drains, never a steady state."""
        return math.isinf(self.offered_rate)

    def offered_text(self) -> str:
        """The offered rate in words: "5.03 req/s", or a closed loop's with its clients."""
        rate = f"{_rate(self.offered_rate)} {self.unit}/s"
        if self.clients:
            return (f"{rate} (closed loop: what its {self.clients} clients sent, each "
                    "waiting for its response)")
        return rate

    def headline(self) -> str:
        """The line printed before a run's table: steady, not steady, OVERLOADED or BURST,
        why."""
        rates = (f"offered {self.offered_text()}, served {_rate(self.served_rate)} "
                 f"{self.unit}/s")
        if self.burst:
            return (f"BURST: every one of the {self.noun} arrived at once (offered rate inf, as "
                    f"vllm bench serve's default --request-rate inf), served "
                    f"{_rate(self.served_rate)} {self.unit}/s; the latencies measure draining "
                    "that queue, not a steady state (set workload.rate for one)")
        if self.overloaded:
            growing = f"{self.latency} still growing at the end, " if not self.settled else ""
            return (f"OVERLOADED: {rates}; {growing}only {self.served_share:.0%} of the "
                    f"{self.noun} arriving after the warm-up served (the queue grows: every "
                    "latency depends on the run's length)")
        if not self.judged:
            return (f"NOT STEADY: {rates}; too few {self.noun} to tell whether "
                    f"{self.latency} settled ({self.arrived} arrived after the warm-up, "
                    f"under {MIN_WINDOW})")
        if not self.settled:
            return (f"NOT STEADY: {rates}; {self.latency} still changing at the end of the "
                    "run (MSER-5 found no steady state)")
        return f"Steady state: {rates}"

    def fields(self, prefix: str = "") -> dict:
        """The ``summary.json`` fields of the verdict (docs/metrics.md), names prefixed."""
        d = {"offered_rate": self.offered_rate, "closed_loop": bool(self.clients),
             "served_share": self.served_share, "latency_settled": self.settled,
             "steady": self.steady, "overloaded": self.overloaded, "burst": self.burst,
             "load_verdict": self.headline()}
        return {f"{prefix}{k}": v for k, v in d.items()}


def _rate(x: float) -> str:
    return f"{x:.2f}" if math.isfinite(x) else "inf" if x == math.inf else "n/a"


def _offered_rate(arrival_s: pd.Series) -> float:
    """Arrivals per second from the first arrival to the last (the inverse mean gap); inf
    when two or more all arrived at one instant, NaN with fewer than two."""
    t = arrival_s.dropna()
    span = float(t.max() - t.min()) if len(t) else 0.0
    if span > 0:
        return (len(t) - 1) / span
    return math.inf if len(t) > 1 else math.nan


def _load(table: pd.DataFrame, lat: pd.DataFrame, value: str, first_served: pd.Series,
          served_rate: float, unit: str, noun: str, latency: str) -> Load:
    """The ``Load`` of a request or job ``table`` (``arrival_s``, ``status``, ``client``,
    the completion time) whose completed rows' latencies are ``lat[value]`` in arrival
    order, served from ``first_served``."""
    start = float(table["arrival_s"].min()) if len(table) else 0.0
    warm = mser_warmup(lat["arrival_s"], lat[value], start, f"MSER-5 on {latency}")
    share = throughput_ratio(table, warm.cut_s, first_served)
    arrived = window_arrivals(table, warm.cut_s)
    clients = (int(table.loc[table["client"] >= 0, "client"].nunique())
               if "client" in table else 0)
    judged = len(lat) >= MIN_SETTLED and arrived >= MIN_WINDOW
    return Load(_offered_rate(table["arrival_s"]), float(served_rate), share, arrived,
                bool(warm.settled), judged, clients, unit, noun, latency)


def _arrived(table: pd.DataFrame, until: float) -> pd.DataFrame:
    """The rows that had arrived by ``until`` (an interrupted run's open-loop requests keep
    the arrival time they were due at; closed-loop ones not yet sent have none)."""
    return table[table["arrival_s"] <= until]


def request_load(requests: pd.DataFrame, served_rate: float,
                 until: float = math.inf) -> Load:
    """The load verdict of an LLM run's ``requests.parquet`` rows: TTFT settled, first
    tokens keep up; ``served_rate`` is its ``request_throughput``, ``until`` the simulated
    time an interrupted run stopped at."""
    req = _arrived(requests, until)
    return _load(req, latencies(req), "ttft_ms", req["first_token_s"], served_rate, "req",
                 "requests", "TTFT")


def job_load(jobs: pd.DataFrame, served_rate: float, until: float = math.inf) -> Load:
    """The load verdict of a diffusion run's ``jobs.parquet`` rows: job latency settled,
    first starts keep up; ``served_rate`` is completed jobs per second."""
    jobs = _arrived(jobs, until)
    done = jobs[jobs["status"] == "completed"]
    lat = pd.DataFrame({"arrival_s": done["arrival_s"],
                        "job_latency_s": done["completion_s"] - done["arrival_s"]})
    lat = lat.sort_values("arrival_s", kind="stable")
    return _load(jobs, lat, "job_latency_s", jobs["start_s"], served_rate, "jobs", "jobs",
                 "job latency")
