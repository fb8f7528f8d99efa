"""Roofline arithmetic shared by the cost model and its calibration.

Every operator's time is ``max(flops / (peak_flops · η_c), bytes / (peak_bw · η_m)) + launch``.
The work (FLOPs, bytes) of each operator kind is written once here, so the calibration fits the
very formulas the simulator evaluates. All functions accept numpy arrays or scalars.

The efficiencies η vary with the operator's shape: an ``Eta`` is a scale times smooth factors,
each a small table over one or two shape variables (GEMM ``m``, ``n``, ``k``; attention query
tokens per sequence, sequences, bytes per sequence; message bytes and GPU count), interpolated
linearly in log2 of the variables and in log of the factor, constant beyond the table. The
calibration (``python -m calibration fit``) fits the tables to measured kernel timings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from sim.cost.eta import (  # noqa: F401  (Term, knot_cell re-exported)
    _SCALARS,
    Eta,
    Term,
    _sig,
    evaluate,
    knot_cell,
)


def _eta(v) -> Eta:
    return v if isinstance(v, Eta) else Eta.from_dict(v)


@dataclass(frozen=True)
class GemmEfficiency:
    """η of a GEMM C[m,n] = A[m,k]·B[k,n] (also of MoE grouped GEMMs).

    ``compute`` and ``memory`` are ``Eta`` over the shape variables ``m``, ``n``, ``k``.
    An ``m`` above ``align_m`` that is not a multiple of it multiplies η by ``unaligned_compute``
    / ``unaligned_memory`` (FP8 kernels pad such tiles). ``tile_m``/``tile_n`` > 0 switch on
    tile-and-wave quantization of the compute work over the GPU's SMs (``wave_quantization``);
    0 leaves it to the fitted tables.
    """

    compute: Eta
    memory: Eta
    launch_s: float
    align_m: int = 16
    unaligned_compute: float = 1.0
    unaligned_memory: float = 1.0
    tile_m: int = 0
    tile_n: int = 0
    per_expert_s: float = 0.0  # MoE only: fixed cost per touched expert (``moe_time``)

    @classmethod
    def from_dict(cls, d: dict) -> GemmEfficiency:
        """From a calibrated file's block (``compute``, ``memory``, ``launch_s``, …)."""
        return cls(_eta(d["compute"]), _eta(d["memory"]), float(d["launch_s"]),
                   int(d.get("align_m", 16)), float(d.get("unaligned_compute", 1.0)),
                   float(d.get("unaligned_memory", 1.0)), int(d.get("tile_m", 0)),
                   int(d.get("tile_n", 0)), float(d.get("per_expert_s", 0.0)))

    def to_dict(self) -> dict:
        """The block ``from_dict`` reads."""
        return {"compute": self.compute.to_dict(), "memory": self.memory.to_dict(),
                "launch_s": _sig(self.launch_s), "align_m": self.align_m,
                "unaligned_compute": _sig(self.unaligned_compute),
                "unaligned_memory": _sig(self.unaligned_memory),
                "tile_m": self.tile_m, "tile_n": self.tile_n,
                "per_expert_s": _sig(self.per_expert_s)}

    def _unaligned(self, m, factor: float):
        if factor == 1.0:
            return 1.0
        if isinstance(m, _SCALARS):  # one GEMM: the same test without numpy's call cost
            m = float(m)
            return factor if m > self.align_m and m % self.align_m != 0 else 1.0
        m = np.asarray(m, dtype=np.float64)
        return np.where((m > self.align_m) & (np.mod(m, self.align_m) != 0), factor, 1.0)

    def compute_eta(self, m, n, k):
        """Fraction of peak FLOP/s reached by an m×k·k×n GEMM."""
        return self.compute(m=m, n=n, k=k) * self._unaligned(m, self.unaligned_compute)

    def memory_eta(self, m, n, k):
        """Fraction of peak HBM bandwidth reached by an m×k·k×n GEMM."""
        return self.memory(m=m, n=n, k=k) * self._unaligned(m, self.unaligned_memory)


@dataclass(frozen=True)
class AttentionEfficiency:
    """η of an attention kernel, plus its fixed costs.

    ``compute`` and ``memory`` are ``Eta`` over the variables of ``attention_axes``. Besides the
    launch latency, every work unit (a sequence × KV head × block of ``block_q`` queries, the
    grid of FlashAttention-style kernels) costs ``unit_s`` per wave of units over the SMs:
    what makes many tiny sequences slow even when FLOPs and bytes are negligible.
    """

    compute: Eta
    memory: Eta
    launch_s: float
    unit_s: float = 0.0
    block_q: int = 128

    @classmethod
    def from_dict(cls, d: dict) -> AttentionEfficiency:
        """From a calibrated file's block."""
        return cls(_eta(d["compute"]), _eta(d["memory"]), float(d["launch_s"]),
                   float(d.get("unit_s", 0.0)), int(d.get("block_q", 128)))

    def to_dict(self) -> dict:
        """The block ``from_dict`` reads."""
        return {"compute": self.compute.to_dict(), "memory": self.memory.to_dict(),
                "launch_s": _sig(self.launch_s), "unit_s": _sig(self.unit_s),
                "block_q": self.block_q}


@dataclass(frozen=True)
class CommEfficiency:
    """η of one collective kind: two algorithms, the library takes the faster.

    - *one-shot* (small messages): every GPU reads the whole message from each peer,
      ``latency_small_s + (p − 1)·bytes / (link · eta_small)``;
    - *bandwidth-optimal* (ring / two-shot): ``latency_s + β(p)·bytes / (link · eta_link)``
      with β of the kind (``comm_time``).

    ``eta_link`` may vary with the message (an ``Eta`` over ``nbytes`` and ``gpus``), which
    captures the protocol changes between the two regimes. ``eta_small = 0`` disables one-shot.
    """

    eta_link: Eta
    latency_s: float
    eta_small: float = 0.0
    latency_small_s: float = 0.0

    @classmethod
    def from_dict(cls, d: dict) -> CommEfficiency:
        """From a calibrated file's block."""
        return cls(_eta(d["eta_link"]), float(d["latency_s"]), float(d.get("eta_small", 0.0)),
                   float(d.get("latency_small_s", 0.0)))

    def to_dict(self) -> dict:
        """The block ``from_dict`` reads."""
        return {"eta_link": self.eta_link.to_dict(), "latency_s": _sig(self.latency_s),
                "eta_small": _sig(self.eta_small), "latency_small_s": _sig(self.latency_small_s)}


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
    moe: dict[str, GemmEfficiency] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict) -> Efficiency:
        """Build from the ``parameters`` block of a calibrated file."""
        gemm = {k: GemmEfficiency.from_dict(v) for k, v in d["gemm"].items()}
        comm = {k: CommEfficiency.from_dict(v) for k, v in d["comm"].items()}
        for kind in COMM_KINDS:
            comm.setdefault(kind, comm["allreduce"])
        moe = {k: GemmEfficiency.from_dict(v) for k, v in (d.get("moe") or {}).items()}
        for k, v in gemm.items():
            moe.setdefault(k, v)
        return cls(
            gemm=gemm,
            attention_prefill=AttentionEfficiency.from_dict(d["attention_prefill"]),
            attention_decode=AttentionEfficiency.from_dict(d["attention_decode"]),
            elementwise_eta_memory=float(d["elementwise_eta_memory"]),
            elementwise_launch_s=float(d["elementwise_launch_s"]),
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


def wave_quantization(m, n, tile_m: int, tile_n: int, num_sms: int):
    """Factor (≥ 1) by which tiling inflates a GEMM's compute: output tiles padded to
    ``tile_m × tile_n``, and the last wave of tiles over ``num_sms`` SMs running part-empty.
    Fewer tiles than SMs are assumed split along k to fill the GPU (no wave tail)."""
    tm = np.ceil(np.asarray(m, dtype=np.float64) / tile_m)
    tn = np.ceil(np.asarray(n, dtype=np.float64) / tile_n)
    tiles = tm * tn
    padding = tm * tile_m * tn * tile_n / (np.asarray(m, dtype=np.float64) * n)
    tail = np.where(tiles > num_sms, np.ceil(tiles / num_sms) * num_sms / tiles, 1.0)
    return padding * tail


def _comm_base(kind: str, nbytes, num_gpus):
    """Bytes each GPU moves over its link by a bandwidth-optimal algorithm of ``kind``."""
    p = np.asarray(num_gpus, dtype=np.float64)
    if kind == "allreduce":
        return 2.0 * (p - 1) / p * nbytes
    if kind in ("allgather", "alltoall", "reduce_scatter"):
        return (p - 1) / p * nbytes
    if kind == "p2p":
        return np.asarray(nbytes, dtype=np.float64) * 1.0
    raise ValueError(f"unknown collective kind {kind!r}; one of {COMM_KINDS}")


def _collective(e: CommEfficiency, kind: str, nbytes, num_gpus, link_bw: float):
    p = np.asarray(num_gpus, dtype=np.float64)
    eta = e.eta_link(nbytes=np.maximum(nbytes, 1.0), gpus=np.maximum(p, 1.0))
    t = e.latency_s + _comm_base(kind, nbytes, p) / (link_bw * eta)
    if e.eta_small > 0 and kind != "p2p":
        t = np.minimum(t, e.latency_small_s + (p - 1) * nbytes / (link_bw * e.eta_small))
    return t


def allreduce_time(nbytes, num_gpus, link_bw, e: CommEfficiency):
    """All-reduce of ``nbytes``: ring/two-shot moves 2(p−1)/p of it over each GPU's link."""
    return np.where(np.asarray(num_gpus) > 1,
                    _collective(e, "allreduce", nbytes, num_gpus, link_bw), 0.0)


def allgather_time(nbytes, num_gpus, link_bw, e: CommEfficiency):
    """All-gather of a message of ``nbytes`` in total: (p−1)/p of it crosses each link."""
    return np.where(np.asarray(num_gpus) > 1,
                    _collective(e, "allgather", nbytes, num_gpus, link_bw), 0.0)


def alltoall_time(nbytes, num_gpus, link_bw, e: CommEfficiency):
    """All-to-all where each GPU holds ``nbytes`` and keeps 1/p of it: (p−1)/p leaves."""
    return np.where(np.asarray(num_gpus) > 1,
                    _collective(e, "alltoall", nbytes, num_gpus, link_bw), 0.0)


def p2p_time(nbytes, link_bw, e: CommEfficiency):
    """One point-to-point send of ``nbytes`` (pipeline stages, KV transfer)."""
    return _collective(e, "p2p", nbytes, 2, link_bw)


# ---- per-family time functions: the cost model calls only these, the calibration fits them


def gemm_time(e: GemmEfficiency, m, n, k, peak_flops: float, peak_bw: float, in_bytes: float,
              out_bytes: float = 2.0, num_sms: int = 132):
    """(time, compute-bound?) of C[m,n] = A[m,k]·B[k,n] with efficiency ``e``.

    ``num_sms`` is the GPU's SM count, for tile-and-wave quantization when ``e`` has tiles.
    """
    f, b = gemm_work(m, n, k, in_bytes, out_bytes)
    if e.tile_m and e.tile_n:
        f = f * wave_quantization(m, n, e.tile_m, e.tile_n, num_sms)
    eta_c, eta_m = evaluate((e.compute, e.memory), {"m": m, "n": n, "k": k})
    return roofline(f, b, peak_flops, peak_bw, eta_c * e._unaligned(m, e.unaligned_compute),
                    eta_m * e._unaligned(m, e.unaligned_memory), e.launch_s)


def attention_axes(flops, nbytes, q_per_seq, num_seqs, head_dim: float = 128.0,
                   kv_heads: float = 8.0) -> dict:
    """The shape variables attention efficiencies are tabulated over: ``q`` query tokens per
    sequence, ``s`` sequences, ``u`` = s × KV heads (parallel units), ``d`` head dim, ``kv``
    bytes per sequence, ``c`` bytes per sequence per KV-head dimension (grows with the
    context) and ``i`` the arithmetic intensity flops/bytes (in decode, grows with the query
    heads per KV head)."""
    if all(isinstance(v, _SCALARS) for v in (flops, nbytes, q_per_seq, num_seqs, head_dim,
                                               kv_heads)):
        return scalar_attention_axes(flops, nbytes, q_per_seq, num_seqs, head_dim, kv_heads)
    s, kvh = _at_least_one(num_seqs), _at_least_one(kv_heads)
    kv = np.maximum(nbytes / s, 1.0)
    return {"q": _at_least_one(q_per_seq), "s": s, "u": s * kvh, "d": head_dim, "kv": kv,
            "c": np.maximum(kv / (kvh * head_dim), 1.0),
            "i": np.maximum(flops / np.maximum(nbytes, 1.0), 1e-3)}


def _at_least_one(x):
    """max(x, 1) as a float for a scalar (numpy's call cost is most of a decode window's
    pricing), elementwise for an array; the same values either way."""
    if isinstance(x, _SCALARS):
        return max(float(x), 1.0)
    return np.maximum(np.asarray(x, dtype=np.float64), 1.0)


def scalar_attention_axes(flops: float, nbytes: float, q_per_seq, num_seqs, head_dim,
                          kv_heads) -> dict:
    """``attention_axes`` of scalars (plain Python; equal to the array form elementwise)."""
    s, kvh = max(float(num_seqs), 1.0), max(float(kv_heads), 1.0)
    kv = max(nbytes / s, 1.0)
    return {"q": max(float(q_per_seq), 1.0), "s": s, "u": s * kvh, "d": float(head_dim),
            "kv": kv, "c": max(kv / (kvh * head_dim), 1.0),
            "i": max(flops / max(nbytes, 1.0), 1e-3)}


def attention_time(e: AttentionEfficiency, flops, nbytes, q_per_seq, num_seqs, peak_flops: float,
                   peak_bw: float, head_dim: float = 128.0, kv_heads: float = 8.0,
                   num_sms: int = 132):
    """(time, compute-bound?) of one attention kernel over ``num_seqs`` sequences doing
    ``flops`` work and moving ``nbytes``, with ``q_per_seq`` query tokens per sequence,
    ``head_dim`` and ``kv_heads`` KV heads on this GPU (MLA's latent cache: one KV head)."""
    x = attention_axes(flops, nbytes, q_per_seq, num_seqs, head_dim, kv_heads)
    eta_c, eta_m = evaluate((e.compute, e.memory), x)  # both tables in one pass
    t, cb = roofline(flops, nbytes, peak_flops, peak_bw, eta_c, eta_m, e.launch_s)
    if e.unit_s:
        q = x["q"] / e.block_q
        units = x["u"] * (math.ceil(q) if isinstance(q, _SCALARS) else np.ceil(q))
        t = t + e.unit_s * units / num_sms
    return t, cb


def comm_time(e: CommEfficiency, kind: str, nbytes, num_gpus, link_bw: float):
    """Time of one collective of ``kind`` (``COMM_KINDS``) moving a message of ``nbytes``."""
    if kind == "allreduce":
        return allreduce_time(nbytes, num_gpus, link_bw, e)
    if kind == "allgather":
        return allgather_time(nbytes, num_gpus, link_bw, e)
    if kind == "alltoall":
        return alltoall_time(nbytes, num_gpus, link_bw, e)
    if kind == "p2p":
        return p2p_time(nbytes, link_bw, e)
    raise ValueError(f"unknown collective kind {kind!r}; one of {COMM_KINDS}")


def expected_distinct_experts(num_tokens, num_experts: int, topk: int):
    """Expected number of distinct experts that ``num_tokens`` tokens touch when each picks
    ``topk`` of ``num_experts`` uniformly without replacement: E·(1 − (1 − k/E)^T).

    Not "all" (few tokens touch few experts) and not "k" (many tokens spread over all).
    """
    t = np.asarray(num_tokens, dtype=np.float64)
    return num_experts * (1.0 - (1.0 - topk / num_experts) ** t)


def moe_axes(num_tokens, inter: int, hidden: int, topk: int, distinct_experts) -> dict:
    """GEMM shape variables of the experts' grouped GEMMs: ``m`` token-expert pairs per touched
    expert, ``n`` the gate/up width 2·inter, ``k`` hidden."""
    pairs = np.asarray(num_tokens, dtype=np.float64) * topk
    m = np.maximum(pairs / np.maximum(distinct_experts, 1.0), 1.0)
    return {"m": m, "n": 2.0 * np.asarray(inter, dtype=np.float64),
            "k": np.asarray(hidden, dtype=np.float64)}


def moe_time(e: GemmEfficiency, num_tokens, hidden: int, inter: int, num_experts: int, topk: int,
             distinct_experts, peak_flops: float, peak_bw: float, w_bytes: float,
             num_sms: int = 132):
    """(time, compute-bound?) of the routed experts' grouped GEMMs (gate/up and down) on one GPU.

    ``num_experts`` experts live on this GPU, each with gate/up [hidden, 2·inter] and down
    [inter, hidden] weights; ``num_tokens·topk`` token-expert pairs land on them, touching
    ``distinct_experts`` of them, whose weights are read once each. The efficiency tables are
    indexed by the per-expert GEMM shape (``moe_axes``); each touched expert adds
    ``e.per_expert_s`` (its grouped-GEMM problem's setup).
    """
    pairs = np.asarray(num_tokens, dtype=np.float64) * topk
    flops = 2.0 * pairs * hidden * 3 * inter
    weights = distinct_experts * 3.0 * hidden * inter * w_bytes
    acts = pairs * (hidden * 2 + 2 * inter * 2 + inter * 2 + hidden * 2)
    x = moe_axes(num_tokens, inter, hidden, topk, distinct_experts)
    eta_c, eta_m = evaluate((e.compute, e.memory), x)
    t, cb = roofline(flops, weights + acts, peak_flops, peak_bw, eta_c, eta_m, e.launch_s)
    return t + e.per_expert_s * np.asarray(distinct_experts, dtype=np.float64), cb
