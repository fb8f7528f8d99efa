"""Checks of one replica's parallel layout (``cluster.*_parallel_size``) against model and GPU."""

from __future__ import annotations

from sim.config.cluster import ClusterConfig
from sim.config.common import positive
from sim.config.hardware import HardwareConfig
from sim.config.model import ModelConfig
from sim.errors import ConfigError


def check_parallelism(c: ClusterConfig, model: ModelConfig, hw: HardwareConfig) -> None:
    """Tensor parallelism must split heads evenly and stay inside one NVLink node."""
    tp = c.tensor_parallel_size
    positive("cluster.tensor_parallel_size", tp)
    if tp > hw.gpus_per_node:
        raise ConfigError("cluster.tensor_parallel_size", tp,
                          f"must be <= hardware.gpus_per_node={hw.gpus_per_node} (one NVLink node)")
    if model.num_attention_heads % tp:
        raise ConfigError("cluster.tensor_parallel_size", tp,
                          f"must divide model.num_attention_heads={model.num_attention_heads}")
    for f in ("pipeline_parallel_size", "expert_parallel_size", "data_parallel_size"):
        if getattr(c, f) != 1:
            raise ConfigError(f"cluster.{f}", getattr(c, f), "only 1 is supported so far")
