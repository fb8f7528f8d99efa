"""A roofline cost model packed into arrays for the compiled core (``sim.compiled.kernel``).

What a step's price needs beyond the batch, split so that a compiled loop can price every
step with the same arithmetic as ``RooflineCostModel.step_cost``:

- the token-count operators of the layers (``tok[T, :3]``) and the embedding, all-reduce and
  final norm (``head_tok[T]``), each a (compute, memory, comm) row per token count ``T``, and
  whether a decode-only step (``tok[T, DISPATCH_DECODE]``) or a step with prefill chunks
  (``tok[T, DISPATCH_PREFILL]``) of ``T`` tokens launches its kernels one by one, with the
  launch counts and time in the parameters (``RooflineCostModel.launches``);
- the LM head, sampler and logits all-gather, one (compute, memory, comm) row per operator
  and sequence count ``S`` (``head_seq[S, op]``), added one by one as the model adds them;
- the attention kernels' calibrated efficiencies (``sim.cost.eta.Eta``: a scale times tables
  interpolated in log2 of the shape variables) as flat arrays, with the constants of
  ``sim.cost.pricing.attention_point_time``.

The rows are filled lazily: the kernel stops and names a missing ``T`` or ``S``, ``fill_*``
prices it (token counts a block at a time) with the Python cost model, and the kernel
resumes. Only dense-layout replicas
whose every layer is full GQA softmax attention on one pipeline stage can be packed
(``packable``).
"""

from __future__ import annotations

import numpy as np

from sim.cost.base import BOUNDS
from sim.cost.eta import Eta
from sim.cost.layers import head_seq_ops, head_token_ops
from sim.cost.pricing import ACT_BYTES
from sim.cost.roofline import BOUND_INDEX, TOKEN_BLOCK, RooflineCostModel, bound_parts

# the shape variables of ``sim.cost.operators.attention_axes``, in the kernel's order
AXES = ("q", "s", "u", "d", "kv", "c", "i", "g")
# entries of the float parameter vector ``Prices.params``
(LAYERS, HEADS, KV_HEADS, HEAD_DIM, KV_BYTES, ACT, PEAK_FLOPS, PEAK_BW, NUM_SMS, HOST_S,
 HOST_PER_SEQ_S, PRE_LAUNCH, PRE_UNIT, PRE_BLOCK_Q, DEC_LAUNCH, DEC_UNIT, DEC_BLOCK_Q,
 OVERLAP, HOST_PER_NEW_S, HOST_PER_TOKEN_S, LAUNCH_S, KERNELS_PREFILL, KERNELS_MIXED,
 KERNELS_DECODE) = range(24)
DISPATCH_DECODE, DISPATCH_PREFILL = 3, 4  # columns of ``Prices.tok`` after (compute, memory, comm)
MAX_SEQ_OPS = 3  # lm_head, sampler, logits all-gather
assert BOUNDS[:3] == ("compute", "memory", "comm")


def packable(cost_model) -> str:
    """Why ``cost_model`` cannot be packed ("" when it can)."""
    if type(cost_model) is not RooflineCostModel:
        return "the cost model is not the roofline"
    m = cost_model
    if m.pp != 1:
        return "pipeline parallelism"
    if m.attention_kinds != ["full"] or m.g.mla or m.g.lin_value_heads:
        return "not every layer is full GQA attention"
    if m.graphs.decode_only and m.graphs.pad and m.graphs.sizes:
        # the loop prices a step's token rows by its token count alone
        return "CUDA graphs of decode-only steps, padded"
    return ""


class Prices:
    """The arrays of one replica's cost model that ``sim.compiled.kernel`` prices steps with."""

    def __init__(self, cost_model: RooflineCostModel, max_tokens: int, max_seqs: int) -> None:
        m = self.model = cost_model
        g, hw = m.g, m.hw
        self.tok = np.full((max_tokens + 1, 5), np.nan)
        self.head_tok = np.full((max_tokens + 1, 3), np.nan)
        self.head_seq = np.full((max_seqs + 1, MAX_SEQ_OPS, 3), np.nan)
        pre, dec = m.att.p.eff.attention_prefill, m.att.p.eff.attention_decode
        layers = dict(m._stage_attention[0])["full"]
        self.params = np.array([
            layers, g.heads, g.kv_heads, g.head_dim, g.kv_bytes, ACT_BYTES, hw.bf16_flops,
            hw.hbm_bandwidth, hw.num_sms, m.host.overhead_s, m.host.per_seq_s,
            pre.launch_s, pre.unit_s, pre.block_q, dec.launch_s, dec.unit_s, dec.block_q,
            float(m.overlap), m.host.per_new_request_s, m.host.per_token_s, m.eager_launch_s,
            *((m.kernel_launches(True, False), m.kernel_launches(True, True),
               m.kernel_launches(False, True)) if m.eager_launch_s else (0, 0, 0)),
        ], dtype=np.float64)
        self.etas = pack_etas([pre.compute, pre.memory, dec.compute, dec.memory])

    def fill_tokens(self, T: int) -> None:
        """Price the token-count rows of every count in ``T``'s block of ``TOKEN_BLOCK`` (the
        cost model prices the layers' operators a block at a time; the head's are priced
        here over the block's counts at once), so the kernel stops once per block."""
        assert T >= 1, "a step computes at least one token"
        m = self.model
        lo = T - T % TOKEN_BLOCK
        counts = np.arange(max(lo, 1), min(lo + TOKEN_BLOCK, len(self.tok)), dtype=np.int64)
        for t in counts.tolist():
            self.tok[t, :3] = m._stage_token_parts(t, t)[0]
            self.tok[t, DISPATCH_DECODE] = m.graphs.dispatches(t, True)
            self.tok[t, DISPATCH_PREFILL] = m.graphs.dispatches(t, False)
        self.head_tok[counts] = bound_parts(head_token_ops(m.p, m.g, m.hw, counts)).T

    def fill_seqs(self, S: int) -> None:
        """Price the per-sequence head operators of a step of ``S`` sequences."""
        m = self.model
        self.head_seq[S] = 0.0
        for j, op in enumerate(head_seq_ops(m.p, m.g, m.hw, S)):
            self.head_seq[S, j, BOUND_INDEX[op.bound]] = op.time_s


def pack_etas(etas: list[Eta]) -> tuple:
    """``etas`` as flat arrays: per eta its scale and range of terms; per term its axes
    (index into ``AXES``; −1: none), the offset and length of each axis's log2 knots in
    ``knots``, and the offset and row length of its ln-factor table in ``factors``."""
    scale, first, last = [], [], []
    axes, koff, klen, foff, fcols = [], [], [], [], []
    knots, factors = [], []
    for eta in etas:
        scale.append(eta.scale)
        first.append(len(axes))
        for t in eta.terms:
            ax, off, ln = [-1, -1], [0, 0], [0, 0]
            for j, (a, kn) in enumerate(zip(t.axes, t.log2_knots, strict=True)):
                ax[j], off[j], ln[j] = AXES.index(a), len(knots), len(kn)
                knots.extend(float(v) for v in kn)
            f = np.asarray(t.log_factor, dtype=np.float64)
            axes.append(ax)
            koff.append(off)
            klen.append(ln)
            foff.append(len(factors))
            fcols.append(f.shape[1] if f.ndim == 2 else 1)
            factors.extend(f.ravel().tolist())
        last.append(len(axes))
    ints = lambda x, shape=(-1,): np.array(x, dtype=np.int64).reshape(shape)  # noqa: E731
    return (np.array(scale, dtype=np.float64), ints(first), ints(last), ints(axes, (-1, 2)),
            ints(koff, (-1, 2)), ints(klen, (-1, 2)), ints(foff), ints(fcols),
            np.array(knots + [0.0], dtype=np.float64), np.array(factors + [0.0]))
