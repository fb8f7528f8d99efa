"""The measured kernels, in PyTorch: GEMM, causal prefill and decode attention, a grouped MoE.

Each builder allocates random operands (never zeros: they run faster than real data) in
enough copies to exceed ``rotate_bytes`` (see ``shapes.operand_copies``) and returns a
:class:`BuiltKernel` whose ``fn(i)`` launches one call on copy ``i mod copies`` without any
host synchronisation, so the timer can capture it in a CUDA graph. Imported only when kernels
run: it needs torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from calibration.profile.shapes import AttentionShape, GemmShape, MoeShape, Shape, operand_copies


@dataclass
class BuiltKernel:
    """A launch callable over operand copies and the name of what it runs (``kernel_source``)."""

    fn: Callable[[int], object]
    source: str


def _fast_sdpa_backends() -> list | None:
    """On CUDA, forbid SDPA's math fallback (it materialises the score matrix and is no kernel
    a server runs): a shape no fused kernel takes fails and is reported instead."""
    try:
        from torch.nn.attention import SDPBackend
    except ImportError:
        return None
    names = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION")
    return [getattr(SDPBackend, n) for n in names if hasattr(SDPBackend, n)]


class TorchKernels:
    """Builds the kernels of each shape on ``device`` ("cuda" or "cpu")."""

    def __init__(self, device: str, rotate_bytes: float = 0.0, seed: int = 0) -> None:
        self.device = torch.device(device)
        self.rotate_bytes = rotate_bytes
        self.gen = torch.Generator(device=self.device).manual_seed(seed)
        self.backends = _fast_sdpa_backends() if self.device.type == "cuda" else None

    def _randn(self, *shape: int, dtype=torch.bfloat16, scale: float = 1.0) -> torch.Tensor:
        t = torch.randn(*shape, generator=self.gen, device=self.device, dtype=torch.float32)
        return (t * scale).to(dtype)

    def _copies(self, shape: Shape) -> int:
        return operand_copies(shape.work()[1], self.rotate_bytes)

    def build(self, shape: Shape) -> BuiltKernel:
        """The kernel that runs ``shape``; raises if the device cannot run it."""
        if isinstance(shape, GemmShape):
            return self.gemm(shape)
        if isinstance(shape, AttentionShape):
            return self.attention(shape)
        if isinstance(shape, MoeShape):
            return self.moe(shape)
        raise TypeError(f"no kernel for {shape!r}")

    def release(self) -> None:
        """Give cached device memory back between shapes whose sizes differ by orders of
        magnitude, so fragmentation does not fail a large shape after many small ones."""
        if self.device.type == "cuda":
            total = torch.cuda.get_device_properties(self.device).total_memory
            if torch.cuda.memory_reserved(self.device) > total // 2:
                torch.cuda.empty_cache()

    def gemm(self, s: GemmShape) -> BuiltKernel:
        """bf16: ``F.linear`` (x·Wᵀ, as a server's linear layer); fp8: ``torch._scaled_mm``
        with e4m3 operands, per-tensor scales and bf16 output."""
        c = self._copies(s)
        if s.dtype == "bfloat16":
            xs = [self._randn(s.m, s.k) for _ in range(c)]
            ws = [self._randn(s.n, s.k, scale=s.k ** -0.5) for _ in range(c)]
            return BuiltKernel(lambda i: F.linear(xs[i % c], ws[i % c]),
                               "torch.nn.functional.linear")
        fp8 = getattr(torch, "float8_e4m3fn", None)
        if fp8 is None or not hasattr(torch, "_scaled_mm"):
            raise NotImplementedError(f"torch {torch.__version__} has no fp8 scaled_mm")
        xs = [self._randn(s.m, s.k, dtype=fp8) for _ in range(c)]
        ws = [self._randn(s.n, s.k, dtype=fp8) for _ in range(c)]  # Wᵀ is column-major
        one = torch.ones((), device=self.device, dtype=torch.float32)
        return BuiltKernel(
            lambda i: torch._scaled_mm(xs[i % c], ws[i % c].t(), scale_a=one, scale_b=one,
                                       out_dtype=torch.bfloat16),
            "torch._scaled_mm(e4m3, per-tensor scale)")

    def attention(self, s: AttentionShape) -> BuiltKernel:
        """``scaled_dot_product_attention``: causal over ``isl`` new tokens (prefill), or one
        query token per sequence over a contiguous cache of ``ctx`` tokens (decode); GQA
        through ``enable_gqa`` where torch has it, else with K/V heads repeated beforehand."""
        c = self._copies(s)
        kv_len = s.isl if s.ctx == 0 else s.ctx
        qs = [self._randn(s.batch, s.heads, s.isl, s.head_dim) for _ in range(c)]
        ks = [self._randn(s.batch, s.kv_heads, kv_len, s.head_dim) for _ in range(c)]
        vs = [self._randn(s.batch, s.kv_heads, kv_len, s.head_dim) for _ in range(c)]
        causal = s.ctx == 0
        source = "torch.nn.functional.scaled_dot_product_attention"
        gqa = {"enable_gqa": True} if s.kv_heads != s.heads else {}
        try:
            F.scaled_dot_product_attention(qs[0][:, :, :1], ks[0][:, :, :1], vs[0][:, :, :1],
                                           **gqa)
        except TypeError:  # torch < 2.5: no enable_gqa
            rep = s.heads // s.kv_heads
            ks = [k.repeat_interleave(rep, dim=1) for k in ks]
            vs = [v.repeat_interleave(rep, dim=1) for v in vs]
            gqa, source = {}, source + " (K/V heads repeated)"

        def sdpa(i: int) -> torch.Tensor:
            j = i % c
            return F.scaled_dot_product_attention(qs[j], ks[j], vs[j], is_causal=causal, **gqa)

        if self.backends is None:
            return BuiltKernel(sdpa, source)
        from torch.nn.attention import sdpa_kernel

        def fused_only(i: int) -> torch.Tensor:
            with sdpa_kernel(self.backends):
                return sdpa(i)

        return BuiltKernel(fused_only, source)

    def moe(self, s: MoeShape) -> BuiltKernel:
        """Routed experts as batched GEMMs over the touched experts: gather each expert's
        tokens, gate/up bmm, SiLU·mul, down bmm, then the gate-weighted index_add back to the
        tokens. Routing is balanced (pair p of token p // topk goes to expert p mod E), so
        every touched expert holds the same number of tokens up to one row of padding."""
        c = self._copies(s)
        pairs = s.num_tokens * s.topk
        touched = s.touched_experts()
        cap = -(-pairs // s.num_experts)
        p = torch.arange(pairs, device=self.device)
        idx = torch.zeros(touched, cap, dtype=torch.long, device=self.device)
        gate = torch.zeros(touched, cap, 1, dtype=torch.bfloat16, device=self.device)
        idx[p % s.num_experts, p // s.num_experts] = p // s.topk
        gate[p % s.num_experts, p // s.num_experts] = (1.0 / s.topk)
        flat = idx.reshape(-1)
        xs = [self._randn(s.num_tokens, s.hidden) for _ in range(c)]
        w1 = [self._randn(touched, s.hidden, 2 * s.inter, scale=s.hidden ** -0.5)
              for _ in range(c)]
        w2 = [self._randn(touched, s.inter, s.hidden, scale=s.inter ** -0.5) for _ in range(c)]

        def moe(i: int) -> torch.Tensor:
            j = i % c
            h = torch.bmm(xs[j][idx], w1[j])
            a = F.silu(h[..., :s.inter]) * h[..., s.inter:]
            y = torch.bmm(a, w2[j]) * gate
            return torch.zeros_like(xs[j]).index_add_(0, flat, y.reshape(-1, s.hidden))

        return BuiltKernel(moe, "torch.bmm over touched experts (gather, silu*mul, index_add)")
