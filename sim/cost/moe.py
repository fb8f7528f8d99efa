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
- **Shared experts**: a dense gated MLP of ``shared_expert_intermediate_size``.
- **Communication.** ``ep = 1``: one all-reduce of the block's output, as for a dense MLP.
  ``ep = tp`` (the wide-EP token flow): after attention's all-reduce each GPU takes its share
  ``⌈T/ep⌉`` of the tokens, routes them and sends each token to its ``k`` experts' GPUs
  (**dispatch**: an all-to-all in which each GPU holds ``⌈T/ep⌉·k·hidden`` bf16 activations),
  the experts' outputs come back the same way (**combine**), and an **all-gather** of the
  ``T·hidden`` outputs gives every GPU all tokens again for the next attention. The shared
  experts run whole on each GPU's token share (replicated weights), so they need no
  communication of their own.
"""

from __future__ import annotations

from math import ceil

from sim.config import HardwareConfig
from sim.cost.base import OperatorCost
from sim.cost.layout import PerGpu
from sim.cost.operators import expected_distinct_experts
from sim.cost.pricing import ACT_BYTES, Pricer


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
    local_tokens = ceil(T / ep)  # the busiest GPU's share of the tokens
    distinct = expected_distinct_experts(T, E, k) / ep
    ops = [p.gemm("router", local_tokens, E, h, "bfloat16"),
           p.experts("experts", T / ep, h, g.expert_inter, g.local_experts, k, distinct,
                     expert_math_dtype(g), g.expert_w_bytes,
                     expert_efficiency_key(g, p.eff.moe))]
    if g.shared_inter:
        ops += [p.gemm("shared_gate_up_proj", local_tokens, 2 * g.shared_inter, h,
                       g.layer_dtype),
                p.gemm("shared_down_proj", local_tokens, h, g.shared_inter, g.layer_dtype)]
    pairs = local_tokens * k
    elem = ACT_BYTES * (4 * T * h  # residual add + RMSNorm before the block
                        + 3 * pairs * g.expert_inter + 3 * local_tokens * g.shared_inter  # SiLU·mul
                        + pairs * h + local_tokens * h)  # weighted sum of the k outputs
    elem += local_tokens * E * 4.0  # router logits (fp32) through top-k softmax
    ops.append(p.elementwise("moe_norm_act", elem, 5 if g.shared_inter else 4))
    link = hw.nvlink_bandwidth
    if ep > 1:
        a2a = local_tokens * k * h * ACT_BYTES
        ops += [p.comm("ep_dispatch", "alltoall", a2a, ep, link),
                p.comm("ep_combine", "alltoall", a2a, ep, link),
                p.comm("ep_allgather", "allgather", T * h * ACT_BYTES, ep, link)]
    elif g.tp > 1:
        ops.append(p.comm("tp_allreduce", "allreduce", T * h * ACT_BYTES, g.tp, link))
    return ops
