"""The operators of a job's text encoding on one GPU.

Each encoder is a transformer run once over the prompt's (padded) tokens: per layer a QKV
GEMM, attention over the prompt, an output projection, an FFN (two input projections when
gated: gated-GELU T5, SwiGLU Llama) and its norms and residuals. Under classifier-free
guidance the negative prompt runs with it (batch 2). The encoders run on one GPU of the
job's gang while the others wait (a serial stage; xDiT and diffusers do not split them), and
once per job: the images of a prompt share its embedding.

Attention is priced as non-causal (``Pricer.encoder_attention``), also for the LLM encoder
(HunyuanVideo's LLaVA-Llama-3-8B), whose causal mask would halve that small term.
"""

from __future__ import annotations

from sim.config.diffusion_model import TextEncoderConfig
from sim.cost.base import OperatorCost
from sim.cost.pricing import ACT_BYTES, Pricer

DTYPE = "bfloat16"


def encoder_ops(pricer: Pricer, e: TextEncoderConfig, batch: int) -> list[OperatorCost]:
    """One run of encoder ``e`` over ``batch`` prompts on one GPU, per operator."""
    kv_heads = e.kv_heads or e.heads
    m = batch * e.tokens
    inner = e.heads * e.head_dim
    up = (2 if e.gated else 1) * e.ffn
    ops = [
        pricer.gemm(f"{e.name}.qkv", m, (e.heads + 2 * kv_heads) * e.head_dim, e.hidden, DTYPE),
        pricer.encoder_attention(f"{e.name}.attention", batch, e.tokens, e.tokens, e.heads,
                                 e.head_dim),
        pricer.gemm(f"{e.name}.out", m, e.hidden, inner, DTYPE),
        pricer.gemm(f"{e.name}.ffn_up", m, up, e.hidden, DTYPE),
        pricer.gemm(f"{e.name}.ffn_down", m, e.hidden, e.ffn, DTYPE),
        # two norms and two residual adds (read + write the hidden state each), the FFN
        # activation (read the up output, write its product)
        pricer.elementwise(f"{e.name}.norms_residuals",
                           m * ACT_BYTES * (8 * e.hidden + (up + e.ffn)), 5),
    ]
    return [op.scaled(e.layers) for op in ops]


def encode_ops(pricer: Pricer, encoders: list[TextEncoderConfig],
               batch: int) -> list[OperatorCost]:
    """Every encoder of a pipeline, one after the other on one GPU."""
    return [op for e in encoders for op in encoder_ops(pricer, e, batch)]
