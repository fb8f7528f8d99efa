"""Schema and checks of ``cluster.autoscaler``: replicas added and removed as the run goes
(``sim.engine.autoscaler``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.errors import ConfigError

# the metric each utilisation policy averages over the ready replicas, as the engines
# export it (vLLM's /metrics: num_requests_waiting, num_requests_running, kv_cache_usage_perc)
# (rate: the arrivals per second over the last rate_window_s, as Knative's autoscaler on its
# rps target or KEDA on a gateway's request rate)
POLICY_METRICS = {"queue": "waiting requests", "running": "running requests",
                  "kv_usage": "KV-cache usage (0-1)", "rate": "arrivals per second"}
# ... over the ready diffusion nodes (no KV cache there)
NODE_POLICY_METRICS = {"queue": "waiting jobs", "running": "running gangs (a batch is one)",
                       "rate": "job arrivals per second"}
POLICIES = ("none", *POLICY_METRICS, "slo")
MIN_INTERVAL_S = 1.0


@dataclass
class AutoscalerConfig:
    """How an autoscaler resizes the pool of LLM replicas, or of diffusion nodes under
    ``cluster=diffusion`` (there ``replicas`` are nodes; ``policy: none``: it does not).

    Every ``interval_s`` it reads the ready replicas and recommends a count: a utilisation
    policy as Kubernetes' HPA on an engine metric (``ceil(Σ metric / target)``, no change
    while the mean is within ``tolerance`` of ``target``; ``rate``: the requests arriving per
    second over the last ``rate_window_s``, ``target`` per replica), or ``slo`` (one more
    replica while an observed latency quantile breaks its bound, one fewer while all are
    below ``scale_down_below`` of it and nothing waits). The recommendation is stabilised as HPA
    does (the lowest of the last ``scale_up_stabilization_s`` to grow, the highest of the
    last ``scale_down_stabilization_s`` to shrink) and kept in
    ``[min_replicas, max_replicas]``; ``cluster.replicas`` are ready at the start.
    """

    policy: str = "none"  # none | queue | running | kv_usage | rate | slo
    min_replicas: int = 1
    max_replicas: int = 8
    interval_s: float = 15.0  # HPA's sync period (at least 1 s)
    # per ready replica: waiting or running requests, KV usage, or arrivals per second
    target: float = 4.0
    tolerance: float = 0.1  # HPA's default
    rate_window_s: float = 60.0  # rate: arrivals counted over this (Knative's stable window)
    scale_up_stabilization_s: float = 0.0  # HPA's defaults: grow at once ...
    scale_down_stabilization_s: float = 300.0  # ... shrink on the highest of 5 minutes
    # slo: the bounds (ms; null: not watched), the quantile observed over the last window
    # (TTFT, TPOT and end-to-end latency of the requests, or jobs, that completed in it)
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    slo_latency_ms: float | None = None
    slo_quantile: float = 0.9
    slo_window_s: float = 60.0
    scale_down_below: float = 0.5
    # a new replica is ready after provisioning, loading its weights at storage_bandwidth
    # (bytes/s per GPU, each GPU its shard) and starting its engine (profile run, CUDA
    # graph capture); these are settings to give, not measurements
    provision_s: float = 60.0
    storage_bandwidth: float = 2e9
    engine_start_s: float = 30.0
    gpu_hour_price: float = 3.0  # USD per GPU-hour, as capacity.gpu_hour_price


def autoscaled(c) -> bool:
    """Whether ``cluster`` (config) has an autoscaler."""
    a = getattr(c, "autoscaler", None)
    return a is not None and a.policy != "none"


def _finite_at_least(field: str, value, low: float, strict: bool = False) -> None:
    ok = value is not None and not isinstance(value, bool) and math.isfinite(value) and (
        value > low if strict else value >= low)
    if not ok:
        raise ConfigError(f"cluster.autoscaler.{field}", value,
                          f"must be a finite number {'>' if strict else '>='} {low:g}")


def check_autoscaler(c, nodes: bool = False) -> None:
    """``cluster.autoscaler`` in range, and a cluster it can resize: one pool without
    failures, starting within ``[min_replicas, max_replicas]`` (``nodes``: the diffusion
    nodes of ``cluster=diffusion``, whose policies read no KV cache and no tokens)."""
    a = c.autoscaler
    if a.policy not in POLICIES:
        raise ConfigError("cluster.autoscaler.policy", a.policy, f"one of {list(POLICIES)}")
    if a.policy == "none":
        return
    if nodes and a.policy not in (*NODE_POLICY_METRICS, "slo"):
        raise ConfigError("cluster.autoscaler.policy", a.policy, "one of "
                          f"{[*NODE_POLICY_METRICS, 'slo']} for diffusion nodes (they hold no "
                          "KV cache)")
    if not isinstance(a.min_replicas, int) or a.min_replicas < 1:
        raise ConfigError("cluster.autoscaler.min_replicas", a.min_replicas,
                          "an integer >= 1 (a pool scaled to zero serves nothing)")
    if not isinstance(a.max_replicas, int) or a.max_replicas < a.min_replicas:
        raise ConfigError("cluster.autoscaler.max_replicas", a.max_replicas,
                          f"an integer >= min_replicas={a.min_replicas}")
    field, ready = ("nodes", c.nodes) if nodes else ("replicas", c.replicas)
    if not a.min_replicas <= ready <= a.max_replicas:
        raise ConfigError(f"cluster.{field}", ready, f"the {field} ready at the start: "
                          f"in [{a.min_replicas}, {a.max_replicas}] (cluster.autoscaler's "
                          "min_replicas, max_replicas)")
    if c.disaggregated and not nodes:
        raise ConfigError("cluster.autoscaler.policy", a.policy,
                          "none with cluster.disaggregated (it resizes one pool)")
    if c.failure.mtbf_s is not None:
        raise ConfigError("cluster.autoscaler.policy", a.policy,
                          "none with cluster.failure.mtbf_s (failures and scaling are not "
                          "modelled together)")
    # metrics scrapes and HPA syncs run at seconds; a shorter interval only slows the run
    # (each evaluation reads the stabilisation window's recommendations)
    _finite_at_least("interval_s", a.interval_s, MIN_INTERVAL_S)
    for name in ("target", "slo_window_s", "rate_window_s", "storage_bandwidth"):
        _finite_at_least(name, getattr(a, name), 0.0, strict=True)
    for name in ("tolerance", "scale_up_stabilization_s", "scale_down_stabilization_s",
                 "provision_s", "engine_start_s", "gpu_hour_price"):
        _finite_at_least(name, getattr(a, name), 0.0)
    if a.policy == "kv_usage" and a.target > 1:
        raise ConfigError("cluster.autoscaler.target", a.target,
                          "a KV-cache usage in (0, 1] with policy=kv_usage")
    if a.policy == "slo":
        watched = ("slo_latency_ms",) if nodes else ("slo_ttft_ms", "slo_tpot_ms",
                                                     "slo_latency_ms")
        if all(getattr(a, name) is None for name in watched):
            what = ("a job latency bound (ms) with policy=slo on diffusion nodes" if nodes
                    else "a bound (ms) with policy=slo (or slo_tpot_ms, slo_latency_ms)")
            raise ConfigError(f"cluster.autoscaler.{watched[0]}", None, what)
        for name in watched:
            if getattr(a, name) is not None:
                _finite_at_least(name, getattr(a, name), 0.0, strict=True)
        if not 0 < a.slo_quantile < 1:
            raise ConfigError("cluster.autoscaler.slo_quantile", a.slo_quantile,
                              "must be in (0, 1)")
        if not 0 <= a.scale_down_below < 1:
            raise ConfigError("cluster.autoscaler.scale_down_below", a.scale_down_below,
                              "must be in [0, 1)")
