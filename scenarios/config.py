"""Typed schemas of the ``workload`` config group and their range checks.

``WorkloadConfig`` is the Hydra structured-config schema behind ``conf/workload/*.yaml``
(registered as ``base_workload`` in group ``workload``), so a wrong type or an unknown key fails
when Hydra composes the config. ``check_workload`` does the range and cross-field checks a type
cannot express and raises ``WorkloadError`` naming the full dotted field, e.g.
``workload.input.sigma``. It does no file I/O; unreadable traces and length files are reported
by ``build_requests`` with the same kind of error.

Synthetic shared prefixes (``scenarios.prefixes``, ``scenarios.sessions``) are configured by
``workload.system_prompt`` (shared system prompts), ``workload.multi_turn`` (conversations
whose every turn re-sends the whole conversation so far) and ``workload.hash_block_tokens``
(tokens named by one id of the ``hash_ids`` they produce). ``workload.random`` and
``workload.sharegpt`` are vLLM's benchmark datasets (``scenarios.bench_datasets``).

Diffusion jobs (``kind: diffusion`` or ``mixed``) are configured by the flat shape fields
(``model``, ``height``, ``width``, ``frames``, ``steps``, ``images``, ``guidance``), ``mix``,
``priority_classes``, ``diffusion_rate``/``diffusion_num_jobs`` (mixed) and
``trace_types``/``trace_statuses`` (diffusion trace replay); their schemas and checks are in
``scenarios.diffusion_config``, the job table in ``scenarios.diffusion``.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any

from scenarios.bench_datasets import (
    RandomDatasetConfig,
    ShareGPTDatasetConfig,
    check_random,
    check_sharegpt,
)
from scenarios.classes import RequestClassConfig, check_classes
from scenarios.diffusion_config import JobShapeConfig, PriorityClassConfig, check_diffusion
from scenarios.errors import WorkloadError
from scenarios.field_checks import (
    check_at_most,
    check_choice,
    check_int_at_least,
    check_nonnegative,
    check_positive,
    check_seconds,
    check_tokens,
    finite,
)
from scenarios.rate_profile import RateProfileConfig, check_rate_profile, has_profile
from scenarios.traces import MAX_TIME_S

ARRIVALS = ("poisson", "gamma", "closed_loop", "trace")
LENGTH_DISTS = ("fixed", "uniform", "lognormal", "empirical")
THINK_TIME_DISTS = ("fixed", "exponential")
POPULARITY = ("uniform", "zipf")
MAX_LOG_MOMENT = 1000.0
MAX_REQUESTS = 100_000_000
MAX_SYSTEM_PROMPTS = 1_000_000
MAX_TURNS = 100_000


@dataclass
class LengthConfig:
    """One token-length distribution (input or output tokens of a request)."""

    dist: str = "fixed"  # fixed | uniform | lognormal | empirical
    value: int = 128  # fixed
    # uniform: inclusive integer bounds; lognormal: truncation bounds.
    low: int = 1
    high: int = 1024
    # lognormal: mean and sd of log(tokens), truncated to [low, high].
    mu: float = 0.0
    sigma: float = 1.0
    # empirical: CSV file (relative: against the cwd) and column to resample with replacement
    # (column None: input_tokens or output_tokens, whichever this distribution is for).
    path: str | None = None
    column: str | None = None


@dataclass
class SystemPromptConfig:
    """Shared system prompts: ``count`` distinct prompts of ``tokens`` tokens each. Every
    request (every session, with ``multi_turn``) draws one, which precedes its own prompt."""

    count: int = 0  # distinct system prompts; 0: none
    tokens: int = 1024  # tokens of each system prompt
    # which prompt a request draws: uniform, or zipf (P(k) ∝ (k + 1)^-zipf_exponent, k = 0..)
    popularity: str = "uniform"
    zipf_exponent: float = 1.0


@dataclass
class MultiTurnConfig:
    """Multi-turn sessions: each turn's prompt is the whole conversation so far (previous
    prompt + previous output) plus a new user message of ``workload.input`` tokens; a turn is
    sent ``think_time_s`` after the previous one completed."""

    enabled: bool = False
    turns: LengthConfig = field(default_factory=lambda: LengthConfig(dist="fixed", value=1))
    think_time_s: float = 0.0  # mean wait between a turn's completion and the next turn
    think_time_dist: str = "fixed"  # fixed | exponential
    # a session ends before a turn whose prompt would exceed this (null: never)
    max_input_tokens: int | None = None


@dataclass
class WorkloadConfig:
    """How requests (LLM) or jobs (diffusion) arrive, how long or how large they are."""

    name: str = "???"
    # llm: requests; diffusion: generation jobs (arrival, rate, num_requests count jobs);
    # mixed: both, the LLM requests as for llm plus a Poisson job stream at diffusion_rate
    kind: str = "llm"
    arrival: str = "poisson"  # poisson | gamma | closed_loop | trace
    rate: float = 10.0  # req/s (poisson, gamma); inf: every request at t = 0, as vLLM's default
    # poisson, gamma: a time-varying rate, multipliers of ``rate`` over a span
    # (scenarios.rate_profile); arrivals then run over the span, and num_requests is not read
    rate_profile: RateProfileConfig = field(default_factory=RateProfileConfig)
    cv: float = 1.0  # gamma inter-arrival coefficient of variation (1 = Poisson)
    num_requests: int = 1000  # poisson, gamma, closed_loop; ignored by trace
    concurrency: int = 8  # closed_loop clients
    # closed_loop: mean think time between a completion and the client's next request.
    think_time_s: float = 0.0
    think_time_dist: str = "fixed"  # fixed | exponential
    # closed_loop: clients start evenly spread over this many seconds (0: all at once), as load
    # generators ramp up; a ramp keeps fixed-length clients from running in lockstep forever.
    ramp_up_s: float = 0.0
    trace_path: str | None = None  # trace replay CSV (relative paths: against the cwd)
    time_scale: float = 1.0  # trace: multiply inter-arrival gaps by this (0.5 = twice as fast)
    # trace window [start, end) in the trace's own time, before scaling.
    window_start_s: float = 0.0
    window_end_s: float | None = None
    max_requests: int | None = None  # trace: keep at most this many rows (None: all)
    # trace: re-time it so that its busiest peak_window_s runs at this many req/s (in place
    # of time_scale; null: time_scale)
    peak_rate: float | None = None
    peak_window_s: float = 60.0
    input_tokens: int | None = None  # fixes every request's input length (overrides all else)
    output_tokens: int | None = None  # likewise for the output length
    input: LengthConfig = field(default_factory=LengthConfig)
    output: LengthConfig = field(default_factory=LengthConfig)
    # a total length (input + output) per request, split by prefill_fraction (Vidur's
    # prefill:decode ratio; 0.75 = 3:1); when set, it replaces ``input`` and ``output``
    total_length: LengthConfig | None = None
    prefill_fraction: float = 0.75
    # vLLM's random dataset (``workload=random``); when set, it replaces ``input``, ``output``
    # and ``total_length`` and its prefix is shared by every request (prefix caching sees it)
    random: RandomDatasetConfig | None = None
    # vLLM's ShareGPT dataset by its mean lengths (``workload=sharegpt``); replaces ``input``,
    # ``output`` and ``total_length`` when set
    sharegpt: ShareGPTDatasetConfig | None = None
    # request classes (scenarios.classes); empty: one class, no priorities or TTFT targets
    classes: list[RequestClassConfig] = field(default_factory=list)
    # synthetic shared prefixes (not with arrival=trace, whose hash_ids come with the file)
    system_prompt: SystemPromptConfig = field(default_factory=SystemPromptConfig)
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    # tokens named by one synthetic hash id: the simulator reads hash_ids at
    # cluster.prefix_block_tokens per id, so the two must agree (the shipped YAMLs tie them)
    hash_block_tokens: int = 512
    # --- diffusion jobs (kind diffusion or mixed; scenarios.diffusion_config) ---
    model: str = ""  # the jobs' pipeline; "": the run's model= (must be set with kind=mixed)
    height: int = 0  # pixels; 0: the pipeline's default
    width: int = 0  # 0: the pipeline's default
    frames: int = 0  # 1: an image; more: a video; 0: the pipeline's default
    steps: int = 0  # denoising steps; 0: the pipeline's default (a trace's own with arrival=trace)
    images: int = 1  # images per prompt (a trace's own with arrival=trace)
    guidance: str = ""  # "": the pipeline's default; else cfg | distilled | none
    # job shapes drawn by weight instead of the fixed shape above (which fills their gaps)
    mix: list[JobShapeConfig] = field(default_factory=list)
    priority_classes: list[PriorityClassConfig] = field(default_factory=list)
    diffusion_rate: float = 0.1  # kind=mixed: jobs per second of the job stream
    diffusion_num_jobs: int | None = None  # kind=mixed: jobs; null: span the LLM stream's time
    # a diffusion trace's rows to replay (Alibaba GenTD26: request type and final status)
    trace_types: list[str] = field(default_factory=lambda: ["TXT_2_IMG", "IMG_2_IMG"])
    trace_statuses: list[str] = field(default_factory=lambda: ["SUCCEED", "FAILED"])


def check_length(length: Any, prefix: str) -> None:
    """Range checks of one ``LengthConfig``; ``prefix`` is its dotted path (``workload.input``)."""
    check_choice(f"{prefix}.dist", length.dist, LENGTH_DISTS)
    if length.dist == "fixed":
        check_tokens(f"{prefix}.value", length.value)
    if length.dist in ("uniform", "lognormal"):
        check_tokens(f"{prefix}.low", length.low)
        check_tokens(f"{prefix}.high", length.high)
        if length.high < length.low:
            raise WorkloadError(
                f"{prefix}.high", length.high, f"must be >= {prefix}.low={length.low}"
            )
    if length.dist == "lognormal":
        # mean and sd of log(tokens): beyond these the truncated quantiles lose all precision
        if not (finite(length.mu) and abs(length.mu) <= MAX_LOG_MOMENT):
            raise WorkloadError(f"{prefix}.mu", length.mu,
                                f"must be a finite number in [-{MAX_LOG_MOMENT:g}, "
                                f"{MAX_LOG_MOMENT:g}] (the mean of log(tokens))")
        check_positive(f"{prefix}.sigma", length.sigma)
        if length.sigma > MAX_LOG_MOMENT:
            raise WorkloadError(f"{prefix}.sigma", length.sigma,
                                f"must be at most {MAX_LOG_MOMENT:g} (the sd of log(tokens))")
    if length.dist == "empirical" and not length.path:
        raise WorkloadError(
            f"{prefix}.path",
            length.path,
            "a CSV file to resample is required when dist is 'empirical'",
        )


def check_total_length(w: Any) -> None:
    """Range checks of ``workload.total_length`` and ``workload.prefill_fraction``."""
    total = getattr(w, "total_length", None)
    if total is None:
        return
    fraction = w.prefill_fraction
    if not (finite(fraction) and 0 < fraction < 1):
        raise WorkloadError("workload.prefill_fraction", fraction, "must be a number in (0, 1)")
    check_length(total, "workload.total_length")
    low = total.value if total.dist == "fixed" else total.low
    if total.dist in ("fixed", "uniform", "lognormal") and low < 2:
        name = "value" if total.dist == "fixed" else "low"
        raise WorkloadError(f"workload.total_length.{name}", low,
                            "must be >= 2 (each request needs an input and an output token)")
    if getattr(w, "multi_turn", None) is not None and w.multi_turn.enabled:
        raise WorkloadError("workload.total_length", "set", "null with multi_turn.enabled "
                            "(a turn's message length is workload.input)")


def check_workload(w: Any) -> None:
    """Validate a workload config (dataclass or DictConfig); raise ``WorkloadError`` if bad.

    Every numeric field is range-checked whatever the arrival process, so a bad override never
    goes unnoticed; the length distributions are checked only when they are used (not for traces).
    """
    check_choice("workload.arrival", w.arrival, ARRIVALS)
    if not (isinstance(w.rate, numbers.Real) and not isinstance(w.rate, bool) and w.rate > 0):
        raise WorkloadError("workload.rate", w.rate,
                            "must be a number > 0 (inf: every request at once)")
    check_positive("workload.cv", w.cv)
    is_trace = w.arrival == "trace"
    check_int_at_least("workload.num_requests", w.num_requests, 0 if is_trace else 1)
    check_at_most("workload.num_requests", w.num_requests, MAX_REQUESTS)
    check_int_at_least("workload.concurrency", w.concurrency, 1)
    check_seconds("workload.think_time_s", w.think_time_s)
    check_seconds("workload.ramp_up_s", w.ramp_up_s)
    check_choice("workload.think_time_dist", w.think_time_dist, THINK_TIME_DISTS)
    check_positive("workload.time_scale", w.time_scale)
    if not finite(w.window_start_s):
        raise WorkloadError("workload.window_start_s", w.window_start_s, "must be a finite number")
    if w.window_end_s is not None and not (
        finite(w.window_end_s) and w.window_end_s > w.window_start_s
    ):
        raise WorkloadError(
            "workload.window_end_s",
            w.window_end_s,
            f"must be > workload.window_start_s={w.window_start_s} (or null)",
        )
    if w.max_requests is not None:
        check_int_at_least("workload.max_requests", w.max_requests, 1)
    for name in ("input_tokens", "output_tokens"):
        value = getattr(w, name)
        if value is not None:
            check_tokens(f"workload.{name}", value)
    check_rate_profile(w, MAX_REQUESTS)
    check_positive("workload.peak_window_s", getattr(w, "peak_window_s", 60.0))
    peak = getattr(w, "peak_rate", None)
    if peak is not None:
        check_positive("workload.peak_rate", peak)
        if w.time_scale != 1.0:
            raise WorkloadError("workload.time_scale", w.time_scale,
                                "1.0 with workload.peak_rate set (it decides the time scale)")
    if w.arrival in ("poisson", "gamma") and not has_profile(w) \
            and w.num_requests / w.rate > MAX_TIME_S:
        raise WorkloadError("workload.rate", w.rate,
                            f"at least workload.num_requests / {MAX_TIME_S:g} s = "
                            f"{w.num_requests / MAX_TIME_S:g} (the arrivals would span longer)")
    if is_trace:
        if not w.trace_path:
            raise WorkloadError(
                "workload.trace_path",
                w.trace_path,
                "a trace CSV is required when arrival is 'trace'",
            )
    else:
        check_length(w.input, "workload.input")
        check_length(w.output, "workload.output")
        check_total_length(w)
    check_random(w)
    check_sharegpt(w)
    check_classes(w.classes)
    check_prefixes(w)
    if getattr(w, "kind", None) is not None:  # None: a config from before diffusion workloads
        check_diffusion(w)


def check_prefixes(w: Any) -> None:
    """Range checks of the synthetic-prefix fields (``system_prompt``, ``multi_turn``,
    ``hash_block_tokens``), checked whatever the arrival process; they may not be used with
    trace replay."""
    sp, mt = getattr(w, "system_prompt", None), getattr(w, "multi_turn", None)
    if sp is None or mt is None:  # a config from before synthetic prefixes
        return
    check_int_at_least("workload.system_prompt.count", sp.count, 0)
    check_at_most("workload.system_prompt.count", sp.count, MAX_SYSTEM_PROMPTS)
    check_tokens("workload.system_prompt.tokens", sp.tokens)
    check_choice("workload.system_prompt.popularity", sp.popularity, POPULARITY)
    check_nonnegative("workload.system_prompt.zipf_exponent", sp.zipf_exponent)
    if not isinstance(mt.enabled, bool):
        raise WorkloadError("workload.multi_turn.enabled", mt.enabled, "true or false")
    check_length(mt.turns, "workload.multi_turn.turns")
    for name in ("value", "high"):
        check_at_most(f"workload.multi_turn.turns.{name}", getattr(mt.turns, name), MAX_TURNS)
    check_seconds("workload.multi_turn.think_time_s", mt.think_time_s)
    check_choice("workload.multi_turn.think_time_dist", mt.think_time_dist, THINK_TIME_DISTS)
    if mt.max_input_tokens is not None:
        least = 1 + (sp.tokens if sp.count else 0)  # a system prompt and a 1-token message
        check_int_at_least("workload.multi_turn.max_input_tokens", mt.max_input_tokens, least)
    check_int_at_least("workload.hash_block_tokens", w.hash_block_tokens, 1)
    if w.arrival == "trace":
        for name, on in (("system_prompt.count", sp.count), ("multi_turn.enabled", mt.enabled)):
            if on:
                raise WorkloadError(f"workload.{name}", on, "0/false with arrival=trace (synthetic "
                                    "prefixes need arrival poisson, gamma or closed_loop; a trace "
                                    "brings its own hash_ids)")
