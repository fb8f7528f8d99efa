"""Turn a workload config into the table of requests the simulator replays.

Contract of ``build_requests(workload, rng_arrivals, rng_lengths) -> pandas.DataFrame``:

- ``workload`` is a ``WorkloadConfig`` or an OmegaConf ``DictConfig`` of the same shape (only
  attribute access is used). It is checked with ``check_workload`` first; any bad value, missing
  file or malformed trace raises one ``WorkloadError`` naming the field (``workload.…``).
- One row per request, with exactly these columns:

  ==================  =======  ==========================================================
  ``arrival_time_s``  float64  seconds from the start of the run; NaN for closed-loop
                               follow-ups (see below)
  ``input_tokens``    int64    >= 1, prompt tokens
  ``output_tokens``   int64    >= 1, tokens to generate
  ``client``          int64    closed-loop client id (multi-turn: the session, or the user
                               running sessions in closed loop); -1 for open loop
  ``think_time_s``    float64  closed loop: wait after the client's previous completion before
                               this request arrives; 0 for open loop and first requests
  ``hash_ids``        object   tuple of ints (prefix-block hashes), when the trace has it or
                               with synthetic prefixes (``system_prompt``, ``multi_turn``)
  ``request_class``   object   class name (str), only when ``workload.classes`` is set
  ``priority``        int64    the class's priority, lower = more urgent (with classes)
  ``ttft_slo_ms``     float64  the class's TTFT target, inf when it has none (with classes)
  ==================  =======  ==========================================================

- Open loop (poisson, gamma, trace): rows are in arrival order (non-decreasing times). Poisson and
  Gamma start at the first gap, not at 0; with ``workload.rate_profile`` they follow its
  time-varying rate over its span (``scenarios.rate_profile``), as many rows as arrive there.
  A trace is windowed, shifted to start at 0 and scaled (by ``time_scale``, or so that its
  busiest ``peak_window_s`` runs at ``peak_rate``).
- Closed loop: ``num_requests`` rows, row ``i`` belongs to client ``i % concurrency``. Each
  client's first row arrives at 0.0; each later row has NaN arrival, which the simulator sets to
  the completion time of the same client's previous row plus this row's ``think_time_s``.
- Lengths come from ``workload.input``/``workload.output`` (or from the trace's columns for trace
  replay), or from ``workload.total_length`` split by ``workload.prefill_fraction`` when that is
  set (drawn from the input stream), or from ``workload.random`` (vLLM's random dataset:
  uniform around ``input_len``/``output_len``, a shared prefix of ``prefix_len`` tokens in
  front), or from ``workload.sharegpt`` (vLLM's ShareGPT dataset by its mean lengths, both
  drawn from the input stream: the client filters each pair as a whole);
  ``workload.input_tokens``/``output_tokens``, when set, replace them for every row
  (with a prefix, the request's own part).
- Synthetic prefixes: with ``system_prompt.count > 0`` each request's prompt is a drawn system
  prompt followed by its own ``workload.input`` tokens (``scenarios.prefixes``); with
  ``multi_turn.enabled`` rows are the turns of sessions, each prompt the conversation so far
  plus a new message of ``workload.input`` tokens, released like closed-loop follow-ups
  (``scenarios.sessions``). Either adds ``hash_ids``; the fixed-length overrides then set the
  request's own message and output, not the whole prompt.
- Randomness: arrival times and think times are drawn only from ``rng_arrivals``; lengths only
  from ``rng_lengths`` (input and output from two independent child streams of it). So the same
  lengths stream gives the same lengths under any arrival process with the same row count
  (common random numbers), and the same two seeds give an identical DataFrame. Classes are
  drawn from a further child stream of ``rng_lengths``, spawned after the lengths', so adding
  classes changes neither arrivals nor lengths. Synthetic prefixes draw the system prompt
  choice and the turns per session from further children of ``rng_lengths`` (after the
  lengths'), think times and session starts from ``rng_arrivals``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from scenarios.arrivals import closed_loop, gamma_arrivals, poisson_arrivals
from scenarios.classes import CLASS_COLUMNS, assign_classes
from scenarios.config import check_workload
from scenarios.errors import WorkloadError
from scenarios.lengths import (
    random_dataset_lengths,
    read_length_column,
    sample_lengths,
    split_total_lengths,
)
from scenarios.prefixes import add_shared_prefix, add_system_prompts
from scenarios.rate_profile import RateProfile, has_profile
from scenarios.sessions import session_rows
from scenarios.sharegpt_dataset import sharegpt_lengths
from scenarios.traces import MAX_TIME_S, read_trace, retime_factor, window_trace

COLUMNS = ("arrival_time_s", "input_tokens", "output_tokens", "client", "think_time_s")


def requests_for_seed(workload: Any, seed: int) -> pd.DataFrame:
    """``build_requests`` with the run's two streams spawned from ``SeedSequence(seed)``
    (child 0: arrivals, child 1: lengths), as every entry point draws them."""
    arrivals, lengths = np.random.SeedSequence(int(seed)).spawn(2)
    return build_requests(workload, np.random.default_rng(arrivals),
                          np.random.default_rng(lengths))


def _trace_rows(w: Any) -> pd.DataFrame:
    path = str(w.trace_path)
    peak = getattr(w, "peak_rate", None)
    trace = window_trace(
        read_trace(path),
        float(w.window_start_s),
        None if w.window_end_s is None else float(w.window_end_s),
        float(w.time_scale) if peak is None else 1.0,
        w.max_requests,
        path,
    )
    n = len(trace)
    scale_field, scale = "workload.time_scale", w.time_scale
    if peak is not None:  # the trace's own rate curve, re-timed to the target peak
        f = retime_factor(trace["arrival_time_s"].to_numpy(), float(w.peak_window_s),
                          float(peak))
        if f is None:
            raise WorkloadError("workload.peak_rate", peak, "a rate its busiest instant allows:"
                                " rows arriving at one instant stay together in any window "
                                "(raise it or workload.peak_window_s)")
        trace["arrival_time_s"] *= f
        scale_field, scale = "workload.peak_rate", peak
    last = float(trace["arrival_time_s"].iloc[-1])
    if last > MAX_TIME_S:
        raise WorkloadError(scale_field, scale,
                            f"the scaled trace would last {last:g} s; at most {MAX_TIME_S:g} s")
    trace["client"] = np.full(n, -1, dtype=np.int64)
    trace["think_time_s"] = np.zeros(n)
    return trace


def open_loop_arrivals(w: Any, rng: np.random.Generator) -> np.ndarray:
    """Arrival times of poisson or gamma arrivals: ``num_requests`` at a constant rate, or
    over the span of ``workload.rate_profile``."""
    cv = float(w.cv) if w.arrival == "gamma" else 1.0
    if has_profile(w):
        return RateProfile.from_config(w.rate_profile, float(w.rate)).arrivals(rng, cv)
    n = int(w.num_requests)
    if w.arrival == "poisson":
        return poisson_arrivals(float(w.rate), n, rng)
    return gamma_arrivals(float(w.rate), cv, n, rng)


def _synthetic_rows(
    w: Any, rng_arrivals: np.random.Generator, rng_lengths: np.random.Generator
) -> pd.DataFrame:
    if w.arrival == "closed_loop":
        n = int(w.num_requests)
        arrival, client, think = closed_loop(
            n, int(w.concurrency), float(w.think_time_s), str(w.think_time_dist), rng_arrivals,
            float(getattr(w, "ramp_up_s", 0.0)),
        )
    else:
        arrival = open_loop_arrivals(w, rng_arrivals)
        n = len(arrival)
        client, think = np.full(n, -1, dtype=np.int64), np.zeros(n)
    rng_in, rng_out = rng_lengths.spawn(2)
    if _random_dataset(w) is not None:
        inputs, outputs = random_dataset_lengths(w.random, n, rng_in, rng_out)
    elif getattr(w, "sharegpt", None) is not None:
        try:  # the pair is filtered together, so both lengths come from the input stream
            inputs, outputs = sharegpt_lengths(n, float(w.sharegpt.input_mean),
                                               float(w.sharegpt.output_mean), rng_in)
        except ValueError as e:
            raise WorkloadError("workload.num_requests", n, str(e)) from None
    elif getattr(w, "total_length", None) is not None:
        inputs, outputs = split_total_lengths(
            w.total_length, float(w.prefill_fraction), n, rng_in, "workload.total_length"
        )
    else:
        inputs = sample_lengths(w.input, n, rng_in, "workload.input", "input_tokens")
        outputs = sample_lengths(w.output, n, rng_out, "workload.output", "output_tokens")
    return pd.DataFrame(
        {
            "arrival_time_s": arrival,
            "input_tokens": inputs,
            "output_tokens": outputs,
            "client": client,
            "think_time_s": think,
        }
    )


def _multi_turn(w: Any) -> bool:
    mt = getattr(w, "multi_turn", None)
    return bool(mt is not None and mt.enabled)


def _random_dataset(w: Any) -> Any:
    """``workload.random`` (vLLM's random dataset), or None when lengths come from elsewhere."""
    return getattr(w, "random", None)


def _system_prompts(w: Any) -> int:
    sp = getattr(w, "system_prompt", None)
    return 0 if sp is None else int(sp.count)


def _fix_lengths(rows: pd.DataFrame, w: Any) -> None:
    """Apply ``workload.input_tokens``/``output_tokens`` to every row (when set) and refuse a
    length < 1 that no override replaces (a trace may have 0-token rows)."""
    for name in ("input_tokens", "output_tokens"):
        fixed = getattr(w, name)
        if fixed is not None:
            rows[name] = np.full(len(rows), int(fixed), dtype=np.int64)
        short = rows[name].to_numpy() < 1
        if short.any():
            i = int(np.argmax(short))
            raise WorkloadError(
                "workload.trace_path",
                w.trace_path,
                f"{name} is {int(rows[name].iloc[i])} at row {i} after "
                f"windowing; lengths must be >= 1 (set workload.{name} to "
                "override every request's length)",
            )


def _length_files(w: Any) -> list[tuple[Any, str, str]]:
    """(length config, its dotted field, default column) of each length distribution the
    workload draws from."""
    if w.arrival == "trace":
        return []
    if _random_dataset(w) is not None or getattr(w, "sharegpt", None) is not None:
        return []
    if getattr(w, "total_length", None) is not None:
        used = [(w.total_length, "workload.total_length", "total_tokens")]
    else:
        used = [(w.input, "workload.input", "input_tokens"),
                (w.output, "workload.output", "output_tokens")]
    if _multi_turn(w):
        used.append((w.multi_turn.turns, "workload.multi_turn.turns", "turns"))
    return used


def check_workload_files(workload: Any) -> None:
    """Read every file the workload names, as ``build_requests`` will, and raise the first
    problem as one ``WorkloadError``: a trace's header, column types, finite values, order,
    ranges and the rows its window keeps; each empirical length file's column. Call after
    ``check_workload``."""
    if getattr(workload, "kind", "llm") == "diffusion":  # no LLM requests to read files for
        return
    if workload.arrival == "trace":
        _fix_lengths(_trace_rows(workload), workload)
        return
    for length, field, default_column in _length_files(workload):
        if length.dist == "empirical":
            read_length_column(str(length.path), length.column or default_column,
                               f"{field}.path")


def _empty_requests() -> pd.DataFrame:
    """The request table with its columns and dtypes and no rows."""
    return pd.DataFrame({"arrival_time_s": np.zeros(0), "input_tokens": np.zeros(0, np.int64),
                         "output_tokens": np.zeros(0, np.int64),
                         "client": np.zeros(0, np.int64), "think_time_s": np.zeros(0)})[
        list(COLUMNS)]


def build_requests(
    workload: Any, rng_arrivals: np.random.Generator, rng_lengths: np.random.Generator
) -> pd.DataFrame:
    """Build the request table of one run from a workload config (contract: module docstring)."""
    check_workload(workload)
    if getattr(workload, "kind", "llm") == "diffusion":  # jobs only: scenarios.diffusion
        return _empty_requests()
    multi_turn = _multi_turn(workload)
    if workload.arrival == "trace":
        rows = _trace_rows(workload)
    elif multi_turn:  # applies the fixed-length overrides to each turn itself
        rows = session_rows(workload, rng_arrivals, rng_lengths)
    else:
        rows = _synthetic_rows(workload, rng_arrivals, rng_lengths)
    if not multi_turn:
        _fix_lengths(rows, workload)
    if not multi_turn and _system_prompts(workload):
        rows = add_system_prompts(rows, workload, rng_lengths.spawn(1)[0])
    rd = _random_dataset(workload)
    if rd is not None and rd.prefix_len:
        # the tokenizer's special tokens (BOS) lead every prompt, so they are shared too
        rows["input_tokens"] -= int(rd.special_tokens)
        rows = add_shared_prefix(rows, int(rd.prefix_len) + int(rd.special_tokens),
                                 int(workload.hash_block_tokens))
    columns = [*COLUMNS, "hash_ids"] if "hash_ids" in rows else list(COLUMNS)
    if workload.classes:
        classes = assign_classes(workload.classes, len(rows), rng_lengths.spawn(1)[0])
        rows = pd.concat([rows.reset_index(drop=True), classes], axis=1)
        columns += CLASS_COLUMNS
    out = rows[columns].astype(
        {
            "arrival_time_s": "float64",
            "input_tokens": "int64",
            "output_tokens": "int64",
            "client": "int64",
            "think_time_s": "float64",
        }
    )
    return out.reset_index(drop=True)
