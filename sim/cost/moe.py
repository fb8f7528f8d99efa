"""The mixture-of-experts block of one layer, for ``T`` tokens, per GPU.

- **Router**: a bf16 GEMM ``[T, hidden]·[hidden, E]`` (gates stay bf16 in FP8 checkpoints),
  then top-k softmax.
- **Routed experts** through ``moe_time``: ``T·k`` token-expert pairs touching the expected
  number of distinct experts ``E·(1 − (1 − k/E)^T)`` (``expected_distinct_experts``), whose
  gate/up and down weights are read once each. Without expert parallelism (``ep = 1``) every
  GPU holds all ``E`` experts, each split ``tp`` ways, and sees all ``T·k`` pairs. With
  ``ep = tp`` each GPU holds ``E/ep`` whole experts and, on average, ``T·k/ep`` pairs touching
  ``1/ep`` of the distinct experts. FP8 experts (per-tensor or block-scaled, each with its own
  MoE efficiency) run at the FP8 peak; MXFP4 experts (gpt-oss)
  are read as 4.25-bit weights and multiplied at the bf16 peak, as on GPUs without FP4 tensor
  cores, with the MXFP4 MoE efficiency where the calibration has one.
- **Shared experts**: a dense gated MLP of ``shared_expert_intermediate_size``, split ``tp``
  ways like a dense MLP.
- **Communication.** Attention is tensor-parallel (no attention data parallelism), so after
  attention's all-reduce every GPU of the group holds all ``T`` tokens. Each GPU routes them
  all (the router is replicated), runs its experts on the pairs routed to them (``ep = tp``:
  its ``E/ep`` whole experts; ``ep = 1``: its ``1/tp`` slice of every expert) and the partial
  outputs are summed by one **all-reduce** of ``T·hidden``, as for a dense MLP. This is how
  vLLM (``FusedMoE`` with ``enable_expert_parallel`` and ``data_parallel_size = 1`` reduces
  with ``tensor_model_parallel_all_reduce``), SGLang and TensorRT-LLM run expert parallelism
  without attention DP; the all-to-all dispatch/combine of wide EP (DeepEP) needs attention DP,
  which the simulator does not model yet.
"""

from __future__ import annotations

from sim.config import HardwareConfig
from sim.cost.base import OperatorCost
from sim.cost.operators import expected_distinct_experts
from sim.cost.pricing import ACT_BYTES, Pricer
from sim.model.layout import PerGpu


def expert_math_dtype(g: PerGpu) -> str:
    """The dtype whose tensor-core peak the routed experts run at."""
    return "bfloat16" if g.expert_dtype == "mxfp4" else g.expert_dtype


def expert_efficiency_key(g: PerGpu, moe_table: dict) -> str:
    """Which calibrated MoE efficiency the experts use: their storage dtype's where one was
    fitted (e.g. MXFP4 kernels), else that of the dtype they compute in."""
    return g.expert_dtype if g.expert_dtype in moe_table else expert_math_dtype(g)


def moe_ops(p: Pricer, g: PerGpu, hw: HardwareConfig, T: int) -> list[OperatorCost]:
    """Every operator of one MoE block for ``T`` tokens, one run each (module doc)."""
    h, E, k, ep = g.hidden, g.num_experts, g.topk, g.ep
    distinct = expected_distinct_experts(T, E, k) / ep
    ops = [p.gemm("router", T, E, h, "bfloat16"),
           p.experts("experts", T / ep, h, g.expert_inter, g.local_experts, k, distinct,
                     expert_math_dtype(g), g.expert_w_bytes,
                     expert_efficiency_key(g, p.eff.moe))]
    if g.shared_inter:
        ops += [p.gemm("shared_gate_up_proj", T, 2 * g.shared_inter, h, g.layer_dtype),
                p.gemm("shared_down_proj", T, h, g.shared_inter, g.layer_dtype)]
    pairs = T * k / ep  # token-expert pairs on this GPU
    elem = ACT_BYTES * (4 * T * h  # residual add + RMSNorm before the block
                        + 3 * pairs * g.expert_inter + 3 * T * g.shared_inter  # SiLU·mul
                        + pairs * h + T * h)  # weighted sum of the k outputs
    elem += T * E * 4.0  # router logits (fp32) through top-k softmax
    ops.append(p.elementwise("moe_norm_act", elem, 5 if g.shared_inter else 4))
    if g.tp > 1:
        ops.append(p.comm("tp_allreduce", "allreduce", T * h * ACT_BYTES, g.tp,
                          hw.nvlink_bandwidth))
    return ops
