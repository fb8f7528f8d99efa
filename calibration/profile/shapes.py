"""The shape plan of the profiler: which operator shapes to measure, per op, per plan.

Two plans: ``tiny`` (a few small shapes, seconds on a CPU, for the smoke test that checks the
output format) and ``full`` (model-derived shapes of the dense and MoE models the simulator
ships, sized to finish in about 8 minutes on one H200; see :func:`estimate_seconds`).
Every shape knows the key columns of its row in the aiconfigurator table layout and its
roofline work (FLOPs, bytes), used for the time estimate and for sizing L2-cold operand copies.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

# op name -> (op_family folder, table name, op_name column), as in the aiconfigurator layout.
TABLES: dict[str, tuple[str, str, str]] = {
    "gemm": ("gemm", "gemm_perf", "gemm"),
    "attention_prefill": ("attention", "context_attention_perf", "context_attention"),
    "attention_decode": ("attention", "generation_attention_perf", "generation_attention"),
    "moe": ("moe", "moe_perf", "moe"),
}
KERNEL_OPS = tuple(TABLES)
ALL_OPS = (*KERNEL_OPS, "comm")
OP_ALIASES = {"attention": ("attention_prefill", "attention_decode")}
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "alltoall")
DTYPE_BYTES = {"bfloat16": 2.0, "fp8": 1.0}


@dataclass(frozen=True)
class GemmShape:
    """C[m, n] = A[m, k] · W[n, k]ᵀ (a linear layer over m tokens) in ``dtype``."""

    m: int
    n: int
    k: int
    dtype: str = "bfloat16"
    op = "gemm"

    def columns(self) -> dict:
        """Key columns of this shape's row in gemm_perf."""
        return {"gemm_dtype": self.dtype, "m": self.m, "n": self.n, "k": self.k}

    def work(self) -> tuple[float, float]:
        """(FLOPs, minimum bytes moved): inputs read once, bf16 output written once."""
        b = DTYPE_BYTES[self.dtype]
        return 2.0 * self.m * self.n * self.k, (self.m * self.k + self.n * self.k) * b \
            + 2.0 * self.m * self.n


@dataclass(frozen=True)
class AttentionShape:
    """Causal prefill of ``batch`` sequences of ``isl`` tokens (``ctx`` = 0), or decode of one
    token per sequence over ``ctx`` cached tokens (``isl`` = 1), for one layer, bf16."""

    batch: int
    isl: int
    ctx: int
    heads: int
    kv_heads: int
    head_dim: int

    @property
    def op(self) -> str:
        """attention_prefill or attention_decode."""
        return "attention_prefill" if self.ctx == 0 else "attention_decode"

    def columns(self) -> dict:
        """Key columns of the row in context/generation_attention_perf (``step`` = context)."""
        return {
            "batch_size": self.batch, "isl": self.isl, "num_heads": self.heads,
            "num_key_value_heads": self.kv_heads, "head_dim": self.head_dim, "beam_width": 1,
            "attn_dtype": "bfloat16", "kv_cache_dtype": "bfloat16", "step": self.ctx,
            "window_size": 0,
        }

    def work(self) -> tuple[float, float]:
        """(FLOPs, bytes): QKᵀ and PV (half of it under the causal mask in prefill); Q, K, V
        read and the output written once."""
        b, h, kvh, d = self.batch, self.heads, self.kv_heads, self.head_dim
        if self.ctx == 0:
            s = self.isl
            return 2.0 * b * h * s * s * d, 2.0 * b * s * (2 * h + 2 * kvh) * d
        return 4.0 * b * h * self.ctx * d, 2.0 * b * (2 * kvh * self.ctx + 2 * h) * d


@dataclass(frozen=True)
class MoeShape:
    """Routed experts of one MoE layer on one GPU: ``num_tokens`` tokens each sent to ``topk``
    of ``num_experts`` experts (gate/up [hidden, 2·inter], down [inter, hidden]), bf16."""

    num_tokens: int
    hidden: int
    inter: int
    topk: int
    num_experts: int
    op = "moe"

    def columns(self) -> dict:
        """Key columns of the row in moe_perf (no TP/EP split: the whole layer on one GPU)."""
        return {
            "moe_dtype": "bfloat16", "num_tokens": self.num_tokens, "hidden_size": self.hidden,
            "inter_size": self.inter, "topk": self.topk, "num_experts": self.num_experts,
            "moe_tp_size": 1, "moe_ep_size": 1, "distribution": "balanced",
        }

    def touched_experts(self) -> int:
        """Experts that receive a token under balanced routing (round-robin over pairs)."""
        return min(self.num_experts, self.num_tokens * self.topk)

    def work(self) -> tuple[float, float]:
        """(FLOPs, bytes): the touched experts' weights read once plus the activations."""
        pairs = self.num_tokens * self.topk
        flops = 2.0 * pairs * self.hidden * 3 * self.inter
        weights = self.touched_experts() * 3.0 * self.hidden * self.inter * 2
        return flops, weights + pairs * (4.0 * self.hidden + 6.0 * self.inter)


Shape = GemmShape | AttentionShape | MoeShape


@dataclass
class Plan:
    """What one profiler run measures: kernel shapes per op, collective sizes, repeats."""

    name: str
    shapes: dict[str, list[Shape]]
    comm_sizes: list[int] = field(default_factory=list)  # elements per rank (bf16)
    comm_ops: tuple[str, ...] = COLLECTIVES
    warmup: int = 3
    repeats: int = 10

    def count(self) -> int:
        """Number of kernel shapes in the plan (collectives not counted)."""
        return sum(len(v) for v in self.shapes.values())


# (hidden, q heads, kv heads, head_dim, ffn) of the dense models under conf/model/.
DENSE_MODELS = {
    "llama3_8b": (4096, 32, 8, 128, 14336),
    "qwen3_32b": (5120, 64, 8, 128, 25600),
    "llama3_70b": (8192, 64, 8, 128, 28672),
    "llama3_405b": (16384, 128, 8, 128, 53248),
}
# (hidden, moe inter, topk, experts) of the MoE models under conf/model/.
MOE_MODELS = {
    "mixtral_8x7b": (4096, 14336, 2, 8),
    "qwen3_30b_a3b": (2048, 768, 8, 128),
    "qwen3_235b_a22b": (4096, 1536, 8, 128),
    "gpt_oss_120b": (2880, 2880, 4, 128),
    "deepseek_v3": (7168, 2048, 8, 256),
}
FULL_GEMM_M = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 2048,
               4096, 8192, 16384)
FULL_GEMM_MAX_FLOPS = 1.6e13  # larger products add seconds and no new regime
FULL_HEAD_LAYOUTS = ((8, 1, 128), (16, 2, 128), (32, 8, 128), (64, 8, 128), (128, 8, 128),
                     (32, 32, 128), (16, 16, 64), (64, 4, 64), (32, 4, 128), (40, 8, 128),
                     (8, 8, 128), (24, 8, 64))
FULL_PREFILL_ISL = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)
FULL_PREFILL_BATCH = (1, 2, 4, 8)
FULL_PREFILL_MAX_TOKENS = 32768
FULL_DECODE_CTX = (128, 512, 1024, 2048, 4096, 8192, 16384, 32768)
FULL_DECODE_BATCH = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
FULL_DECODE_MAX_TOKENS = 1 << 20
FULL_MOE_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
FULL_COMM_SIZES = tuple(1 << p for p in range(7, 28))


def model_gemm_shapes(tps: tuple[int, ...] = (1, 2, 4, 8)) -> list[tuple[int, int]]:
    """Distinct (n, k) of the QKV, output, gate/up and down projections of the dense models
    under tensor parallelism ``tps`` (KV heads replicated when fewer than the TP degree)."""
    nk = set()
    for (h, q, kv, d, ffn), tp in itertools.product(DENSE_MODELS.values(), tps):
        kv_local = max(1, kv // tp)
        nk |= {((q // tp + 2 * kv_local) * d, h), (h, q // tp * d),
               (2 * ffn // tp, h), (h, ffn // tp)}
    return sorted(nk)


def _full_gemm() -> list[Shape]:
    model_nk = model_gemm_shapes()
    grid_nk = list(itertools.product((1024, 2048, 4096, 8192), repeat=2))
    shapes: list[Shape] = []
    for m in FULL_GEMM_M:
        for n, k in sorted(set(model_nk) | set(grid_nk)):
            if 2.0 * m * n * k <= FULL_GEMM_MAX_FLOPS:
                shapes.append(GemmShape(m, n, k, "bfloat16"))
        for n, k in model_nk:  # fp8 weights: the model projections only
            if 2.0 * m * n * k <= 2 * FULL_GEMM_MAX_FLOPS:
                shapes.append(GemmShape(m, n, k, "fp8"))
    return shapes


def _full_attention() -> tuple[list[Shape], list[Shape]]:
    prefill = [AttentionShape(b, s, 0, h, kvh, d)
               for (h, kvh, d), s, b in itertools.product(FULL_HEAD_LAYOUTS, FULL_PREFILL_ISL,
                                                          FULL_PREFILL_BATCH)
               if b * s <= FULL_PREFILL_MAX_TOKENS]
    decode = [AttentionShape(b, 1, c, h, kvh, d)
              for (h, kvh, d), c, b in itertools.product(FULL_HEAD_LAYOUTS, FULL_DECODE_CTX,
                                                         FULL_DECODE_BATCH)
              if b * c <= FULL_DECODE_MAX_TOKENS]
    return prefill, decode


def tiny_plan() -> Plan:
    """A few small shapes of every op: seconds on a CPU; checks the format, not the GPU."""
    gemm = [GemmShape(m, n, k, dt) for dt in ("bfloat16", "fp8") for m in (1, 16)
            for n, k in ((64, 64), (128, 256))]
    layouts = ((4, 2, 32), (4, 4, 32))
    prefill = [AttentionShape(b, s, 0, h, kvh, d) for h, kvh, d in layouts
               for b in (1, 2) for s in (16, 64)]
    decode = [AttentionShape(b, 1, c, h, kvh, d) for h, kvh, d in layouts
              for b in (1, 4) for c in (16, 128)]
    moe = [MoeShape(t, 64, 32, 2, 8) for t in (1, 8, 32)]
    shapes = {"gemm": gemm, "attention_prefill": prefill, "attention_decode": decode,
              "moe": moe}
    return Plan("tiny", shapes, comm_sizes=[128, 4096], warmup=1, repeats=3)


def full_plan() -> Plan:
    """Model-derived shapes of every op, about 8 minutes on one H200 (see estimate_seconds)."""
    prefill, decode = _full_attention()
    moe = [MoeShape(t, h, i, k, e) for h, i, k, e in MOE_MODELS.values() for t in FULL_MOE_TOKENS]
    shapes = {"gemm": _full_gemm(), "attention_prefill": prefill, "attention_decode": decode,
              "moe": moe}
    return Plan("full", shapes, comm_sizes=list(FULL_COMM_SIZES), warmup=3, repeats=10)


PLANS = {"tiny": tiny_plan, "full": full_plan}


def make_plan(name: str, ops: tuple[str, ...], seed: int = 0) -> Plan:
    """The named plan restricted to ``ops``, shapes of each op in a seeded random order (so a
    run cut short by its time budget keeps an even sample of every op's shapes, and clock drift
    does not line up with shape size)."""
    plan = PLANS[name]()
    rng = np.random.default_rng(seed)
    kept = {}
    for op in KERNEL_OPS:
        if op in ops:
            shapes = plan.shapes[op]
            kept[op] = [shapes[i] for i in rng.permutation(len(shapes))]
    plan.shapes = kept
    if "comm" not in ops:
        plan.comm_sizes = []
    return plan


def calls_per_sample(est_s: float, min_sample_s: float = 5e-4, max_calls: int = 100) -> int:
    """Back-to-back calls timed as one sample, so a sample lasts at least ``min_sample_s``
    (short kernels are otherwise dominated by timer resolution and launch gaps)."""
    if not est_s > 0:
        return max_calls
    return int(min(max_calls, max(1, math.ceil(min_sample_s / est_s))))


def operand_copies(footprint_bytes: float, rotate_bytes: float, max_copies: int = 32) -> int:
    """Copies of a kernel's operands to cycle through so that together they exceed
    ``rotate_bytes`` (twice the L2 on a GPU): each call then reads from memory, as each layer
    of a real model does, instead of from the cache the previous call left warm."""
    if rotate_bytes <= 0 or footprint_bytes >= rotate_bytes:
        return 1
    return int(min(max_copies, math.ceil(rotate_bytes / max(footprint_bytes, 1.0))))


def estimate_seconds(plan: Plan, peak_flops: float, peak_bw: float,
                     per_shape_overhead_s: float = 0.03, efficiency: float = 0.6) -> float:
    """Rough run time of the plan's kernels on a GPU with the given peaks: per shape, the
    roofline time at ``efficiency`` of both peaks (fp8 at twice the bf16 rate) plus a fixed
    overhead for allocation, warm-up and graph capture, times the calls the timer makes."""
    total = 0.0
    for shapes in plan.shapes.values():
        for s in shapes:
            flops, nbytes = s.work()
            rate = peak_flops * (2.0 if getattr(s, "dtype", "") == "fp8" else 1.0)
            t = max(flops / (rate * efficiency), nbytes / (peak_bw * efficiency)) + 5e-6
            calls = plan.warmup + 2 + plan.repeats * calls_per_sample(t)
            total += per_shape_overhead_s + calls * t
    return total
