"""Tensor, pipeline and expert parallelism: their costs by hand, and the layouts refused."""

from __future__ import annotations

import numpy as np
import pytest

from sim.builders import build_cost_model, check_config, plain
from sim.config import (
    ClusterConfig,
    HardwareConfig,
    ModelConfig,
    check_hardware,
    check_model,
    check_parallelism,
)
from sim.config.parallel import pipeline_stage_layers
from sim.cost.calibration_file import load_calibration
from sim.cost.host import HostCosts
from sim.cost.operators import comm_time
from sim.cost.pipeline import bubble_fraction, makespan
from sim.cost.roofline import RooflineCostModel
from sim.errors import ConfigError
from sim.model.layout import LayerCounts, stage_layer_counts

H100 = HardwareConfig(name="h100_sxm", bf16_flops=989.4e12, fp8_flops=1978.9e12,
                      hbm_bandwidth=3.35e12, hbm_bytes=80e9, nvlink_bandwidth=450e9,
                      pcie_bandwidth=64e9, internode_bandwidth=50e9, internode_latency_us=5.0)
EFF = load_calibration("h100_sxm", "vllm")[0]
BASE = dict(num_hidden_layers=4, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, intermediate_size=96, vocab_size=128)
MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
HEAD = ("embedding", "final_norm", "lm_head", "sampler", "host_overhead")


def tiny(**kw) -> ModelConfig:
    m = ModelConfig(name="tiny", **{**BASE, **kw})
    check_model(m)
    return m


def cost(m: ModelConfig, tp: int = 1, pp: int = 1, ep: int = 1) -> RooflineCostModel:
    return RooflineCostModel(m, H100, tp, 2, EFF, HostCosts(1e-4, 1e-6), pp=pp, ep=ep)


def ops(model, n, c) -> dict:
    return {op.name: op for op in model.breakdown(np.asarray(n), np.asarray(c))}


def p2p(nbytes: float, link: float, extra: float = 0.0) -> float:
    return float(comm_time(EFF.comm["p2p"], "p2p", nbytes, 2, link)) + extra


# ---- pipeline parallelism -------------------------------------------------------------------

def test_stage_split_follows_vllm():
    assert pipeline_stage_layers(61, 2) == [31, 30]
    assert pipeline_stage_layers(10, 4) == [2, 3, 3, 2]
    assert pipeline_stage_layers(8, 8) == [1] * 8
    m = tiny(num_hidden_layers=3, first_k_dense_replace=1, **MOE)
    assert stage_layer_counts(m, 2) == [LayerCounts(full=2, dense=1, moe=1),
                                        LayerCounts(full=1, moe=1)]


def test_makespan_formula():
    """Σ_j max_s t[s, j] + (pp − 1)·max_j max_s t[s, j], split by bound."""
    rng = np.random.default_rng(1)
    parts = rng.random((4, 3, 3, 1))  # 4 micro-batches, 3 stages, (compute, memory, comm)
    total, bubble = makespan([list(stages) for stages in parts], 3)
    per_mb = parts.sum(axis=2)[..., 0].max(axis=1)
    assert total.sum() == pytest.approx(per_mb.sum() + 2 * per_mb.max())
    assert bubble.sum() == pytest.approx(2 * per_mb.max())
    same = [[np.ones((3, 1))] * 2] * 2
    total, bubble = makespan(same, 2)
    assert total.sum() == pytest.approx((2 + 2 - 1) * 3.0)
    assert bubble.sum() / total.sum() == pytest.approx(bubble_fraction(2, 2)) == 1 / 3


def test_pipeline_bubble_and_send_by_hand():
    """4 layers on 2 stages, 4 equal decode sequences in 2 micro-batches: the layers take
    (m + pp − 1)·t_stage = 3·t_stage plus one NVLink send, t_stage being 2 layers over a
    micro-batch of 2 sequences."""
    n, c = np.ones(4, int), np.full(4, 100)
    pipe = cost(tiny(), pp=2)
    half = ops(cost(tiny(num_hidden_layers=2)), n[:2], c[:2])
    t_stage = sum(op.time_s for name, op in half.items() if name not in HEAD)
    whole = ops(cost(tiny()), n, c)
    head = sum(whole[name].time_s for name in HEAD)
    send = p2p(2 * 2 * 64 * 2, H100.nvlink_bandwidth)  # hidden + residual of 2 tokens
    got = ops(pipe, n, c)
    assert got["pp_send"].time_s == pytest.approx(send)
    assert got["pp_bubble"].time_s == pytest.approx(t_stage)  # (pp − 1)·t_stage
    assert pipe.step_cost(n, c).time_s == pytest.approx(head + 3 * t_stage + send, rel=1e-12)
    assert got["qkv_proj"].count == 2 * 2  # 2 layers × 2 micro-batches on the busiest GPU
    # one prefill sequence cannot be split: it crosses both stages in turn
    full = ops(cost(tiny(num_hidden_layers=2)), [64], [0])
    t_one = sum(op.time_s for name, op in full.items() if name not in HEAD)
    head1 = sum(ops(cost(tiny()), [64], [0])[name].time_s for name in HEAD)
    send1 = p2p(2 * 64 * 64 * 2, H100.nvlink_bandwidth)
    assert pipe.step_cost(np.array([64]), np.array([0])).time_s == pytest.approx(
        head1 + 2 * t_one + send1, rel=1e-12)


def test_sends_between_nodes_use_the_network():
    """tp=4 × pp=4 on 8-GPU nodes: stage boundaries 0|1 and 2|3 stay on NVLink, 1|2 crosses."""
    model = cost(tiny(), tp=4, pp=4)
    send = ops(model, np.ones(8, int), np.full(8, 50))["pp_send"]
    nbytes = 2 * 2 * 64 * 2  # 8 sequences in 4 micro-batches of 2 tokens
    want = 2 * p2p(nbytes, H100.nvlink_bandwidth) + p2p(nbytes, H100.internode_bandwidth, 5e-6)
    assert send.count == 3 and send.time_s == pytest.approx(want)


# ---- expert parallelism ---------------------------------------------------------------------

def test_expert_parallel_communication_by_hand():
    """ep = tp = 4, 10 tokens, attention tensor-parallel: every GPU routes all 10 tokens, runs
    its 2 whole experts on the pairs routed to them, and one all-reduce of the 10 tokens'
    64 bf16 outputs sums the partial results (no all-to-all without attention DP)."""
    m = tiny(**MOE)
    T, h = 10, 64
    o = ops(cost(m, tp=4, ep=4), np.ones(T, int), np.full(T, 20))
    assert not {"ep_dispatch", "ep_combine", "ep_allgather"} & set(o)
    ar = float(comm_time(EFF.comm["allreduce"], "allreduce", T * h * 2, 4,
                         H100.nvlink_bandwidth))
    # attention outputs and MoE outputs of 4 layers, and the embedding: all T × h
    assert o["tp_allreduce"].count == 2 * 4 + 1
    assert o["tp_allreduce"].time_s == pytest.approx(9 * ar)
    assert o["router"].flops == pytest.approx(4 * 2 * T * 8 * h)  # all tokens, replicated


def test_expert_parallel_places_whole_experts():
    """Per GPU, ep = tp reads the same expected expert weights and does the same FLOPs as
    tensor-parallel experts; only the activations and the communication differ."""
    m = tiny(**MOE)
    n, c = np.ones(10, int), np.full(10, 20)
    ep, tp = ops(cost(m, tp=4, ep=4), n, c), ops(cost(m, tp=4), n, c)
    assert ep["experts"].flops == pytest.approx(tp["experts"].flops)
    distinct = 8 * (1 - (1 - 2 / 8) ** 10)
    acts = 10 / 4 * 2 * (4 * 64 + 6 * 32)
    assert ep["experts"].bytes == pytest.approx(4 * (distinct / 4 * 3 * 64 * 32 * 2 + acts))
    assert tp["tp_allreduce"].count == 2 * 4 + 1
    assert ep["tp_allreduce"].time_s == pytest.approx(tp["tp_allreduce"].time_s)


# ---- the refused layouts --------------------------------------------------------------------

def refuse(field: str, model: ModelConfig, **cluster) -> None:
    with pytest.raises(ConfigError) as err:
        check_parallelism(ClusterConfig(**cluster), model, H100)
    assert err.value.field == f"cluster.{field}"


def test_parallel_layouts_refused_with_the_field():
    dense, moe = tiny(), tiny(**MOE)
    refuse("tensor_parallel_size", dense, tensor_parallel_size=16)  # beyond one node
    refuse("tensor_parallel_size", dense, tensor_parallel_size=3)  # 4 heads
    linear = tiny(layer_types=["linear_attention", "full_attention"] * 2,
                  linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                  linear_value_head_dim=8, linear_conv_kernel_dim=4)
    refuse("tensor_parallel_size", linear, tensor_parallel_size=4)  # 2 linear key heads
    refuse("pipeline_parallel_size", dense, pipeline_parallel_size=5)  # 4 layers
    refuse("pipeline_parallel_size", dense, pipeline_parallel_size=0)
    six = tiny(num_attention_heads=6, num_key_value_heads=3, num_hidden_layers=6)
    refuse("tensor_parallel_size", six, tensor_parallel_size=3, pipeline_parallel_size=3)
    refuse("expert_parallel_size", dense, tensor_parallel_size=2, expert_parallel_size=2)
    refuse("expert_parallel_size", moe, tensor_parallel_size=4, expert_parallel_size=2)
    refuse("expert_parallel_size", tiny(**{**MOE, "num_experts": 6}), tensor_parallel_size=4,
           expert_parallel_size=4)
    refuse("tensor_parallel_size", tiny(**{**MOE, "moe_intermediate_size": 30}),
           tensor_parallel_size=4)
    refuse("data_parallel_size", moe, data_parallel_size=2)
    # accepted: pipeline stages across nodes, experts over the tensor-parallel group
    check_parallelism(ClusterConfig(tensor_parallel_size=4, pipeline_parallel_size=4), dense, H100)
    check_parallelism(ClusterConfig(tensor_parallel_size=4, expert_parallel_size=4), moe, H100)


def test_hardware_network_fields_checked():
    with pytest.raises(ConfigError, match="internode_bandwidth"):
        check_hardware(HardwareConfig(name="x", bf16_flops=1e15, hbm_bandwidth=1e12,
                                      hbm_bytes=1e10, nvlink_bandwidth=1e11,
                                      pcie_bandwidth=1e10, internode_bandwidth=0), tiny())


def test_config_wires_parallelism(compose_cfg):
    with pytest.raises(ConfigError, match="data_parallel_size"):
        check_config(plain(compose_cfg("cluster.data_parallel_size=2")))
    model = build_cost_model(plain(compose_cfg("model=llama3_70b",
                                               "cluster.tensor_parallel_size=4",
                                               "cluster.pipeline_parallel_size=2")))
    assert (model.tp, model.pp, model.ep) == (4, 2, 1)
    assert "pp_bubble" in ops(model, np.ones(8, int), np.full(8, 500))
