"""Schema and checks of ``scheduler=``: the batching policy of one serving instance."""

from __future__ import annotations

from dataclasses import dataclass

from sim.config.common import positive
from sim.config.model import ModelConfig
from sim.errors import ConfigError


@dataclass
class SchedulerConfig:
    """Batching policy of one serving instance and its limits (vLLM names)."""

    name: str = "vllm"
    max_num_seqs: int = 1024
    max_num_batched_tokens: int = 8192
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    # None: the model's max_position_embeddings.
    max_model_len: int | None = None


def check_scheduler(s: SchedulerConfig, model: ModelConfig) -> None:
    """Scheduler limits must admit at least one token of one request."""
    if s.name != "vllm":
        raise ConfigError("scheduler.name", s.name, "one of ['vllm']")
    positive("scheduler.max_num_seqs", s.max_num_seqs)
    positive("scheduler.max_num_batched_tokens", s.max_num_batched_tokens)
    if s.long_prefill_token_threshold < 0:
        raise ConfigError("scheduler.long_prefill_token_threshold",
                          s.long_prefill_token_threshold, "must be >= 0 (0 = off)")
    if s.max_model_len is not None:
        positive("scheduler.max_model_len", s.max_model_len)
        if s.max_model_len > model.max_position_embeddings:
            raise ConfigError("scheduler.max_model_len", s.max_model_len,
                              f"must be <= model.max_position_embeddings="
                              f"{model.max_position_embeddings}")
    max_len = s.max_model_len or model.max_position_embeddings
    if not s.enable_chunked_prefill and s.max_num_batched_tokens < max_len:
        # as vLLM: without chunking a whole prompt must fit in one step's budget
        raise ConfigError("scheduler.max_num_batched_tokens", s.max_num_batched_tokens,
                          f"must be >= max_model_len={max_len} when enable_chunked_prefill "
                          "is false")


# (group, schema name, dataclass) registered with Hydra by ``sim.app``
SCHEMAS = [
    ("scheduler", "base_scheduler", SchedulerConfig),
]
