"""Roofline arithmetic shared by the cost model and its calibration.

Every operator's time is ``max(flops / (peak_flops · η_c), bytes / (peak_bw · η_m)) + launch``.
The work (FLOPs, bytes) of each operator kind is written once here, so the calibration fits the
very formulas the simulator evaluates. All functions accept numpy arrays or scalars.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class GemmEfficiency:
    """η of a GEMM: compute efficiency saturates with each dimension (x / (x + x_half))."""

    eta_compute: float
    m_half: float
    n_half: float
    k_half: float
    eta_memory: float
    launch_s: float

    def compute_eta(self, m, n, k):
        """Fraction of peak FLOP/s reached by an m×k·k×n GEMM."""
        return (
            self.eta_compute * m / (m + self.m_half) * n / (n + self.n_half) * k / (k + self.k_half)
        )


@dataclass(frozen=True)
class AttentionEfficiency:
    """η of an attention kernel; compute efficiency saturates with query tokens per sequence."""

    eta_compute: float
    q_half: float
    eta_memory: float
    launch_s: float

    def compute_eta(self, q_per_seq):
        """Fraction of peak FLOP/s reached at this many query tokens per sequence."""
        return self.eta_compute * q_per_seq / (q_per_seq + self.q_half)


@dataclass(frozen=True)
class CommEfficiency:
    """η of one collective kind: fraction of link bandwidth reached, plus a fixed latency."""

    eta_link: float
    latency_s: float


COMM_KINDS = ("allreduce", "allgather", "alltoall", "p2p")


@dataclass(frozen=True)
class Efficiency:
    """All calibrated efficiency parameters of one GPU and backend
    (``sim/cost/calibrated/<hardware>/<backend>.yaml``).

    ``moe`` is the grouped-GEMM efficiency of MoE experts per dtype (the dense GEMM's when no
    MoE table was fitted); ``comm`` has one entry per kind of ``COMM_KINDS`` (a kind without a
    measured table carries the all-reduce's, and the file says so).
    """

    gemm: dict[str, GemmEfficiency]
    attention_prefill: AttentionEfficiency
    attention_decode: AttentionEfficiency
    elementwise_eta_memory: float
    elementwise_launch_s: float
    comm: dict[str, CommEfficiency]
    moe: dict[str, GemmEfficiency]

    @classmethod
    def from_dict(cls, d: dict) -> Efficiency:
        """Build from the ``parameters`` block of a calibrated file."""
        gemm = {k: GemmEfficiency(**v) for k, v in d["gemm"].items()}
        comm = {k: CommEfficiency(**v) for k, v in d["comm"].items()}
        for kind in COMM_KINDS:
            comm.setdefault(kind, comm["allreduce"])
        moe = {k: GemmEfficiency(**v) for k, v in d.get("moe", {}).items()}
        for k, v in gemm.items():
            moe.setdefault(k, v)
        return cls(
            gemm=gemm,
            attention_prefill=AttentionEfficiency(**d["attention_prefill"]),
            attention_decode=AttentionEfficiency(**d["attention_decode"]),
            elementwise_eta_memory=d["elementwise_eta_memory"],
            elementwise_launch_s=d["elementwise_launch_s"],
            comm=comm,
            moe=moe,
        )


def roofline(flops, nbytes, peak_flops, peak_bw, eta_c, eta_m, launch_s):
    """Time on the roofline, and whether the compute roof binds (else the memory roof)."""
    t_compute = flops / (peak_flops * eta_c)
    t_memory = nbytes / (peak_bw * eta_m)
    return np.maximum(t_compute, t_memory) + launch_s, t_compute >= t_memory


def gemm_work(m, n, k, in_bytes: float, out_bytes: float = 2.0):
    """FLOPs and bytes of C[m,n] = A[m,k]·B[k,n]: read A and B once, write C once."""
    flops = 2.0 * m * n * k
    nbytes = in_bytes * (m * k + k * n) + out_bytes * m * n
    return flops, nbytes


def prefill_attention_work(
    q, ctx, heads, kv_heads, head_dim, kv_bytes: float, act_bytes: float = 2.0
):
    """Causal attention of ``q`` new tokens over ``ctx`` cached ones, per sequence.

    FLOPs: QKᵀ and PV, 2·2·heads·head_dim per (query, key) pair; query i sees ctx + i keys,
    so a chunk sees q·(ctx + (q + 1)/2) pairs. Bytes: read K and V of all ctx + q tokens,
    read Q and write O.
    """
    pairs = q * (ctx + (q + 1) / 2.0)
    flops = 4.0 * heads * head_dim * pairs
    nbytes = (
        ctx + q
    ) * 2.0 * kv_heads * head_dim * kv_bytes + 2.0 * q * heads * head_dim * act_bytes
    return flops, nbytes


def decode_attention_work(
    ctx_total, num_seqs, heads, kv_heads, head_dim, kv_bytes: float, act_bytes: float = 2.0
):
    """``num_seqs`` decode tokens, each over its cached tokens plus itself.

    ``ctx_total`` is the sum of cached tokens over those sequences; this equals summing
    ``prefill_attention_work(1, ctx_i, ...)`` over them.
    """
    keys = ctx_total + num_seqs
    flops = 4.0 * heads * head_dim * keys
    nbytes = (
        keys * 2.0 * kv_heads * head_dim * kv_bytes + 2.0 * num_seqs * heads * head_dim * act_bytes
    )
    return flops, nbytes


def allreduce_time(nbytes, num_gpus, link_bw, eta_link, latency_s):
    """Ring all-reduce: each GPU sends and receives 2(p−1)/p of the message over its link."""
    t = latency_s + 2.0 * (num_gpus - 1) / num_gpus * nbytes / (link_bw * eta_link)
    return np.where(np.asarray(num_gpus) > 1, t, 0.0)


def allgather_time(nbytes, num_gpus, link_bw, eta_link, latency_s):
    """Ring all-gather of a message of ``nbytes`` in total: (p−1)/p of it crosses each link."""
    t = latency_s + (num_gpus - 1) / num_gpus * nbytes / (link_bw * eta_link)
    return np.where(np.asarray(num_gpus) > 1, t, 0.0)


def alltoall_time(nbytes, num_gpus, link_bw, eta_link, latency_s):
    """All-to-all where each GPU holds ``nbytes`` and keeps 1/p of it: (p−1)/p leaves."""
    t = latency_s + (num_gpus - 1) / num_gpus * nbytes / (link_bw * eta_link)
    return np.where(np.asarray(num_gpus) > 1, t, 0.0)


def p2p_time(nbytes, link_bw, eta_link, latency_s):
    """One point-to-point send of ``nbytes`` (pipeline stages, KV transfer)."""
    return latency_s + nbytes / (link_bw * eta_link)


# ---- per-family time functions: the cost model calls only these, the calibration fits them


def gemm_time(e: GemmEfficiency, m, n, k, peak_flops: float, peak_bw: float, in_bytes: float,
              out_bytes: float = 2.0, num_sms: int = 132):
    """(time, compute-bound?) of C[m,n] = A[m,k]·B[k,n] with efficiency ``e``.

    ``num_sms`` lets efficiency forms model wave quantization over the GPU's SMs.
    """
    f, b = gemm_work(m, n, k, in_bytes, out_bytes)
    return roofline(f, b, peak_flops, peak_bw, e.compute_eta(m, n, k), e.eta_memory, e.launch_s)


def attention_time(e: AttentionEfficiency, flops, nbytes, q_per_seq, num_seqs, peak_flops: float,
                   peak_bw: float):
    """(time, compute-bound?) of one attention kernel over ``num_seqs`` sequences doing
    ``flops`` work and moving ``nbytes``, with ``q_per_seq`` query tokens per sequence."""
    return roofline(flops, nbytes, peak_flops, peak_bw, e.compute_eta(q_per_seq), e.eta_memory,
                    e.launch_s)


def comm_time(e: CommEfficiency, kind: str, nbytes, num_gpus, link_bw: float):
    """Time of one collective of ``kind`` (``COMM_KINDS``) moving a message of ``nbytes``."""
    if kind == "allreduce":
        return allreduce_time(nbytes, num_gpus, link_bw, e.eta_link, e.latency_s)
    if kind == "allgather":
        return allgather_time(nbytes, num_gpus, link_bw, e.eta_link, e.latency_s)
    if kind == "alltoall":
        return alltoall_time(nbytes, num_gpus, link_bw, e.eta_link, e.latency_s)
    if kind == "p2p":
        return p2p_time(nbytes, link_bw, e.eta_link, e.latency_s)
    raise ValueError(f"unknown collective kind {kind!r}; one of {COMM_KINDS}")


def expected_distinct_experts(num_tokens, num_experts: int, topk: int):
    """Expected number of distinct experts that ``num_tokens`` tokens touch when each picks
    ``topk`` of ``num_experts`` uniformly without replacement: E·(1 − (1 − k/E)^T).

    Not "all" (few tokens touch few experts) and not "k" (many tokens spread over all).
    """
    t = np.asarray(num_tokens, dtype=np.float64)
    return num_experts * (1.0 - (1.0 - topk / num_experts) ** t)


def moe_time(e: GemmEfficiency, num_tokens, hidden: int, inter: int, num_experts: int, topk: int,
             distinct_experts, peak_flops: float, peak_bw: float, w_bytes: float,
             num_sms: int = 132):
    """(time, compute-bound?) of the routed experts' grouped GEMMs (gate/up and down) on one GPU.

    ``num_experts`` experts live on this GPU, each with gate/up [hidden, 2·inter] and down
    [inter, hidden] weights; ``num_tokens·topk`` token-expert pairs land on them, touching
    ``distinct_experts`` of them, whose weights are read once each.
    """
    pairs = np.asarray(num_tokens, dtype=np.float64) * topk
    flops = 2.0 * pairs * hidden * 3 * inter
    weights = distinct_experts * 3.0 * hidden * inter * w_bytes
    acts = pairs * (hidden * 2 + 2 * inter * 2 + inter * 2 + hidden * 2)
    m = pairs / np.maximum(distinct_experts, 1.0)  # tokens per touched expert
    eta_c = e.compute_eta(np.maximum(m, 1.0), 2 * inter, hidden)
    return roofline(flops, weights + acts, peak_flops, peak_bw, eta_c, e.eta_memory, e.launch_s)
