"""Schema and checks of ``scheduler=``: the batching policy of one serving instance.

One schema carries the fields of every policy, so that a sweep over ``scheduler=`` can share
overrides such as ``scheduler.max_num_seqs``; each YAML of ``conf/scheduler/`` lists only the
fields its policy reads, and each field's comment says which policies read it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from sim.config.common import positive
from sim.config.model import ModelConfig
from sim.errors import ConfigError

VLLM_POLICIES = ("fcfs", "priority")
CAPACITY_POLICIES = ("GUARANTEED_NO_EVICT", "MAX_UTILIZATION")


@dataclass
class SchedulerConfig:
    """Batching policy of one serving instance and its limits (vLLM names where they exist)."""

    name: str = "vllm"
    # all: most requests in one step (static/dynamic: the batch size; TRT-LLM: max_batch_size)
    max_num_seqs: int = 1024
    # all: most tokens in one step (static/dynamic: of the padded prefill; TRT-LLM: max_num_tokens)
    max_num_batched_tokens: int = 8192
    # vllm, edf, trtllm: split prompts longer than what is left of the budget
    enable_chunked_prefill: bool = True
    # vllm, edf: cap on one request's tokens per step (0 = off)
    long_prefill_token_threshold: int = 0
    # None: the model's max_position_embeddings.
    max_model_len: int | None = None
    # vllm: fcfs, or priority (waiting by (priority, arrival); preempt least urgent first)
    policy: str = "fcfs"
    # dynamic: longest wait of the oldest request before a batch that is not full starts
    max_queue_delay_ms: float = 0.0
    # sarathi: token budget of one step (decodes plus prefill chunks), Sarathi-Serve's chunk_size;
    # sglang: its --chunked-prefill-size (max_num_batched_tokens is its --max-prefill-tokens)
    chunk_size: int = 512
    # trtllm: GUARANTEED_NO_EVICT or MAX_UTILIZATION
    capacity_scheduler_policy: str = "GUARANTEED_NO_EVICT"


def _choice(field: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(field, value, f"one of {list(choices)}")


def check_scheduler(s: SchedulerConfig, model: ModelConfig, policies: Mapping[str, type]) -> None:
    """Scheduler limits must admit at least one token of one request, and every policy's own
    fields must make sense. ``policies``: the policy classes by name
    (``sim.schedulers.SCHEDULERS``), whose declarations say what each one reads, whether it
    prefills whole prompts and what else it checks."""
    _choice("scheduler.name", s.name, tuple(policies))
    policy = policies[s.name]
    positive("scheduler.max_num_seqs", s.max_num_seqs)
    positive("scheduler.max_num_batched_tokens", s.max_num_batched_tokens)
    if s.max_num_batched_tokens < s.max_num_seqs:
        # as vLLM: every running sequence must be able to decode in one step
        raise ConfigError("scheduler.max_num_batched_tokens", s.max_num_batched_tokens,
                          f"must be >= scheduler.max_num_seqs={s.max_num_seqs}")
    if s.long_prefill_token_threshold < 0:
        raise ConfigError("scheduler.long_prefill_token_threshold",
                          s.long_prefill_token_threshold, "must be >= 0 (0 = off)")
    _choice("scheduler.policy", s.policy, VLLM_POLICIES)
    if s.policy != "fcfs" and "policy" not in policy.settings:
        raise ConfigError("scheduler.policy", s.policy,
                          f"only scheduler=vllm reads it (this is scheduler={s.name}); "
                          "keep fcfs, or use scheduler=edf for deadline order")
    if not (math.isfinite(s.max_queue_delay_ms) and s.max_queue_delay_ms >= 0):
        raise ConfigError("scheduler.max_queue_delay_ms", s.max_queue_delay_ms,
                          "must be a finite number >= 0")
    positive("scheduler.chunk_size", s.chunk_size)
    _choice("scheduler.capacity_scheduler_policy", s.capacity_scheduler_policy,
            CAPACITY_POLICIES)
    policy.check(s)
    if s.max_model_len is not None:
        positive("scheduler.max_model_len", s.max_model_len)
        if s.max_model_len > model.max_position_embeddings:
            raise ConfigError("scheduler.max_model_len", s.max_model_len,
                              f"must be <= model.max_position_embeddings="
                              f"{model.max_position_embeddings}")
    max_len = s.max_model_len or model.max_position_embeddings
    if policy.prefills_whole_prompts(s) and s.max_num_batched_tokens < max_len:
        # as vLLM: without chunking a whole prompt must fit in one step's budget
        why = (f"scheduler={s.name} prefills whole prompts" if policy.whole_prompt
               else "enable_chunked_prefill is false")
        raise ConfigError("scheduler.max_num_batched_tokens", s.max_num_batched_tokens,
                          f"must be >= max_model_len={max_len} when {why} "
                          "(or lower scheduler.max_model_len)")


# (group, schema name, dataclass) registered with Hydra by ``conf.schema``
SCHEMAS = [
    ("scheduler", "base_scheduler", SchedulerConfig),
]
