"""GEMMs on the roofline: their work, the shape variables their efficiency varies with, and
their time (dense GEMMs and MoE experts' grouped GEMMs).

Besides ``m``, ``n`` and ``k``, a GEMM's efficiency tables see the quantization effects of the
tiled kernels that run it (``gemm_axes``):

- ``a``: 2 when ``m`` is not a multiple of ``align_m`` (16; FP8 kernels pad the rows or take
  a slower kernel), else 1;
- ``f``: how full the last ``GEMM_TILE``-row tile of ``m`` is (m = 129 fills 129/256 of two
  tiles: the kernel pays for 256 rows);
- ``nk``: the weight's elements, which set whether it stays in L2 and how a GEMV splits.

A GEMM whose ``k`` is not a whole number of ``block_k`` blocks pays ``partial_block_s`` on
top (block-scaled FP8 kernels need whole 128-wide scale blocks; vLLM runs such shapes on a
slower fallback kernel).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sim.cost.eta import _SCALARS, Eta, _sig, evaluate

GEMM_TILE = 128  # rows and columns of the output tiles the quantization axes count


def _eta(v) -> Eta:
    return v if isinstance(v, Eta) else Eta.from_dict(v)


@dataclass(frozen=True)
class GemmEfficiency:
    """η of a GEMM C[m,n] = A[m,k]·B[k,n] (also of MoE grouped GEMMs).

    ``compute`` and ``memory`` are ``Eta`` over the shape variables of ``gemm_axes``. An ``m``
    above ``align_m`` that is not a multiple of it also multiplies η by ``unaligned_compute`` /
    ``unaligned_memory`` (a constant; fits now use the ``a`` axis instead and leave them 1).
    ``tile_m``/``tile_n`` > 0 switch on tile-and-wave quantization of the compute work over the
    GPU's SMs (``wave_quantization``); 0 leaves it to the fitted tables. A ``k`` that is not a
    multiple of ``block_k`` adds ``partial_block_s`` (module doc).
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
    block_k: int = 128
    partial_block_s: float = 0.0

    @classmethod
    def from_dict(cls, d: dict) -> GemmEfficiency:
        """From a calibrated file's block (``compute``, ``memory``, ``launch_s``, …)."""
        return cls(_eta(d["compute"]), _eta(d["memory"]), float(d["launch_s"]),
                   int(d.get("align_m", 16)), float(d.get("unaligned_compute", 1.0)),
                   float(d.get("unaligned_memory", 1.0)), int(d.get("tile_m", 0)),
                   int(d.get("tile_n", 0)), float(d.get("per_expert_s", 0.0)),
                   int(d.get("block_k", 128)), float(d.get("partial_block_s", 0.0)))

    def to_dict(self) -> dict:
        """The block ``from_dict`` reads."""
        return {"compute": self.compute.to_dict(), "memory": self.memory.to_dict(),
                "launch_s": _sig(self.launch_s), "align_m": self.align_m,
                "unaligned_compute": _sig(self.unaligned_compute),
                "unaligned_memory": _sig(self.unaligned_memory),
                "tile_m": self.tile_m, "tile_n": self.tile_n,
                "per_expert_s": _sig(self.per_expert_s), "block_k": self.block_k,
                "partial_block_s": _sig(self.partial_block_s)}

    def _unaligned(self, m, factor: float):
        if factor == 1.0:
            return 1.0
        if isinstance(m, _SCALARS):  # one GEMM: the same test without numpy's call cost
            m = float(m)
            return factor if m > self.align_m and m % self.align_m != 0 else 1.0
        m = np.asarray(m, dtype=np.float64)
        return np.where((m > self.align_m) & (np.mod(m, self.align_m) != 0), factor, 1.0)

    def _partial_block(self, k):
        """``partial_block_s`` where ``k`` is not a multiple of ``block_k``, else 0."""
        if not self.partial_block_s:
            return 0.0
        if isinstance(k, _SCALARS):
            return self.partial_block_s if float(k) % self.block_k != 0 else 0.0
        k = np.asarray(k, dtype=np.float64)
        return np.where(np.mod(k, self.block_k) != 0, self.partial_block_s, 0.0)

    def compute_eta(self, m, n, k):
        """Fraction of peak FLOP/s reached by an m×k·k×n GEMM."""
        x = gemm_axes(m, n, k, self.align_m)
        return self.compute(**x) * self._unaligned(m, self.unaligned_compute)

    def memory_eta(self, m, n, k):
        """Fraction of peak HBM bandwidth reached by an m×k·k×n GEMM."""
        x = gemm_axes(m, n, k, self.align_m)
        return self.memory(**x) * self._unaligned(m, self.unaligned_memory)


def gemm_work(m, n, k, in_bytes: float, out_bytes: float = 2.0):
    """FLOPs and bytes of C[m,n] = A[m,k]·B[k,n]: read A and B once, write C once."""
    flops = 2.0 * m * n * k
    nbytes = in_bytes * (m * k + k * n) + out_bytes * m * n
    return flops, nbytes


def gemm_axes(m, n, k, align_m: int = 16) -> dict:
    """The shape variables GEMM efficiencies are tabulated over (module doc): ``m``, ``n``,
    ``k``, ``a`` (m unaligned), ``f`` (last m-tile fill) and ``nk`` (weight elements).
    Scalars in, Python floats out (one GEMM of a step); arrays elementwise."""
    if isinstance(m, _SCALARS) and isinstance(n, _SCALARS) and isinstance(k, _SCALARS):
        m, n, k = float(m), float(n), float(k)
        return {"m": m, "n": n, "k": k, "a": 2.0 if m > align_m and m % align_m else 1.0,
                "f": m / (math.ceil(m / GEMM_TILE) * GEMM_TILE), "nk": n * k}
    m, n, k = (np.asarray(v, dtype=np.float64) for v in (m, n, k))
    return {"m": m, "n": n, "k": k,
            "a": np.where((m > align_m) & (np.mod(m, align_m) != 0), 2.0, 1.0),
            "f": m / (np.ceil(m / GEMM_TILE) * GEMM_TILE), "nk": n * k}


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


def roofline(flops, nbytes, peak_flops, peak_bw, eta_c, eta_m, launch_s):
    """Time on the roofline, and whether the compute roof binds (else the memory roof)."""
    t_compute = flops / (peak_flops * eta_c)
    t_memory = nbytes / (peak_bw * eta_m)
    return np.maximum(t_compute, t_memory) + launch_s, t_compute >= t_memory


def gemm_time(e: GemmEfficiency, m, n, k, peak_flops: float, peak_bw: float, in_bytes: float,
              out_bytes: float = 2.0, num_sms: int = 132):
    """(time, compute-bound?) of C[m,n] = A[m,k]·B[k,n] with efficiency ``e``.

    ``num_sms`` is the GPU's SM count, for tile-and-wave quantization when ``e`` has tiles.
    """
    f, b = gemm_work(m, n, k, in_bytes, out_bytes)
    if e.tile_m and e.tile_n:
        f = f * wave_quantization(m, n, e.tile_m, e.tile_n, num_sms)
    eta_c, eta_m = evaluate((e.compute, e.memory), gemm_axes(m, n, k, e.align_m))
    t, cb = roofline(f, b, peak_flops, peak_bw, eta_c * e._unaligned(m, e.unaligned_compute),
                     eta_m * e._unaligned(m, e.unaligned_memory), e.launch_s)
    return (t + e._partial_block(k) if e.partial_block_s else t), cb


def expected_distinct_experts(num_tokens, num_experts: int, topk: int):
    """Expected number of distinct experts that ``num_tokens`` tokens touch when each picks
    ``topk`` of ``num_experts`` uniformly without replacement: E·(1 − (1 − k/E)^T).

    Not "all" (few tokens touch few experts) and not "k" (many tokens spread over all).
    """
    t = np.asarray(num_tokens, dtype=np.float64)
    return num_experts * (1.0 - (1.0 - topk / num_experts) ** t)


def moe_axes(num_tokens, inter: int, hidden: int, topk: int, distinct_experts) -> dict:
    """GEMM shape variables (``gemm_axes``) of the experts' grouped GEMMs: ``m`` token-expert
    pairs per touched expert, ``n`` the gate/up width 2·inter, ``k`` hidden."""
    pairs = np.asarray(num_tokens, dtype=np.float64) * topk
    m = np.maximum(pairs / np.maximum(distinct_experts, 1.0), 1.0)
    return gemm_axes(m, 2.0 * np.asarray(inter, dtype=np.float64),
                     np.asarray(hidden, dtype=np.float64))


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
