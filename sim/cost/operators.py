"""Roofline arithmetic shared by the cost model and its calibration.

Every operator's time is ``max(flops / (peak_flops · η_c), bytes / (peak_bw · η_m)) + launch``.
The work (FLOPs, bytes) of each operator kind is written once here, so the calibration fits the
very formulas the simulator evaluates. All functions accept numpy arrays or scalars. GEMMs and
MoE experts' grouped GEMMs live in ``sim.cost.gemm`` (re-exported here).

The efficiencies η vary with the operator's shape: an ``Eta`` is a scale times smooth factors,
each a small table over one or two shape variables (GEMM ``m``, ``n``, ``k`` and their tile
quantization; attention query tokens per sequence, sequences, bytes per sequence, query heads
per KV head; message bytes and GPU count), interpolated
linearly in log2 of the variables and in log of the factor, constant beyond the table. The
calibration (``python -m calibration fit``) fits the tables to measured kernel timings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from sim.cost.eta import (  # noqa: F401  (Term, knot_cell re-exported)
    _SCALARS,
    Eta,
    Term,
    _sig,
    evaluate,
    knot_cell,
)
from sim.cost.gemm import (  # noqa: F401  (re-exported: the GEMM family's public names)
    GemmEfficiency,
    expected_distinct_experts,
    gemm_axes,
    gemm_time,
    gemm_work,
    moe_axes,
    moe_time,
    roofline,
    wave_quantization,
)


def _eta(v) -> Eta:
    return v if isinstance(v, Eta) else Eta.from_dict(v)


@dataclass(frozen=True)
class AttentionEfficiency:
    """η of an attention kernel, plus its fixed costs.

    ``compute`` and ``memory`` are ``Eta`` over the variables of ``attention_axes``. Besides the
    launch latency, every work unit (a sequence × KV head × block of ``block_q`` queries, the
    grid of FlashAttention-style kernels) costs ``unit_s`` per wave of units over the SMs:
    what makes many tiny sequences slow even when FLOPs and bytes are negligible.

    The tables may vary with ``g``, the query heads per KV head, which is fixed for a model on
    a GPU: ``for_group`` folds it into the other axes once, so a step never evaluates it.
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

    def for_group(self, group: float) -> AttentionEfficiency:
        """This efficiency at ``group`` query heads per KV head: every table over ``g`` fixed
        there (``Eta.fix``); equal to evaluating it with ``heads = group × kv_heads``."""
        g = max(float(group), 1.0)
        compute, memory = self.compute.fix(g=g), self.memory.fix(g=g)
        if compute is self.compute and memory is self.memory:
            return self
        return replace(self, compute=compute, memory=memory)


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
    measured table carries the all-reduce's, and the file says so). ``attention_encoder`` is
    the non-causal (DiT) attention kernel's, None in files fitted before it existed (the
    pricer then uses ``attention_prefill`` on the same work).
    """

    gemm: dict[str, GemmEfficiency]
    attention_prefill: AttentionEfficiency
    attention_decode: AttentionEfficiency
    elementwise_eta_memory: float
    elementwise_launch_s: float
    comm: dict[str, CommEfficiency]
    moe: dict[str, GemmEfficiency] = field(default_factory=dict)
    attention_encoder: AttentionEfficiency | None = None

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
            attention_encoder=(AttentionEfficiency.from_dict(d["attention_encoder"])
                               if d.get("attention_encoder") else None),
        )

    def to_dict(self) -> dict:
        """The ``parameters`` block ``from_dict`` reads (``attention_encoder`` only when set)."""
        d = {"gemm": {k: v.to_dict() for k, v in self.gemm.items()},
             "attention_prefill": self.attention_prefill.to_dict(),
             "attention_decode": self.attention_decode.to_dict(),
             "elementwise_eta_memory": _sig(self.elementwise_eta_memory),
             "elementwise_launch_s": _sig(self.elementwise_launch_s),
             "comm": {k: v.to_dict() for k, v in self.comm.items()},
             "moe": {k: v.to_dict() for k, v in self.moe.items()}}
        if self.attention_encoder is not None:
            d["attention_encoder"] = self.attention_encoder.to_dict()
        return d


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


def encoder_attention_work(batch, seq_q, seq_kv, heads, head_dim, act_bytes: float = 2.0):
    """Non-causal attention of ``batch`` sequences: ``seq_q`` queries each over all ``seq_kv``
    keys (a DiT's full attention, or one ring-attention pass over a K/V block).

    FLOPs: QKᵀ and PV, 2·2·heads·head_dim per (query, key) pair. Bytes: read Q and K, V and
    write O, all in ``act_bytes``.
    """
    flops = 4.0 * batch * seq_q * seq_kv * heads * head_dim
    nbytes = 2.0 * batch * heads * head_dim * act_bytes * (seq_q + seq_kv)
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


def attention_axes(flops, nbytes, q_per_seq, num_seqs, head_dim: float = 128.0,
                   kv_heads: float = 8.0, heads=None) -> dict:
    """The shape variables attention efficiencies are tabulated over: ``q`` query tokens per
    sequence, ``s`` sequences, ``u`` = s × KV heads (parallel units), ``d`` head dim, ``kv``
    bytes per sequence, ``c`` bytes per sequence per KV-head dimension (grows with the
    context), ``i`` the arithmetic intensity flops/bytes (in decode, grows with the query
    heads per KV head) and ``g`` the query heads per KV head (``heads`` None: 1, as for MLA's
    latent cache, whose kernels take all heads of a sequence at once)."""
    if all(isinstance(v, _SCALARS) for v in (flops, nbytes, q_per_seq, num_seqs, head_dim,
                                               kv_heads)) and (heads is None
                                                               or isinstance(heads, _SCALARS)):
        return scalar_attention_axes(flops, nbytes, q_per_seq, num_seqs, head_dim, kv_heads,
                                     heads)
    s, kvh = _at_least_one(num_seqs), _at_least_one(kv_heads)
    kv = np.maximum(nbytes / s, 1.0)
    g = 1.0 if heads is None else np.maximum(np.asarray(heads, dtype=np.float64) / kvh, 1.0)
    return {"q": _at_least_one(q_per_seq), "s": s, "u": s * kvh, "d": head_dim, "kv": kv,
            "c": np.maximum(kv / (kvh * head_dim), 1.0),
            "i": np.maximum(flops / np.maximum(nbytes, 1.0), 1e-3), "g": g}


def _at_least_one(x):
    """max(x, 1) as a float for a scalar (numpy's call cost is most of a decode window's
    pricing), elementwise for an array; the same values either way."""
    if isinstance(x, _SCALARS):
        return max(float(x), 1.0)
    return np.maximum(np.asarray(x, dtype=np.float64), 1.0)


def scalar_attention_axes(flops: float, nbytes: float, q_per_seq, num_seqs, head_dim,
                          kv_heads, heads=None) -> dict:
    """``attention_axes`` of scalars (plain Python; equal to the array form elementwise)."""
    s, kvh = max(float(num_seqs), 1.0), max(float(kv_heads), 1.0)
    kv = max(nbytes / s, 1.0)
    return {"q": max(float(q_per_seq), 1.0), "s": s, "u": s * kvh, "d": float(head_dim),
            "kv": kv, "c": max(kv / (kvh * head_dim), 1.0),
            "i": max(flops / max(nbytes, 1.0), 1e-3),
            "g": 1.0 if heads is None else max(float(heads) / kvh, 1.0)}


def attention_time(e: AttentionEfficiency, flops, nbytes, q_per_seq, num_seqs, peak_flops: float,
                   peak_bw: float, head_dim: float = 128.0, kv_heads: float = 8.0,
                   num_sms: int = 132, heads=None):
    """(time, compute-bound?) of one attention kernel over ``num_seqs`` sequences doing
    ``flops`` work and moving ``nbytes``, with ``q_per_seq`` query tokens per sequence,
    ``head_dim`` and ``kv_heads`` KV heads on this GPU (MLA's latent cache: one KV head) and
    ``heads`` query heads (None: the tables' ``g`` is 1; ``AttentionEfficiency.for_group``
    fixes it beforehand)."""
    x = attention_axes(flops, nbytes, q_per_seq, num_seqs, head_dim, kv_heads, heads)
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
