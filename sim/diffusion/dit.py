"""The operators of one denoising step of a diffusion transformer on one GPU.

A step is one forward pass over ``batch`` latent sequences (images × the guidance passes run
together on this GPU group), split by the plan (``DitSplit``): Ulysses ``u`` and ring ``r``
sequence parallelism, tensor parallelism ``t``, a PipeFusion stage holding ``stage`` of the
layers and running the sequence as ``patches`` patches. Every GEMM has ``m`` = the tokens
this GPU holds (batch × tokens / (u·r·patches)), ``n`` and ``k`` from the weights (split by
``t``); attention is non-causal (``Pricer.encoder_attention``) over ``heads / (u·t)`` heads,
``tokens / (r·patches)`` queries, and all keys (in ``r`` ring passes of ``tokens / r`` keys).

Blocks (docs/diffusion.md): *double* (MMDiT / Flux and HunyuanVideo double-stream: per
stream adaLN modulation, QKV, QK-norm, joint attention over image + text tokens, output
projection, GELU MLP), *single* (Flux / HunyuanVideo: one fused QKV+MLP-in projection over the
joined tokens, attention, one fused output projection), *cross* (Wan: self-attention over the
latent, cross-attention to the text, FFN; one shared modulation per pass) and *shared*
(CogVideoX: joint attention with one weight set, two modulation GEMMs from the time embedding).
Communication inside the layers is priced here: four all-to-alls per Ulysses attention
(Q, K, V in, output back), ``r − 1`` ring sends of K and V per attention (overlapped with the
pass before: only what a send takes beyond its pass shows) and the merge of each ring pass's
partial output into an fp32 accumulator, and tensor-parallel all-reduces
(2 per double or shared block, 1 per single block, 3 per cross block).

Chunking: an operator over many tokens is priced at the fastest of running it whole or as
2, 4, 8 or 16 equal pieces along its tokens in turn (weights re-read per piece). The
calibrated efficiencies vary by a few percent with shape, so a piece of the sequence can
price a little faster per token than the whole; a GPU could run those pieces in turn just as a
sequence-parallel group runs them side by side, and without this a split over GPUs would show
a super-linear speed-up that no GPU has. The operator reports its own FLOPs and bytes (the
whole operator's work) with the fastest split's time and bound.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from sim.config.diffusion_model import DiTConfig
from sim.cost.attention_kernels import CALIBRATED
from sim.cost.base import OperatorCost
from sim.cost.pricing import ACT_BYTES, Pricer
from sim.diffusion.execution import COMPILED, Execution

DTYPE = "bfloat16"  # DiT weights and activations
CHUNKS = (2, 4, 8, 16)  # pieces an operator over many tokens may run as (module doc)
MIN_CHUNK_ROWS = 1024


@dataclass(frozen=True)
class DitSplit:
    """One GPU's share of a DiT step under a parallel plan (``sim.diffusion.plans``)."""

    batch: int  # sequences this GPU group runs per step (images × guidance passes together)
    ulysses: int = 1
    ring: int = 1
    tensor: int = 1
    stage: float = 1.0  # fraction of the layers on this GPU (PipeFusion; slowest stage)
    patches: int = 1  # PipeFusion patches per step (each a forward of tokens / patches)
    link_bw: float = 450e9  # bytes/s of the links the collectives run over

    @property
    def seq(self) -> int:
        """Ways the sequence is split: Ulysses × ring."""
        return self.ulysses * self.ring


def chunked(price: Callable[[int], OperatorCost], rows: int) -> OperatorCost:
    """An operator of ``rows`` rows (GEMM ``m``, attention queries) priced at the fastest of
    running it whole or as ``CHUNKS`` equal pieces in turn (module doc).

    Its FLOPs and bytes are the whole operator's: the split is how its time is priced, not
    more work (pieces rounded up to whole rows would count rows that do not exist). Its time
    and bound are the fastest split's."""
    whole = price(rows)
    time_s, bound = whole.time_s, whole.bound
    for k in CHUNKS:
        if rows < k * MIN_CHUNK_ROWS:
            break
        piece = price(math.ceil(rows / k))
        if k * piece.time_s < time_s:
            time_s, bound = k * piece.time_s, piece.bound
    return OperatorCost(whole.name, 1, whole.flops, whole.bytes, time_s, bound, whole.dtype)


def _tok(n: int, ways: int) -> int:
    """Tokens of ``n`` on one of ``ways`` parts (padded up, as the kernels pad)."""
    return math.ceil(n / ways)


class DitOps:
    """Builds the operator list of one step of ``dit`` for ``image_tokens`` latent tokens."""

    def __init__(self, pricer: Pricer, dit: DiTConfig, image_tokens: int, split: DitSplit,
                 attention_impl: str = CALIBRATED, execution: Execution = COMPILED,
                 sm_share: float | None = None):
        self.p, self.d, self.s = pricer, dit, split
        self.impl, self.exe, self.sm_share = attention_impl, execution, sm_share
        self.launches = 0.0  # kernel launches per step on this GPU (the eager host's work)
        self.h = dit.hidden
        self.n_img = _tok(image_tokens, split.seq * split.patches)  # per GPU per patch
        self.n_txt = _tok(dit.text_tokens, split.seq * split.patches)
        self.s_img, self.s_txt = image_tokens, dit.text_tokens
        self.heads = dit.heads // (split.ulysses * split.tensor)
        self.ops: list[OperatorCost] = []

    # ---- helpers: every operator is appended scaled to its runs per step on this GPU
    def _add(self, op: OperatorCost, runs: float, kernels: float = 1) -> None:
        if runs > 0:
            self.ops.append(op.scaled(runs))
            self.launches += runs * kernels

    def _gemm(self, name: str, tokens: int, n: int, k: int, runs: float) -> None:
        m = self.s.batch * tokens
        self._add(chunked(lambda rows: self.p.gemm(name, rows, n, k, DTYPE), m), runs)

    def _mod(self, name: str, n: int, runs: float) -> None:
        # adaLN modulation: one vector per sequence, replicated on every GPU; per layer, not
        # per patch
        self._add(self.p.gemm(name, self.s.batch, n, self.d.modulation_dim or self.h, DTYPE),
                  runs)

    def _attention(self, name: str, q_tokens: int, kv_tokens: int, runs: float) -> None:
        """Self-attention over ``q_tokens + …`` joint tokens: Ulysses all-to-alls, ring passes."""
        s, d = self.s, self.d
        q = _tok(q_tokens, s.ring * s.patches)
        kv = _tok(kv_tokens, s.ring)
        one = chunked(lambda rows: self.p.encoder_attention(name, s.batch, rows, kv, self.heads,
                                                            d.head_dim, self.impl,
                                                            self.sm_share), q)
        self._add(one, runs * s.ring)
        if s.ring > 1:
            # each pass's partial output is merged into an fp32 accumulator by its softmax
            # statistics: read the accumulator and the pass's output, write the accumulator
            elems = s.batch * q * self.heads * d.head_dim
            self._add(self.p.elementwise(f"{name}_ring_merge", elems * (4 + 2 + 4), 2),
                      runs * s.ring, 2)
            block = s.batch * kv * self.heads * d.head_dim * 2 * ACT_BYTES  # K and V
            send = self.p.comm(f"{name}_ring_p2p", "p2p", block, 2, s.link_bw)
            exposed = max(send.time_s - one.time_s, 0.0)
            self._add(OperatorCost(send.name, 1, 0.0, send.bytes, exposed, "comm"),
                      runs * (s.ring - 1))
        if s.ulysses > 1:
            local = _tok(q_tokens, s.seq * s.patches)
            msg = s.batch * local * (d.heads // s.tensor) * d.head_dim * ACT_BYTES
            a2a = self.p.comm(f"{name}_ulysses_a2a", "alltoall", msg, s.ulysses, s.link_bw)
            self._add(a2a, runs * 4)

    def _allreduce(self, name: str, tokens: int, runs: float) -> None:
        if self.s.tensor > 1:
            nbytes = self.s.batch * tokens * self.h * ACT_BYTES
            self._add(self.p.comm(name, "allreduce", nbytes, self.s.tensor, self.s.link_bw),
                      runs)

    def _elementwise(self, name: str, tokens: int, ffn: int, reads_writes: float,
                     kernels: int, runs: float) -> None:
        """Norms, modulation, QK-norm, RoPE, gates, residuals and the GELU: ``reads_writes``
        passes over the block's activations plus one read and write of the MLP's."""
        t, u = self.s.tensor, self.exe.unfused  # eager: more kernels, more passes
        acts = self.s.batch * tokens * ACT_BYTES
        nbytes = acts * (reads_writes * u * self.h + 4 * self.h / t + 2 * ffn / t)
        k = round(kernels * u)
        self._add(self.p.elementwise(name, nbytes, k), runs, k)

    # ---- blocks
    def double(self, layers: float) -> None:
        """MMDiT joint blocks with a weight set per stream (image, text)."""
        h, f, t, m = self.h, self.d.ffn, self.s.tensor, self.s.patches
        self._mod("double.modulation", 2 * 6 * h, layers)
        for stream, n in (("img", self.n_img), ("txt", self.n_txt)):
            self._gemm(f"double.{stream}_qkv", n, 3 * h // t, h, layers * m)
            self._gemm(f"double.{stream}_out", n, h, h // t, layers * m)
            self._gemm(f"double.{stream}_mlp_up", n, f // t, h, layers * m)
            self._gemm(f"double.{stream}_mlp_down", n, h, f // t, layers * m)
        self._attention("double.attention", self.s_img + self.s_txt, self.s_img + self.s_txt,
                        layers * m)
        self._allreduce("double.tp_allreduce", self.n_img + self.n_txt, 2 * layers * m)
        self._elementwise("double.norms_residuals", self.n_img + self.n_txt, f, 10, 12,
                          layers * m)

    def single(self, layers: float) -> None:
        """Single-stream blocks: fused QKV + MLP-in, attention ∥ GELU, fused output."""
        h, f, t, m = self.h, self.d.ffn, self.s.tensor, self.s.patches
        n = self.n_img + self.n_txt
        self._mod("single.modulation", 3 * h, layers)
        self._gemm("single.qkv_mlp_in", n, (3 * h + f) // t, h, layers * m)
        self._gemm("single.out", n, h, (h + f) // t, layers * m)
        self._attention("single.attention", self.s_img + self.s_txt, self.s_img + self.s_txt,
                        layers * m)
        self._allreduce("single.tp_allreduce", n, layers * m)
        self._elementwise("single.norms_residuals", n, f, 5, 6, layers * m)

    def cross(self, layers: float) -> None:
        """Wan blocks: self-attention over the latent, cross-attention to the text, FFN."""
        h, f, t, m, d = self.h, self.d.ffn, self.s.tensor, self.s.patches, self.d
        n = self.n_img
        self._gemm("cross.self_qkv", n, 3 * h // t, h, layers * m)
        self._attention("cross.self_attention", self.s_img, self.s_img, layers * m)
        self._gemm("cross.self_out", n, h, h // t, layers * m)
        self._gemm("cross.q", n, h // t, h, layers * m)
        # K and V of the text: every sequence-parallel rank computes them for its heads
        self._add(self.p.gemm("cross.text_kv", self.s.batch * self.s_txt, 2 * h // t, h, DTYPE),
                  layers)
        one = chunked(lambda rows: self.p.encoder_attention(
            "cross.attention", self.s.batch, rows, self.s_txt, d.heads // t, d.head_dim,
            self.impl, self.sm_share), n)
        self._add(one, layers * m)
        self._gemm("cross.out", n, h, h // t, layers * m)
        self._gemm("cross.mlp_up", n, f // t, h, layers * m)
        self._gemm("cross.mlp_down", n, h, f // t, layers * m)
        self._allreduce("cross.tp_allreduce", n, 3 * layers * m)
        self._elementwise("cross.norms_residuals", n, f, 14, 14, layers * m)

    def shared(self, layers: float) -> None:
        """CogVideoX blocks: one weight set over the joined text and video tokens."""
        h, f, t, m = self.h, self.d.ffn, self.s.tensor, self.s.patches
        n = self.n_img + self.n_txt
        self._mod("shared.modulation", 2 * 6 * h, layers)
        self._gemm("shared.qkv", n, 3 * h // t, h, layers * m)
        self._attention("shared.attention", self.s_img + self.s_txt, self.s_img + self.s_txt,
                        layers * m)
        self._gemm("shared.out", n, h, h // t, layers * m)
        self._gemm("shared.mlp_up", n, f // t, h, layers * m)
        self._gemm("shared.mlp_down", n, h, f // t, layers * m)
        self._allreduce("shared.tp_allreduce", n, 2 * layers * m)
        self._elementwise("shared.norms_residuals", n, f, 10, 12, layers * m)

    def edges(self) -> None:
        """Patch embedding, text embedding and the final projection, once per step."""
        d, m = self.d, self.s.patches
        patch = d.latent_channels * d.patch_size ** 2 * d.patch_size_t
        self._gemm("patch_embed", self.n_img, self.h, patch, m)
        self._gemm("context_embed", self.n_txt, self.h, d.text_dim, m)
        self._gemm("proj_out", self.n_img, patch, self.h, m)
        if d.shared_modulation:
            self._add(self.p.gemm("time_modulation", self.s.batch, 6 * self.h, self.h, DTYPE), 1)


def dit_step_ops(pricer: Pricer, dit: DiTConfig, image_tokens: int, split: DitSplit,
                 attention_impl: str = CALIBRATED, execution: Execution = COMPILED,
                 sm_share: float | None = None) -> list[OperatorCost]:
    """Every operator of one DiT step on one GPU (per-step totals, module doc); attention
    priced by the kernel class ``attention_impl`` on this GPU (``sim.cost.attention_kernels``;
    ``sm_share`` overrides its fitted SM share); in eager ``execution``, the host's dispatch
    time beyond the GPU's (``sim.diffusion.execution``)."""
    b = DitOps(pricer, dit, image_tokens, split, attention_impl, execution, sm_share)
    stage = split.stage
    for kind in ("double", "single", "cross", "shared"):
        layers = getattr(dit, f"{kind}_layers")
        if layers:
            getattr(b, kind)(layers * stage)
    b.edges()
    if execution.eager and execution.launch_s > 0:
        gpu = sum(op.time_s for op in b.ops)
        host = b.launches * execution.launch_s
        if host > gpu:
            b.ops.append(OperatorCost("eager.host_dispatch", round(b.launches), 0.0, 0.0,
                                      host - gpu, "host"))
    return b.ops
