"""The context-dependent operators of one layer: attention over the cache, per layer kind.

Work formulas (per GPU; ``H`` query heads, ``Hkv`` KV heads, ``d`` head dim, 2-byte
activations, ``b_kv`` bytes per cached element):

- **GQA, full or sliding window** ``W``: a query at position ``p`` sees ``min(p + 1, W)`` keys
  (``W = ∞`` for full layers). A prefill chunk of ``q`` tokens over ``c`` cached ones does
  ``pairs = Σ_{i<q} min(c + i + 1, W)`` query-key pairs, ``4·H·d·pairs`` FLOPs (QKᵀ and PV),
  and reads K and V of ``min(c + q, q + W − 1)`` tokens, ``2·Hkv·d·b_kv`` bytes each, plus Q
  and O. Decode is a chunk of one: ``min(c + 1, W)`` keys. Full layers use the shared
  ``prefill_attention_work`` / ``decode_attention_work``.
- **MLA** (DeepSeek-V2/V3; ``r = kv_lora_rank``, ``ρ = qk_rope_head_dim``, ``dn``/``dv``
  nope/value head dims). The cache holds ``r + ρ`` elements per token per layer, shared by
  all heads. *Prefill* decompresses the latent of every key it attends to with ``kv_b_proj``
  (a GEMM ``[keys, r] · [r, H·(dn + dv)]``) and runs ordinary attention with head dims
  ``dn + ρ`` (QK) and ``dv`` (PV): ``2·H·pairs·(dn + ρ + dv)`` FLOPs, reading the decompressed
  K and V (``H·(dn + ρ + dv)`` bf16 elements per key) plus Q and O. *Decode* uses the absorbed
  form: ``q_absorb`` maps each head's nope query into the latent space (``[S, dn]·[dn, H·r]``),
  attention runs over the latent cache with ``2·H·keys·(2r + ρ)`` FLOPs (scores over ``r + ρ``
  dims, output over ``r``) reading ``keys·(r + ρ)·b_kv`` bytes once for all heads, plus Q
  (``H·(r + ρ)``) and O (``H·r``) per sequence; ``v_up`` maps each head's latent output to
  ``dv`` (``[S, r]·[r, H·dv]``). The absorbed weights run in bf16, as vLLM dequantizes them.
  Both absorb GEMMs count the per-head activations once (the weights dominate their bytes).
- **Gated DeltaNet** (Qwen3-Next linear attention; ``Hk`` key heads, ``Hv`` value heads,
  ``dk``/``dv`` head dims): a recurrent state of ``Hv·dk·dv`` elements per sequence, kept in
  the activation dtype. *Decode* reads and writes the state once per step and does
  ``7·Hv·dk·dv`` FLOPs per token (decay, two state-vector products, rank-one update).
  *Prefill* runs the chunked form (chunks of ``C = 64``, or ``q`` if shorter):
  ``q·Hv·(6·dk·dv + min(q, C)·(6·dk + 4·dv))`` FLOPs; it reads and writes the state once and
  the per-chunk states twice (``2 + 2·⌈q/C⌉`` state copies), plus q, k, v, o and the gates.
  Neither depends on the context length. The recurrent kernels carry the attention kernels'
  calibrated efficiencies (no table of their own has been fitted).

The attention efficiencies may vary with the query heads per KV head (GQA grouping), which is
fixed for a model on a GPU: ``AttentionOps`` fixes it once (``AttentionEfficiency.for_group``),
at 1 for MLA, whose kernels read the latent cache once for all heads of a sequence.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from sim.cost.base import OperatorCost
from sim.cost.operators import decode_attention_work, prefill_attention_work
from sim.cost.pricing import ACT_BYTES, Kernel, Pricer
from sim.model.layout import PerGpu

GDN_CHUNK = 64


def window_pairs_and_keys(q, ctx, window: int | None):
    """(query-key pairs, keys read) of a chunk of ``q`` queries over ``ctx`` cached tokens,
    each query seeing at most ``window`` keys (itself included; None: no window)."""
    q, ctx = np.asarray(q, dtype=np.float64), np.asarray(ctx, dtype=np.float64)
    if window is None:
        return q * (ctx + (q + 1) / 2.0), ctx + q
    below = np.clip(window - ctx - 1, 0, q)  # queries that see fewer than `window` keys
    pairs = below * (ctx + 1) + below * (below - 1) / 2 + (q - below) * window
    keys = np.minimum(ctx + q, q + window - 1)
    return pairs, keys


def window_decode_keys(ctx: np.ndarray, window: int, k: int) -> np.ndarray:
    """Keys read by decode steps j = 0..k−1 of sequences holding ``ctx + j`` cached tokens,
    summed over the sequences: ``Σ_i min(ctx_i + 1 + j, window)`` (exact integers)."""
    a = np.sort(np.asarray(ctx, dtype=np.int64) + 1)
    prefix = np.concatenate(([0], np.cumsum(a)))
    j = np.arange(k, dtype=np.int64)
    below = np.searchsorted(a, window - j, side="left")  # sequences still under the window
    return (prefix[below] + below * j + (len(a) - below) * window).astype(np.float64)


def mla_prefill_work(pairs, keys, q, heads: int, qk_dim: int, v_dim: int):
    """FLOPs and bytes of MLA prefill attention over decompressed K/V (module doc)."""
    flops = 2.0 * heads * pairs * (qk_dim + v_dim)
    nbytes = (keys + q) * heads * (qk_dim + v_dim) * ACT_BYTES
    return flops, nbytes


def mla_decode_work(keys, num_seqs: int, heads: int, kv_lora: int, rope: int, kv_bytes: float):
    """FLOPs and bytes of absorbed MLA decode attention over the latent cache (module doc)."""
    flops = 2.0 * heads * keys * (2 * kv_lora + rope)
    nbytes = keys * (kv_lora + rope) * kv_bytes + num_seqs * heads * (
        2 * kv_lora + rope) * ACT_BYTES
    return flops, nbytes


def gdn_work(q, g: PerGpu, decode: bool):
    """FLOPs and bytes of Gated DeltaNet's state update for chunks of ``q`` tokens (one entry
    per sequence; module doc)."""
    q = np.asarray(q, dtype=np.float64)
    hk, hv, dk, dv = g.lin_key_heads, g.lin_value_heads, g.lin_key_dim, g.lin_value_dim
    state = hv * dk * dv * ACT_BYTES
    acts = q * ((2 * hk * dk + 2 * hv * dv) + 2 * hv) * ACT_BYTES  # q, k, v, o, gates
    if decode:
        return q * hv * 7.0 * dk * dv, 2.0 * state + acts
    chunk = np.minimum(q, GDN_CHUNK)
    flops = q * hv * (6.0 * dk * dv + chunk * (6.0 * dk + 4.0 * dv))
    return flops, state * (2.0 + 2.0 * np.ceil(q / GDN_CHUNK)) + acts


def _one(x) -> np.ndarray:
    return np.array([x], dtype=np.float64)


def _const(op: OperatorCost, k: int) -> Kernel:
    """A step-independent operator repeated over a window of ``k`` steps."""
    return Kernel(op.name, np.full(k, op.flops), np.full(k, op.bytes), np.full(k, op.time_s),
                  np.full(k, op.bound == "compute"), op.dtype)


def for_group(pricer: Pricer, group: float) -> Pricer:
    """``pricer`` with its attention efficiencies fixed at ``group`` query heads per KV head
    (itself when they do not vary with it)."""
    e = pricer.eff
    pre, dec = e.attention_prefill.for_group(group), e.attention_decode.for_group(group)
    if pre is e.attention_prefill and dec is e.attention_decode:
        return pricer
    return Pricer(pricer.hw, replace(e, attention_prefill=pre, attention_decode=dec))


class AttentionOps:
    """Context-dependent operators of one layer of each attention kind."""

    def __init__(self, pricer: Pricer, g: PerGpu) -> None:
        group = 1.0 if g.mla else g.heads / max(g.kv_heads, 1)
        self.p, self.g = for_group(pricer, group), g

    def prefill(self, kind: str, q: np.ndarray, ctx: np.ndarray) -> list[OperatorCost]:
        """Operators of one layer for prefill chunks of ``q`` tokens over ``ctx`` cached."""
        g, p = self.g, self.p
        if kind == "linear":
            f, b = gdn_work(q, g, decode=False)
            return [p.attention("linear_attn_prefill", _one(f.sum()), _one(b.sum()),
                                float(q.sum()) / len(q), len(q), prefill=True).op()]
        name = "attn_prefill" if kind == "full" else "attn_prefill_sliding"
        if g.mla or kind == "sliding":
            window = g.window if kind == "sliding" else None
            pairs, keys = window_pairs_and_keys(q, ctx, window)
        if kind == "full" and len(q) == 1 and (one := self._one_chunk(name, q, ctx)):
            return one
        if not g.mla:
            if kind == "full":
                f, b = prefill_attention_work(q.astype(np.float64), ctx.astype(np.float64),
                                              g.heads, g.kv_heads, g.head_dim, g.kv_bytes)
            else:
                f = 4.0 * g.heads * g.head_dim * pairs
                b = keys * 2.0 * g.kv_heads * g.head_dim * g.kv_bytes \
                    + 2.0 * q * g.heads * g.head_dim * ACT_BYTES
            return [p.attention(name, _one(f.sum()), _one(b.sum()), float(q.sum()) / len(q),
                                len(q), prefill=True, head_dim=g.head_dim,
                                kv_heads=g.kv_heads).op()]
        qk = g.qk_nope_dim + g.qk_rope_dim
        kv_b = p.gemm("kv_b_proj", float(keys.sum()), g.heads * (g.qk_nope_dim + g.v_head_dim),
                      g.kv_lora_rank, g.layer_dtype)
        f, b = mla_prefill_work(pairs, keys, q, g.heads, qk, g.v_head_dim)
        # prefill attends over decompressed K/V: one head of qk dims per query head
        return [kv_b, p.attention(name, _one(f.sum()), _one(b.sum()), float(q.sum()) / len(q),
                                  len(q), prefill=True, head_dim=qk, kv_heads=g.heads).op()]

    def decode(self, kind: str, ctx: np.ndarray, k: int) -> list[Kernel]:
        """Kernels of one layer for k decode steps of sequences with ``ctx`` cached tokens
        (step j: ``ctx + j``), one entry per step."""
        g, p, S = self.g, self.p, len(ctx)
        if kind == "linear":
            f, b = gdn_work(np.ones(S), g, decode=True)
            return [_const(p.attention("linear_attn_decode", _one(f.sum()), _one(b.sum()), 1.0,
                                       S, prefill=False).op(), k)]
        name = "attn_decode" if kind == "full" else "attn_decode_sliding"
        if kind == "full" and k == 1 and (one := self._one_step(name, ctx)):
            return one
        if kind == "full":  # Σ ctx + j·S cached keys, plus each new token itself
            cached = float(ctx.sum()) + S * np.arange(k, dtype=np.float64)
        else:
            cached = window_decode_keys(ctx, g.window, k) - S
        if not g.mla:
            f, b = decode_attention_work(cached, S, g.heads, g.kv_heads, g.head_dim, g.kv_bytes)
            return [p.attention(name, f, b, 1.0, S, prefill=False, head_dim=g.head_dim,
                                kv_heads=g.kv_heads)]
        r, rope = g.kv_lora_rank, g.qk_rope_dim
        f, b = mla_decode_work(cached + S, S, g.heads, r, rope, g.kv_bytes)
        absorb = p.gemm("q_absorb", S, g.heads * r, g.qk_nope_dim, "bfloat16")
        v_up = p.gemm("v_up", S, g.heads * g.v_head_dim, r, "bfloat16")
        # absorbed decode: every head reads one shared latent "KV head" of r + rope dims
        return [_const(absorb, k), p.attention(name, f, b, 1.0, S, prefill=False,
                                               head_dim=r + rope, kv_heads=1),
                _const(v_up, k)]

    # ---- one chunk or one step of full GQA attention on Python floats: the general path's
    # operations in the same order (numpy's per-call cost would be most of a step's pricing);
    # None where they do not apply

    def _one_chunk(self, name: str, q: np.ndarray, ctx: np.ndarray) -> list | None:
        """``prefill`` of one chunk of ``q[0]`` tokens over ``ctx[0]`` on a full layer."""
        g = self.g
        if g.mla:
            return None
        f, b = prefill_attention_work(float(q[0]), float(ctx[0]), g.heads, g.kv_heads,
                                      g.head_dim, g.kv_bytes)
        return [self.p.attention_op(name, f, b, float(q.sum()) / len(q), len(q), prefill=True,
                                    head_dim=g.head_dim, kv_heads=g.kv_heads)]

    def _one_step(self, name: str, ctx: np.ndarray) -> list | None:
        """``decode`` of one step of sequences with ``ctx`` cached tokens on a full layer."""
        g, S = self.g, len(ctx)
        if g.mla:
            return None
        f, b = decode_attention_work(float(ctx.sum()) + S * 0.0, S, g.heads, g.kv_heads,
                                     g.head_dim, g.kv_bytes)
        op = self.p.attention_op(name, f, b, 1.0, S, prefill=False, head_dim=g.head_dim,
                                 kv_heads=g.kv_heads)
        return [Kernel(name, np.array([f]), np.array([b]), np.array([op.time_s]),
                       np.array([op.bound == "compute"]))]
