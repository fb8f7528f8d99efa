"""vLLM's benchmark datasets as workload blocks: ``workload.random`` (``vllm bench serve
--dataset-name random``) and ``workload.sharegpt`` (``--dataset-name sharegpt`` known by its
mean lengths), their schemas and range checks. Either one draws both lengths of every request
(``scenarios.lengths.random_dataset_lengths``, ``scenarios.sharegpt_dataset``) in place of
``workload.input``/``output``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from scenarios.errors import WorkloadError
from scenarios.field_checks import check_int_at_least, check_tokens, finite
from scenarios.sharegpt_dataset import bounds_text as sharegpt_bounds
from scenarios.sharegpt_dataset import reachable as sharegpt_reachable
from scenarios.traces import MAX_TOKENS


@dataclass
class RandomDatasetConfig:
    """vLLM's ``vllm bench serve --dataset-name random``: every prompt is ``prefix_len`` tokens
    shared by all requests followed by its own tokens, a uniform integer in
    ``[floor(L·(1 − r)), ceil(L·(1 + r))]`` with ``L = input_len − special_tokens`` and
    ``r = range_ratio``, plus the ``special_tokens`` the tokenizer adds back (so with ``r = 0``
    a prompt is exactly ``prefix_len + input_len``); outputs are uniform in
    ``[max(1, floor(output_len·(1 − r))), ceil(output_len·(1 + r))]``, generated in full (as
    with ``--ignore-eos``). As vLLM's ``RandomDataset.get_text_sampling_params``."""

    input_len: int = 1024  # --random-input-len
    output_len: int = 128  # --random-output-len
    range_ratio: float = 0.0  # --random-range-ratio, in [0, 1)
    prefix_len: int = 0  # --random-prefix-len: tokens every prompt starts with
    # tokens the tokenizer adds to a prompt (1 for Llama's BOS, 0 for Qwen's), which vLLM
    # takes off input_len before applying the range
    special_tokens: int = 0


@dataclass
class ShareGPTDatasetConfig:
    """vLLM's ``vllm bench serve --dataset-name sharegpt`` known by its mean lengths only:
    prompts and replies drawn to these means under the client's filter
    (``scenarios.sharegpt_dataset``), generated in full. The defaults are the means of the
    gpustack H100 runs' 1,000-prompt samples (214.5–217.9 in, 187–202 out by tokenizer)."""

    input_mean: float = 215.0  # mean prompt tokens
    output_mean: float = 200.0  # mean reply tokens (max_tokens)



def check_sharegpt(w: Any) -> None:
    """Range checks of ``workload.sharegpt`` (vLLM's ShareGPT dataset by its means) and the
    settings it cannot be combined with."""
    sg, p = _dataset(w, "sharegpt")
    if sg is None:
        return
    if getattr(w, "random", None) is not None:
        raise WorkloadError(p, "set", "null with workload.random (one dataset draws the lengths)")
    if getattr(w, "total_length", None) is not None:
        raise WorkloadError("workload.total_length", "set",
                            f"null with {p} (the ShareGPT dataset draws both lengths)")
    mt = getattr(w, "multi_turn", None)
    if mt is not None and mt.enabled:
        raise WorkloadError("workload.multi_turn.enabled", mt.enabled,
                            f"false with {p} (vLLM's ShareGPT dataset sends single turns)")
    for name in ("input_mean", "output_mean"):
        if not finite(getattr(sg, name)):
            raise WorkloadError(f"{p}.{name}", getattr(sg, name), "must be a finite number")
    if not sharegpt_reachable(sg.input_mean, sg.output_mean):
        name = "output_mean" if sharegpt_reachable(sg.input_mean, 8) else "input_mean"
        raise WorkloadError(f"{p}.{name}", getattr(sg, name),
                            f"out of what the client's filter keeps: {sharegpt_bounds()}")


def _dataset(w: Any, name: str) -> tuple[Any, str]:
    """``workload.<name>`` (a benchmark dataset's block, or None) and its dotted path; a block
    set with ``arrival=trace`` is refused (a trace brings its own lengths)."""
    block, p = getattr(w, name, None), f"workload.{name}"
    if block is not None and w.arrival == "trace":
        raise WorkloadError(p, "set", "null with arrival=trace (a trace brings its own lengths)")
    return block, p


def check_random(w: Any) -> None:
    """Range checks of ``workload.random`` (vLLM's random dataset) and the settings it cannot
    be combined with."""
    rd, p = _dataset(w, "random")
    if rd is None:
        return
    check_tokens(f"{p}.input_len", rd.input_len)
    check_tokens(f"{p}.output_len", rd.output_len)
    if not (finite(rd.range_ratio) and 0 <= rd.range_ratio < 1):
        raise WorkloadError(f"{p}.range_ratio", rd.range_ratio, "must be a number in [0, 1)")
    check_int_at_least(f"{p}.prefix_len", rd.prefix_len, 0)
    check_int_at_least(f"{p}.special_tokens", rd.special_tokens, 0)
    if rd.special_tokens >= rd.input_len:
        raise WorkloadError(f"{p}.special_tokens", rd.special_tokens,
                            f"must be below {p}.input_len={rd.input_len}")
    (low, high), _ = random_length_bounds(rd)
    if low < 1:
        raise WorkloadError(f"{p}.range_ratio", rd.range_ratio,
                            f"too wide for {p}.input_len={rd.input_len}: the shortest prompt "
                            "would have no tokens of its own")
    if high + rd.prefix_len > MAX_TOKENS:
        raise WorkloadError(f"{p}.input_len", rd.input_len,
                            f"prompts up to {high + rd.prefix_len} tokens; at most {MAX_TOKENS}")
    if getattr(w, "total_length", None) is not None:
        raise WorkloadError("workload.total_length", "set",
                            f"null with {p} (the random dataset draws both lengths)")
    sp, mt = getattr(w, "system_prompt", None), getattr(w, "multi_turn", None)
    if sp is not None and sp.count:
        raise WorkloadError("workload.system_prompt.count", sp.count,
                            f"0 with {p} (its shared prefix is {p}.prefix_len)")
    if mt is not None and mt.enabled:
        raise WorkloadError("workload.multi_turn.enabled", mt.enabled,
                            f"false with {p} (vLLM's random dataset sends single turns)")


def random_length_bounds(rd: Any) -> tuple[tuple[int, int], tuple[int, int]]:
    """Inclusive bounds of a random-dataset request's own prompt tokens (special tokens
    included, prefix not) and of its output tokens, as vLLM computes them (floor below, ceil
    above, of the range around ``input_len`` less the special tokens)."""
    r, s = float(rd.range_ratio), int(rd.special_tokens)
    real = int(rd.input_len) - s
    inputs = (math.floor(real * (1 - r)) + s, math.ceil(real * (1 + r)) + s)
    outputs = (max(1, math.floor(int(rd.output_len) * (1 - r))),
               math.ceil(int(rd.output_len) * (1 + r)))
    return inputs, outputs
