"""Pipeline parallelism: one step's batch through ``pp`` stages as micro-batches.

The model (GPipe-style, within one engine step):

- The step's sequences are dealt round-robin into ``m = min(pp, S)`` micro-batches
  (sequence i goes to micro-batch ``i mod m``).
- Stage s takes ``t[s, j]`` to run micro-batch j through its layers (tensor-parallel
  all-reduces included). Every stage runs the micro-batches in order, so with identical
  stages the step takes ``Σ_j t_j + (pp − 1)·max_j t_j``: the first micro-batch fills the
  pipeline, the slowest one sets the pace of the drain. With unequal stages each micro-batch
  is charged its slowest stage, ``t_j = max_s t[s, j]``, which bounds the exact flow-shop
  time from above and equals it when the stages match.
- For m equal micro-batches that is ``(m + pp − 1)·t_stage(B/m)``: the **bubble**, the idle
  share of each GPU, is ``(pp − 1)/(m + pp − 1)``.
- Between consecutive stages each micro-batch's activations (hidden state and residual,
  ``2·T_j·hidden`` bf16 values, sent by every tensor-parallel rank to its peer) cross a link:
  NVLink inside a node, the inter-node network (plus its latency) where the boundary falls
  between nodes. Sends overlap with compute except on the fill path, which crosses every
  boundary once: ``Σ_boundaries send(max_j bytes_j)``.
- The embedding runs before the pipeline and the LM head, logits and sampler after it, once
  for the whole batch.
"""

from __future__ import annotations

import numpy as np

from sim.config import HardwareConfig
from sim.cost.base import OperatorCost
from sim.cost.pricing import ACT_BYTES, Pricer


def micro_batches(num_seqs: int, pp: int) -> list[slice]:
    """Round-robin split of ``num_seqs`` sequences into ``min(pp, num_seqs)`` micro-batches."""
    m = max(1, min(pp, num_seqs))
    return [slice(j, None, m) for j in range(m)]


def bubble_fraction(m: int, pp: int) -> float:
    """Idle share of each GPU when ``m`` equal micro-batches go through ``pp`` stages."""
    return (pp - 1) / (m + pp - 1)


def boundary_crosses_node(tp: int, gpus_per_node: int, boundary: int) -> bool:
    """Whether stage ``boundary``'s GPUs and stage ``boundary + 1``'s sit on different nodes
    (stage s holds GPUs ``[s·tp, (s+1)·tp)``, nodes hold ``gpus_per_node`` consecutive GPUs,
    and a tensor-parallel group never straddles two nodes)."""
    return ((boundary + 1) * tp) % gpus_per_node == 0


def send_ops(p: Pricer, hw: HardwareConfig, tp: int, pp: int, tokens: int,
             hidden: int) -> list[OperatorCost]:
    """The sends on the fill path: one per stage boundary of a ``tokens``-token micro-batch."""
    nbytes = 2.0 * tokens * hidden * ACT_BYTES
    ops = []
    for b in range(pp - 1):
        if boundary_crosses_node(tp, hw.gpus_per_node, b):
            ops.append(p.comm("pp_send", "p2p", nbytes, 2, hw.internode_bandwidth,
                              hw.internode_latency_us * 1e-6))
        else:
            ops.append(p.comm("pp_send", "p2p", nbytes, 2, hw.nvlink_bandwidth))
    return ops


def makespan(parts: list[list[np.ndarray]], pp: int) -> tuple[np.ndarray, np.ndarray]:
    """Pipeline time of the layers, split by bound, and its bubble.

    ``parts[j][s]`` is the (compute, memory, comm) time of micro-batch j on stage s, each an
    array over steps: shape (3, k). Returns (total, bubble), each (3, k).
    """
    per_mb = []
    for stages in parts:
        if len(stages) == 1:
            per_mb.append(stages[0])
            continue
        stack = np.stack(stages)  # (stages, 3, k)
        slowest = np.argmax(stack.sum(axis=1), axis=0)
        per_mb.append(np.take_along_axis(stack, slowest[None, None, :], axis=0)[0])
    busy = per_mb[0]
    for p in per_mb[1:]:
        busy = busy + p
    if pp == 1:
        return busy, np.zeros_like(busy)
    stack = np.stack(per_mb)  # (m, 3, k)
    worst = np.argmax(stack.sum(axis=1), axis=0)
    bubble = (pp - 1) * np.take_along_axis(stack, worst[None, None, :], axis=0)[0]
    return busy + bubble, bubble
