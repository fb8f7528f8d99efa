"""One GPU's roofline prices of single operator runs: GEMMs, attention kernels, MoE experts,
elementwise kernels and collectives, each through the calibrated time functions of
``sim.cost.operators``.

Every method returns one run (``count = 1``) as an ``OperatorCost``; callers scale it by the
number of layers. GEMMs, experts, elementwise kernels and collectives also take an array of
token counts (``m``, ``num_tokens``, ``nbytes``) and price the operator at each of them at once
(fields arrays; ``bound`` an array of roofs for the roofline kernels). Attention-like kernels
can also be priced over arrays (one entry per decode step of a window) as a ``Kernel``.

Block-scaled FP8 weights (``fp8_block``) multiply at the FP8 peak with their own calibrated
efficiency (the 128×128 block-scale kernels are slower than per-tensor FP8), or with the
per-tensor ``fp8`` one when a calibration has none for them; operators report ``fp8`` as the
math dtype whose peak they run against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sim.config import HardwareConfig
from sim.config.common import WEIGHT_DTYPE_BYTES, is_fp8
from sim.cost.attention_kernels import CALIBRATED, kernel_class
from sim.cost.base import OperatorCost
from sim.cost.eta import evaluate
from sim.cost.memo import Memo
from sim.cost.operators import (
    AttentionEfficiency,
    Efficiency,
    attention_time,
    comm_time,
    encoder_attention_work,
    gemm_time,
    gemm_work,
    moe_time,
    scalar_attention_axes,
)
from sim.errors import ConfigError

ACT_BYTES = 2.0  # activations stay bf16/fp16, also with FP8 weights


@dataclass(frozen=True)
class Kernel:
    """One attention-like kernel per layer, priced for each step of a decode window."""

    name: str
    flops: np.ndarray
    bytes: np.ndarray
    time: np.ndarray
    compute_bound: np.ndarray
    dtype: str = "bfloat16"

    def op(self, step: int = 0) -> OperatorCost:
        """Step ``step`` of the window as a single-run operator."""
        return OperatorCost(self.name, 1, float(self.flops[step]), float(self.bytes[step]),
                            float(self.time[step]),
                            "compute" if self.compute_bound[step] else "memory", self.dtype)


ATTENTION_ARRAY_AXES = frozenset(("kv", "c", "i"))  # attention_axes' variables of flops, bytes


def attention_point_time(e: AttentionEfficiency, flops: float, nbytes: float, q_per_seq,
                         num_seqs: int, peak_flops: float, peak_bw: float, head_dim: float,
                         kv_heads: float, num_sms: int) -> tuple[float, bool]:
    """``attention_time`` of one-element ``flops`` and ``nbytes`` arrays, bit for bit, on
    Python floats (a step prices its attention once; numpy's per-call cost would dominate):
    the same operations in the same order, the efficiencies through ``evaluate``'s
    one-element-array semantics."""
    x = scalar_attention_axes(flops, nbytes, q_per_seq, num_seqs, head_dim, kv_heads)
    eta_c, eta_m = evaluate((e.compute, e.memory), x, ATTENTION_ARRAY_AXES)
    t_compute = flops / (peak_flops * eta_c)
    t_memory = nbytes / (peak_bw * eta_m)
    t = max(t_compute, t_memory) + e.launch_s
    if e.unit_s:
        units = x["u"] * math.ceil(x["q"] / e.block_q)
        t = t + e.unit_s * units / num_sms
    return t, t_compute >= t_memory


def moe_work(num_tokens, hidden: int, inter: int, topk: int, distinct, w_bytes: float):
    """FLOPs and bytes of the routed experts as ``moe_time`` prices them: 2·3·hidden·inter
    FLOPs per token-expert pair; the touched experts' gate/up and down weights read once; each
    pair's input, gate/up output, activation and output moved in bf16."""
    pairs = np.asarray(num_tokens, dtype=np.float64) * topk
    flops = 2.0 * pairs * hidden * 3 * inter
    nbytes = distinct * 3.0 * hidden * inter * w_bytes + pairs * (4 * hidden + 6 * inter)
    return flops, nbytes


def math_dtype(dtype: str) -> str:
    """The dtype whose tensor-core peak weights of ``dtype`` multiply at (``fp8`` for both FP8
    scalings)."""
    return "fp8" if is_fp8(dtype) else dtype


def efficiency_key(dtype: str, table: dict) -> str:
    """The entry of a calibrated ``table`` (GEMM or MoE efficiencies by dtype) that weights of
    ``dtype`` use: their own, or for block-scaled FP8 the per-tensor FP8 one when the
    calibration has none of its own."""
    if dtype == "fp8_block" and dtype not in table:
        return "fp8"
    return dtype


class Pricer:
    """Prices single operator runs on one GPU of ``hw`` with efficiencies ``eff``."""

    def __init__(self, hw: HardwareConfig, eff: Efficiency) -> None:
        self.hw, self.eff = hw, eff
        # a step prices the same GEMMs, experts and collectives over and over (their shapes
        # depend on token and sequence counts only); each price is a pure function of its key
        self._memo = Memo(16384)

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s of the tensor cores for ``dtype``."""
        return self.hw.fp8_flops if is_fp8(dtype) else self.hw.bf16_flops

    def check_dtype(self, field: str, value: str, dtype: str, table: dict) -> None:
        """Refuse a math dtype the GPU lacks or the calibration has no efficiency for."""
        if is_fp8(dtype) and not self.hw.fp8_flops:
            raise ConfigError(field, value, f"{self.hw.name} has no FP8 tensor cores")
        if efficiency_key(dtype, table) not in table:
            tried = f"{dtype} (nor fp8)" if dtype == "fp8_block" else dtype
            raise ConfigError(field, value, f"no calibrated efficiency for {tried}; "
                              f"have {sorted(table)}")

    def gemm(self, name: str, m, n: int, k: int, dtype: str) -> OperatorCost:
        """C[m,n] = A[m,k]·B[k,n] with weights (B) in ``dtype``."""
        if isinstance(m, np.ndarray):
            return self._gemm(name, m, n, k, dtype)
        return self._memo.get_or(("gemm", name, m, n, k, dtype),
                                 lambda: self._gemm(name, m, n, k, dtype))

    def _gemm(self, name: str, m, n: int, k: int, dtype: str) -> OperatorCost:
        w_bytes = WEIGHT_DTYPE_BYTES[dtype]
        f, b = gemm_work(m, n, k, w_bytes)
        t, cb = gemm_time(self.eff.gemm[efficiency_key(dtype, self.eff.gemm)], m, n, k,
                          self.peak(dtype), self.hw.hbm_bandwidth, w_bytes,
                          num_sms=self.hw.num_sms)
        return _roofline_op(name, f, b, t, cb, math_dtype(dtype))

    def elementwise(self, name: str, nbytes: float, kernels: int) -> OperatorCost:
        """Memory-bound kernels (norms, rotary, activations, cache writes) moving ``nbytes``."""
        e = self.eff
        t = nbytes / (self.hw.hbm_bandwidth * e.elementwise_eta_memory)
        t += kernels * e.elementwise_launch_s
        return _bound_op(name, nbytes, t, "memory")

    def comm(self, name: str, kind: str, nbytes: float, gpus: int, link_bw: float,
             extra_latency_s: float = 0.0) -> OperatorCost:
        """One collective of ``kind`` moving a message of ``nbytes`` among ``gpus`` GPUs."""
        if isinstance(nbytes, np.ndarray):
            return self._comm(name, kind, nbytes, gpus, link_bw, extra_latency_s)
        return self._memo.get_or(
            ("comm", name, kind, nbytes, gpus, link_bw, extra_latency_s),
            lambda: self._comm(name, kind, nbytes, gpus, link_bw, extra_latency_s))

    def _comm(self, name: str, kind: str, nbytes: float, gpus: int, link_bw: float,
              extra_latency_s: float) -> OperatorCost:
        t = comm_time(self.eff.comm[kind], kind, nbytes, gpus, link_bw) + extra_latency_s
        return _bound_op(name, nbytes, t, "comm")

    def attention(self, name: str, flops: np.ndarray, nbytes: np.ndarray, q_per_seq,
                  num_seqs: int, prefill: bool, head_dim: float = 128.0,
                  kv_heads: float = 8.0) -> Kernel:
        """An attention-like kernel at the bf16 peak; ``flops`` and ``nbytes`` are arrays of
        one shape (one entry per step); ``head_dim`` and ``kv_heads`` (per GPU) shape its
        calibrated efficiency."""
        e = self.eff.attention_prefill if prefill else self.eff.attention_decode
        if len(flops) == 1:  # one step
            op = self.attention_op(name, float(flops[0]), float(nbytes[0]), q_per_seq,
                                   num_seqs, prefill, head_dim, kv_heads)
            return Kernel(name, flops, nbytes, np.array([op.time_s]),
                          np.array([op.bound == "compute"]))
        t, cb = attention_time(e, flops, nbytes, q_per_seq, num_seqs, self.hw.bf16_flops,
                               self.hw.hbm_bandwidth, head_dim=head_dim, kv_heads=kv_heads,
                               num_sms=self.hw.num_sms)
        return Kernel(name, flops, nbytes, t, cb)

    def attention_op(self, name: str, flops: float, nbytes: float, q_per_seq, num_seqs: int,
                     prefill: bool, head_dim: float = 128.0,
                     kv_heads: float = 8.0) -> OperatorCost:
        """One step's attention-like kernel from float work: ``attention(…).op()`` of
        one-element arrays, without building them."""
        e = self.eff.attention_prefill if prefill else self.eff.attention_decode
        t, cb = attention_point_time(e, flops, nbytes, q_per_seq, num_seqs, self.hw.bf16_flops,
                                     self.hw.hbm_bandwidth, head_dim, kv_heads, self.hw.num_sms)
        return OperatorCost(name, 1, flops, nbytes, t, "compute" if cb else "memory", "bfloat16")

    def encoder_attention(self, name: str, batch: int, seq_q: int, seq_kv: int, heads: int,
                          head_dim: int, impl: str = CALIBRATED,
                          sm_share: float | None = None) -> OperatorCost:
        """One run of non-causal attention: ``batch`` sequences of ``seq_q`` queries each over
        ``seq_kv`` keys (``seq_q != seq_kv``: one ring-attention pass over a K/V block),
        ``heads`` heads of ``head_dim`` on this GPU, bf16, at the bf16 peak. Priced with
        ``eff.attention_encoder`` (or ``eff.attention_prefill`` on the same work when the
        calibration has none), or, for a named kernel ``impl`` (``fa2``, ``fa3``, ...), with
        that kernel class's efficiency on this GPU (``sim.cost.attention_kernels``; ``sm_share``
        overrides the class's fitted SM share)."""
        args = (name, batch, seq_q, seq_kv, heads, head_dim, impl, sm_share)
        return self._memo.get_or(("encoder_attention",) + args,
                                 lambda: self._encoder_attention(*args))

    def _encoder_attention(self, name: str, batch: int, seq_q: int, seq_kv: int, heads: int,
                           head_dim: int, impl: str, sm_share: float | None) -> OperatorCost:
        f, b = encoder_attention_work(float(batch), float(seq_q), float(seq_kv), float(heads),
                                      float(head_dim), ACT_BYTES)
        k = kernel_class(self.hw.calibration, impl)
        if k is not None:
            eta = k.eta_on(seq_kv, head_dim, self.hw.bf16_flops,
                           getattr(self.hw, "fp32_flops", 0.0), sm_share)
            tc = f / (self.hw.bf16_flops * float(eta))
            tm = b / self.hw.hbm_bandwidth
            return OperatorCost(name, 1, f, b, max(tc, tm), "compute" if tc >= tm else "memory",
                                "bfloat16")
        e = self.eff.attention_encoder or self.eff.attention_prefill
        # every head has its own K and V: the kernel's parallel units are batch × heads
        t, cb = attention_point_time(e, f, b, seq_q, batch, self.hw.bf16_flops,
                                     self.hw.hbm_bandwidth, head_dim, heads, self.hw.num_sms)
        return OperatorCost(name, 1, f, b, t, "compute" if cb else "memory", "bfloat16")

    def experts(self, name: str, num_tokens, hidden: int, inter: int, num_experts: int,
                topk: int, distinct, dtype: str, w_bytes: float,
                eff_key: str | None = None) -> OperatorCost:
        """Routed experts' grouped GEMMs: ``num_tokens·topk`` pairs on ``num_experts`` local
        experts of which ``distinct`` are touched; math at the peak of ``dtype``, weights of
        ``w_bytes``, efficiency ``eff.moe[eff_key]`` (default: that of ``dtype``)."""
        args = (name, num_tokens, hidden, inter, num_experts, topk, distinct, dtype, w_bytes,
                eff_key)
        if isinstance(num_tokens, np.ndarray):
            return self._experts(*args)
        return self._memo.get_or(("experts",) + args, lambda: self._experts(*args))

    def _experts(self, name: str, num_tokens, hidden: int, inter: int, num_experts: int,
                 topk: int, distinct, dtype: str, w_bytes: float,
                 eff_key: str | None) -> OperatorCost:
        e = self.eff.moe[efficiency_key(eff_key or dtype, self.eff.moe)]
        t, cb = moe_time(e, num_tokens, hidden, inter, num_experts,
                         topk, distinct, self.peak(dtype), self.hw.hbm_bandwidth, w_bytes,
                         self.hw.num_sms)
        f, b = moe_work(num_tokens, hidden, inter, topk, distinct, w_bytes)
        return _roofline_op(name, f, b, t, cb, math_dtype(dtype))


def _roofline_op(name: str, flops, nbytes, time_s, compute_bound, dtype: str) -> OperatorCost:
    """One run of a kernel on the roofline: floats and the roof that binds it, or, priced at
    many token counts at once (arrays in), arrays and each count's roof."""
    if np.ndim(time_s):
        return OperatorCost(name, 1, flops, nbytes, time_s,
                            np.where(compute_bound, "compute", "memory"), dtype)
    return OperatorCost(name, 1, float(flops), float(nbytes), float(time_s),
                        "compute" if compute_bound else "memory", dtype)


def _bound_op(name: str, nbytes, time_s, bound: str) -> OperatorCost:
    """One run of a memory-only kernel or a collective (no FLOPs), floats or arrays."""
    if np.ndim(time_s):
        return OperatorCost(name, 1, 0.0, nbytes, time_s, bound)
    return OperatorCost(name, 1, 0.0, float(nbytes), float(time_s), bound)
