"""Silicon rows simulated closed-loop, as ``python -m calibration validate`` replays them: the
harnesses (``burst``, ``ramp``, ``desync``; ``calibration.validate``'s docstring says what each
imitates), one row's simulation and what is measured from it (mean and median TTFT / TPOT,
the host terms ``calibration.host_fit`` fits)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from hydra import compose

import sim.builders
from analysis.metrics import per_request_latencies
from calibration import host_fit
from calibration.config import SimConfigContext
from scenarios import WorkloadError, requests_for_seed
from sim import simulate
from sim.config.backend import overlaps
from sim.config.cost import HOST_FIELDS
from sim.errors import ConfigError

HARNESSES = ("burst", "ramp", "desync")


class RowSimulator(SimConfigContext):
    """Composes and simulates planned rows inside one Hydra context, in one of the
    ``HARNESSES`` (``calibration.validate``'s docstring says what each imitates)."""

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

    def run(self, cfg, host: tuple[float, ...] | None = None, profile: bool = False) -> dict:
        """Simulate; steady-state mean TTFT/TPOT (ms) and step diagnostics. ``host`` (the
        ``sim.cost.host.KEYS`` coefficients) overrides the calibrated file's host block; with
        ``profile`` (and ``host``) a row whose host time does not add to every step also gets
        its ``step_profile``."""
        if host is not None:
            for field, value in zip(HOST_FIELDS, host, strict=True):
                setattr(cfg.cost_model, field, float(value))
        requests = requests_for_seed(cfg.workload, cfg.seed)
        if self.harness == "desync":
            requests = desynchronise(requests, request_latency_estimate(cfg))
        records = simulate(cfg, requests)
        # under an overlap scheduler a step takes max(GPU, host), not their sum
        host_adds = not overlaps(cfg.backend, cfg.cluster.pipeline_parallel_size)
        out = measure(records, trim=self.harness == "ramp" and self.per_client >= 3)
        if profile and host is not None and not host_adds:  # the host fit's model of it
            out["step_profile"] = step_profile(records, self.harness == "ramp"
                                               and self.per_client >= 3, host,
                                               sim.builders.build_cost_model(cfg))
        return out | {"host_adds": host_adds}


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
    steady = _steady(req, lat, trim)
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


def _steady(req: pd.DataFrame, lat: pd.DataFrame, trim: bool) -> pd.DataFrame:
    """The measured requests' latencies: all, or with ``trim`` without each client's first and
    last request."""
    if not trim:
        return lat
    ids = req.groupby("client")["request_id"]
    inner = (req["request_id"] != ids.transform("min")) & \
        (req["request_id"] != ids.transform("max"))
    return lat[lat["request_id"].isin(req.loc[inner, "request_id"])]


def _spans(steady: pd.DataFrame, req: pd.DataFrame, tl: pd.DataFrame):
    """The steps in time order (``order`` into ``tl``), each step's new requests, and per
    metric the steps inside each steady request's span — its TTFT, and its decode span per
    output token — as (first, end, weight) with ``weight`` what one step adds to the mean."""
    ends = (tl["time_s"] + tl["step_time_s"]).to_numpy()
    order = np.argsort(ends, kind="stable")
    ends = ends[order]
    started = np.isin(tl["time_s"].to_numpy(), req["first_scheduled_s"].dropna().to_numpy())
    new = np.zeros(len(tl))
    if started.any():  # a step's new requests: those first scheduled at its start
        firsts = req["first_scheduled_s"].value_counts()
        new[started] = firsts.loc[tl["time_s"].to_numpy()[started]].to_numpy()
    r = req.set_index("request_id").loc[steady["request_id"]]
    eps = 1e-9  # an arrival is the end of the step that completed the client's previous request
    per_tok = 1.0 / np.maximum(r["generated_tokens"].to_numpy() - 1, 1)
    spans = {}
    for m, (t0, t1), weight in (("ttft", ("arrival_s", "first_token_s"), 1.0),
                                ("tpot", ("first_token_s", "completion_s"), per_tok)):
        i0 = np.searchsorted(ends, r[t0].to_numpy() + eps, side="right")
        i1 = np.searchsorted(ends, r[t1].to_numpy() + eps, side="right")
        spans[m] = (i0, i1, np.broadcast_to(weight, i0.shape) / len(r))
    return order, new, spans


def host_terms(steady: pd.DataFrame, req: pd.DataFrame, tl: pd.DataFrame) -> dict:
    """How the steady-state means depend on the host costs: the mean number of steps
    (``<m>_steps``), of sequence-steps (``<m>_seq_steps``, summed batch sizes), of new-request
    steps (``<m>_new_steps``, requests first scheduled in them) and of token-steps
    (``<m>_token_steps``, summed scheduled tokens) inside each request's TTFT and inside its
    decode span per output token. In a closed loop the schedule does not depend on step
    durations, so where host time adds to every step the means are exactly linear in the four
    coefficients (``calibration.host_fit``)."""
    if not len(steady):
        return {c: float("nan") for c in host_fit.term_columns()}
    order, new, spans = _spans(steady, req, tl)
    per_step = {"seq_steps": tl["batch_size"].to_numpy(), "new_steps": new,
                "token_steps": tl["scheduled_tokens"].to_numpy()}
    cum = {k: np.concatenate([[0], np.cumsum(v[order])]) for k, v in per_step.items()}
    out = {}
    for m, (i0, i1, w) in spans.items():
        out[f"{m}_steps"] = float(((i1 - i0) * w).sum())
        for k, c in cum.items():
            out[f"{m}_{k}"] = float(((c[i1] - c[i0]) * w).sum())
    return out


def step_profile(records, trim: bool, host: tuple[float, ...], cost) -> pd.DataFrame:
    """Each distinct step of a run whose steps take max(GPU, host + kernel launches) (an
    overlap scheduler), with its weight in the steady-state mean TTFT and TPOT: the host fit's
    model of such a row (``calibration.host_fit.predictions``). Columns: the terms the host
    coefficients multiply (``host_fit.TERMS``), ``gpu_ms``, ``launch_ms`` (the kernels the
    host launches one by one where no CUDA graph replays, from ``cost``, the row's
    ``RooflineCostModel``), ``host_ms`` (the host time the step showed, simulated with
    ``host``, the ``sim.cost.host.KEYS`` coefficients), ``w_ttft`` and ``w_tpot``. Steps alike
    to 1 µs are merged (weights summed)."""
    req, tl = records.requests, records.timeline
    steady = _steady(req, per_request_latencies(req), trim)
    if not len(steady) or not len(tl):
        return pd.DataFrame()
    order, new, spans = _spans(steady, req, tl)
    tokens = tl["scheduled_tokens"].to_numpy()[order]
    prefill = tl["prefill_tokens"].to_numpy()[order]
    launch_s = getattr(cost, "eager_launch_s", 0.0)  # (a constant cost model launches nothing)
    n = np.zeros(len(tl))
    if launch_s:
        kinds = pd.DataFrame({"t": tokens, "p": prefill > 0, "d": tokens > prefill})
        launches = kinds.drop_duplicates().assign(
            n=lambda k: [cost.launches(int(t), bool(p), bool(d)) for t, p, d in k.to_numpy()])
        n = kinds.merge(launches, on=["t", "p", "d"], how="left")["n"].to_numpy()
    host_ms = tl["host_s"].to_numpy()[order] * 1e3
    prof = pd.DataFrame({"steps": 1.0, "seq_steps": tl["batch_size"].to_numpy()[order],
                         "new_steps": new[order], "token_steps": tokens,
                         "gpu_ms": (tl["step_time_s"].to_numpy()[order] * 1e3
                                    - host_ms).round(3),
                         "launch_ms": (n * launch_s * 1e3).round(3),
                         "host_ms": host_ms})
    for m, (i0, i1, w) in spans.items():
        diff = np.zeros(len(tl) + 1)
        np.add.at(diff, i0, w)
        np.add.at(diff, i1, -w)
        prof[f"w_{m}"] = np.cumsum(diff)[:-1]
    prof = prof[(prof["w_ttft"] != 0) | (prof["w_tpot"] != 0)]
    return prof.groupby([*host_fit.TERMS, "gpu_ms", "launch_ms"], as_index=False).agg(
        host_ms=("host_ms", "mean"), w_ttft=("w_ttft", "sum"), w_tpot=("w_tpot", "sum"))


def simulate_plans(plans: pd.DataFrame, simulator: RowSimulator,
                   host: dict[str, tuple[float, float]] | None = None,
                   profiles: dict[str, pd.DataFrame] | None = None) -> pd.DataFrame:
    """Simulate every plan without a reason (``host`` per backend overrides the calibrated host
    block); a config the simulator refuses becomes the row's reason. ``profiles`` receives
    the ``step_profile`` of each row simulated with ``host`` whose host time does not add."""
    out = []
    for plan in plans.to_dict("records"):
        res: dict[str, Any] = {}
        if not plan["reason"]:
            try:
                cfg = simulator.compose(plan)
                res = simulator.run(cfg, (host or {}).get(plan["backend"]),
                                    profile=profiles is not None)
            except (ConfigError, WorkloadError) as e:
                res = {"reason": f"refused by the simulator: {e}"}
            except RuntimeError as e:  # a stalled simulation
                res = {"reason": f"simulation failed: {e}"}
        profile = res.pop("step_profile", None)
        if profiles is not None and profile is not None:
            profiles[plan["id"]] = profile
        note = "; ".join(x for x in (plan["note"], res.pop("sim_note", "")) if x)
        out.append(plan | res | {"note": note})
    table = pd.DataFrame(out)
    for col in ("pred_ttft_ms", "pred_tpot_ms", "pred_ttft_all_ms", "pred_tpot_all_ms",
                "pred_ttft_median_ms", "pred_tpot_median_ms", "steady_requests",
                "pred_decode_step_ms", "pred_decode_batch", "pred_host_share",
                *host_fit.term_columns()):
        table[col] = table[col].astype(float) if col in table else np.nan
    return table
