"""Checks of one replica's parallel layout (``cluster.*_parallel_size``) against model and GPU.

What the cost model can price faithfully, and so what is accepted here:

- tensor parallelism inside one NVLink node, splitting every kind of head evenly;
- pipeline parallelism over up to ``num_hidden_layers`` stages, across nodes as long as every
  tensor-parallel group stays inside one node;
- expert parallelism over the tensor-parallel group (``ep = tp``, vLLM's layout), the experts
  divided evenly;
- no attention data parallelism (``data_parallel_size = 1``): independent copies are
  ``cluster.replicas``.
"""

from __future__ import annotations

from sim.config.cluster import ClusterConfig
from sim.config.common import positive
from sim.config.hardware import HardwareConfig
from sim.config.model import ModelConfig
from sim.errors import ConfigError


def pipeline_stage_layers(num_layers: int, pp: int) -> list[int]:
    """Layers held by each of ``pp`` pipeline stages, as vLLM splits them
    (``get_pp_indices``): an even share each, the remainder one apiece to the stages before
    the last (which also runs the LM head)."""
    counts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        counts[-i] += 1
    return counts


def _check_tensor(tp: int, model: ModelConfig, hw: HardwareConfig) -> None:
    positive("cluster.tensor_parallel_size", tp)
    if tp > hw.gpus_per_node:
        raise ConfigError("cluster.tensor_parallel_size", tp,
                          f"must be <= hardware.gpus_per_node={hw.gpus_per_node} (one NVLink node)")
    if model.num_attention_heads % tp:
        raise ConfigError("cluster.tensor_parallel_size", tp,
                          f"must divide model.num_attention_heads={model.num_attention_heads}")
    if "linear_attention" in (model.layer_types or ()):
        for f in ("linear_num_key_heads", "linear_num_value_heads"):
            if getattr(model, f) % tp:
                raise ConfigError("cluster.tensor_parallel_size", tp,
                                  f"must divide model.{f}={getattr(model, f)}")


def _check_pipeline(c: ClusterConfig, model: ModelConfig, hw: HardwareConfig) -> None:
    pp, tp = c.pipeline_parallel_size, c.tensor_parallel_size
    positive("cluster.pipeline_parallel_size", pp)
    if pp > model.num_hidden_layers:
        raise ConfigError("cluster.pipeline_parallel_size", pp,
                          f"must be <= model.num_hidden_layers={model.num_hidden_layers}")
    if tp * pp > hw.gpus_per_node and hw.gpus_per_node % tp:
        raise ConfigError("cluster.tensor_parallel_size", tp,
                          f"must divide hardware.gpus_per_node={hw.gpus_per_node} when the "
                          f"{tp * pp} GPUs of tp x pp span nodes (a tensor-parallel group "
                          "stays inside one node)")


def _check_expert(c: ClusterConfig, model: ModelConfig) -> None:
    ep, tp = c.expert_parallel_size, c.tensor_parallel_size
    positive("cluster.expert_parallel_size", ep)
    if ep == 1:
        if model.num_experts and model.moe_intermediate_size % tp:
            raise ConfigError("cluster.tensor_parallel_size", tp,
                              "must divide model.moe_intermediate_size="
                              f"{model.moe_intermediate_size} (experts are tensor-parallel)")
        return
    if not model.num_experts:
        raise ConfigError("cluster.expert_parallel_size", ep,
                          f"must be 1: model {model.name} has no routed experts")
    if ep != tp:
        raise ConfigError("cluster.expert_parallel_size", ep,
                          f"must be 1 or tensor_parallel_size={tp} (experts spread over the "
                          "tensor-parallel group; mixed expert and tensor sharding of experts "
                          "is not modelled)")
    if model.num_experts % ep:
        raise ConfigError("cluster.expert_parallel_size", ep,
                          f"must divide model.num_experts={model.num_experts}")


def check_parallelism(c: ClusterConfig, model: ModelConfig, hw: HardwareConfig) -> None:
    """Refuse a tensor, pipeline, expert or data parallel layout the cost model cannot price
    (see the module doc), naming the field."""
    _check_tensor(c.tensor_parallel_size, model, hw)
    _check_pipeline(c, model, hw)
    _check_expert(c, model)
    if c.data_parallel_size != 1:
        raise ConfigError("cluster.data_parallel_size", c.data_parallel_size,
                          "must be 1: attention data parallelism inside one engine is not "
                          "modelled; use cluster.replicas for independent copies")
