"""Roofline cost model v1 of a dense GQA decoder (Llama-style) on one tensor-parallel replica.

Per step, per GPU, the operators are: embedding gather; per layer the QKV projection,
causal attention for prefill chunks and for decode tokens over the paged cache, the output
projection, the gated MLP (gate/up and down GEMMs), the elementwise kernels (two fused
add+RMSNorms, rotary embedding, SiLU·mul) and, with tensor parallelism, two all-reduces over
NVLink, and the write of the new tokens' K and V into the paged cache; then the final norm,
the LM head over one position per sequence, the logits all-gather and the sampler. With FP8
weights the layer GEMMs run at the FP8 peak while the embedding and LM head stay bf16 (as in
FP8 checkpoints) and attention computes in bf16. Each takes ``max(compute, memory) + launch``
with calibrated efficiencies; the step adds a host overhead (scheduling, input preparation)
that the GPU does not overlap.
"""

from __future__ import annotations

from importlib import resources

import numpy as np
import yaml

from sim.config import DTYPE_BYTES, HardwareConfig, ModelConfig
from sim.cost.base import OperatorCost, StepCost
from sim.cost.operators import (
    Efficiency,
    attention_time,
    comm_time,
    decode_attention_work,
    gemm_time,
    gemm_work,
    prefill_attention_work,
)
from sim.errors import ConfigError

ELEMENTWISE_KERNELS_PER_LAYER = 4  # add+norm ×2, rotary, SiLU·mul


def load_calibration(name: str, backend: str,
                     field: str = "hardware.calibration") -> tuple[Efficiency, dict]:
    """Read ``sim/cost/calibrated/<name>/<backend>.yaml`` (written by ``python -m calibration
    fit``); ``field`` is the config key the name came from, for the error message. Returns the
    efficiencies and the whole document (host overheads, data hash, fit errors)."""
    folder = resources.files("sim.cost") / "calibrated" / name
    path = folder / f"{backend}.yaml"
    if not path.is_file():
        have = sorted(p.name.removesuffix(".yaml") for p in folder.iterdir()) \
            if folder.is_dir() else []
        if not have:
            raise ConfigError(field, name, "no calibrated parameters of that name in "
                              "sim/cost/calibrated/")
        raise ConfigError("backend.name", backend,
                          f"not calibrated for {name}; have {have}")
    doc = yaml.safe_load(path.read_text())
    return Efficiency.from_dict(doc["parameters"]), doc


class RooflineCostModel:
    """Step time of a dense decoder replica from per-operator rooflines (see module doc)."""

    def __init__(self, model: ModelConfig, hw: HardwareConfig, tp: int, kv_bytes: int,
                 eff: Efficiency, host_overhead_s: float, host_per_seq_s: float) -> None:
        self.model, self.hw, self.tp, self.eff = model, hw, tp, eff
        self.kv_bytes = kv_bytes
        if model.dtype == "fp8" and not hw.fp8_flops:
            raise ConfigError("model.dtype", "fp8", f"{hw.name} has no FP8 tensor cores")
        for dtype in {model.dtype, "bfloat16"}:
            if dtype not in eff.gemm:
                raise ConfigError("model.dtype", dtype,
                                  f"no calibrated GEMM efficiency; have {sorted(eff.gemm)}")
        # Transformer-layer GEMMs run in the checkpoint's dtype; the LM head (kept in bf16 by
        # FP8 checkpoints) and attention (the KV cache is read into bf16 math) run in bf16.
        self.layer_dtype = model.dtype
        self.host_overhead_s, self.host_per_seq_s = host_overhead_s, host_per_seq_s
        self.heads = model.num_attention_heads // tp
        self.kv_heads = max(1, model.num_key_value_heads // tp)
        self._linear_cache: dict[tuple[int, int], tuple[float, float, float]] = {}

    # ---- operators -------------------------------------------------------------------
    def _peak(self, dtype: str) -> float:
        return self.hw.fp8_flops if dtype == "fp8" else self.hw.bf16_flops

    def _gemm(self, name: str, count: int, m: int, n: int, k: int,
              dtype: str | None = None) -> OperatorCost:
        dtype = dtype or self.layer_dtype
        f, b = gemm_work(m, n, k, DTYPE_BYTES[dtype])
        t, cb = gemm_time(self.eff.gemm[dtype], m, n, k, self._peak(dtype),
                          self.hw.hbm_bandwidth, DTYPE_BYTES[dtype], num_sms=self.hw.num_sms)
        return OperatorCost(name, count, count * f, count * b, count * float(t),
                            "compute" if cb else "memory")

    def _elementwise(self, name: str, count: int, nbytes: float, kernels: int) -> OperatorCost:
        e = self.eff
        t = nbytes / (self.hw.hbm_bandwidth * e.elementwise_eta_memory)
        t += kernels * e.elementwise_launch_s
        return OperatorCost(name, count, 0.0, count * nbytes, count * t, "memory")

    def _comm(self, name: str, count: int, t: float, nbytes: float) -> OperatorCost:
        return OperatorCost(name, count, 0.0, count * nbytes, count * t, "comm")

    def _linear_ops(self, T: int, S: int) -> list[OperatorCost]:
        """Operators whose cost depends only on token and sequence counts."""
        m, L, tp = self.model, self.model.num_hidden_layers, self.tp
        h, d, inter = m.hidden_size, m.head_dim, m.intermediate_size // tp
        e = self.eff
        ops = [
            self._elementwise("embedding", 1, 2.0 * T * h * 2, 1),
            self._gemm("qkv_proj", L, T, (self.heads + 2 * self.kv_heads) * d, h),
            self._gemm("o_proj", L, T, h, self.heads * d),
            self._gemm("gate_up_proj", L, T, 2 * inter, h),
            self._gemm("down_proj", L, T, h, inter),
            self._elementwise(
                "norm_rope_act", L,
                2.0 * T * (8 * h + 2 * (self.heads + self.kv_heads) * d + 3 * inter),
                ELEMENTWISE_KERNELS_PER_LAYER),
            self._elementwise("final_norm", 1, 2.0 * T * 2 * h, 1),
            self._elementwise("kv_cache_write", L,
                              T * 2.0 * self.kv_heads * d * (2.0 + self.kv_bytes), 1),
            self._gemm("lm_head", 1, S, m.vocab_size // tp, h, "bfloat16"),
            self._elementwise("sampler", 1, 2.0 * S * m.vocab_size * 4, 2),
        ]
        if tp > 1:
            ar_bytes = T * h * 2.0
            link = self.hw.nvlink_bandwidth
            ar = comm_time(e.comm["allreduce"], "allreduce", ar_bytes, tp, link)
            # two per layer (attention and MLP outputs) and one of the vocab-parallel embedding
            ops.append(self._comm("tp_allreduce", 2 * L + 1, float(ar), ar_bytes))
            lg_bytes = S * m.vocab_size * 2.0
            lg = comm_time(e.comm["allgather"], "allgather", lg_bytes, tp, link)
            ops.append(self._comm("logits_allgather", 1, float(lg), lg_bytes))
        return ops

    def _attention_op(self, name: str, flops: float, nbytes: float, q_per_seq: float,
                      num_seqs: int, kind) -> OperatorCost:
        L = self.model.num_hidden_layers
        t, cb = attention_time(kind, flops, nbytes, q_per_seq, num_seqs, self.hw.bf16_flops,
                               self.hw.hbm_bandwidth)
        return OperatorCost(name, L, L * flops, L * nbytes, L * float(t),
                            "compute" if cb else "memory")

    def decode_attention(self, ctx_total, num_seqs: int):
        """Decode attention time over all layers for ``num_seqs`` sequences holding
        ``ctx_total`` cached tokens (array: one entry per step), and whether compute binds."""
        f, b = decode_attention_work(ctx_total, num_seqs, self.heads, self.kv_heads,
                                     self.model.head_dim, self.kv_bytes)
        t, cb = attention_time(self.eff.attention_decode, f, b, 1.0, num_seqs,
                               self.hw.bf16_flops, self.hw.hbm_bandwidth)
        return self.model.num_hidden_layers * t, cb, f, b

    def _prefill_attention(self, q: np.ndarray, ctx: np.ndarray) -> OperatorCost:
        f, b = prefill_attention_work(q.astype(np.float64), ctx.astype(np.float64), self.heads,
                                      self.kv_heads, self.model.head_dim, self.kv_bytes)
        return self._attention_op("attn_prefill", float(f.sum()), float(b.sum()),
                                  float(q.mean()), len(q), self.eff.attention_prefill)

    def _attention_ops(self, n: np.ndarray, c: np.ndarray) -> list[OperatorCost]:
        """Prefill-chunk and decode attention of the batch (one kernel each per layer)."""
        decode = (n == 1) & (c > 0)
        num_decode = int(np.count_nonzero(decode))
        ops = []
        if num_decode:
            t, cb, f, b = self.decode_attention(np.array([float(c[decode].sum())]), num_decode)
            L = self.model.num_hidden_layers
            ops.append(OperatorCost("attn_decode", L, L * float(f[0]), L * float(b[0]),
                                    float(t[0]), "compute" if cb[0] else "memory"))
        if num_decode < len(n):
            ops.append(self._prefill_attention(n[~decode], c[~decode]))
        return ops

    def _linear(self, T: int, S: int) -> tuple[float, float, float]:
        key = (T, S)
        lin = self._linear_cache.get(key)
        if lin is None:
            lin = _split(self._linear_ops(T, S))
            self._linear_cache[key] = lin
        return lin

    # ---- the CostModel interface ---------------------------------------------------------
    def breakdown(self, new_tokens: np.ndarray, context_tokens: np.ndarray) -> list[OperatorCost]:
        """Every operator of the step, plus the host overhead as a pseudo-operator."""
        n, c = np.asarray(new_tokens), np.asarray(context_tokens)
        T, S = int(n.sum()), len(n)
        ops = self._linear_ops(T, S) + self._attention_ops(n, c)
        host = self.host_overhead_s + self.host_per_seq_s * S
        return ops + [OperatorCost("host_overhead", 1, 0.0, 0.0, host, "host")]

    def step_cost(self, new_tokens: np.ndarray, context_tokens: np.ndarray) -> StepCost:
        """Step time: cached token-count operators + this batch's attention + host."""
        T, S = int(new_tokens.sum()), len(new_tokens)
        if T == S and context_tokens.min() > 0:  # decode only: same arithmetic as a window
            w = self.decode_window(context_tokens, 1)
            return StepCost(*(float(a[0]) for a in w))
        lin = self._linear(T, S)
        att = _split(self._attention_ops(new_tokens, context_tokens))
        host = self.host_overhead_s + self.host_per_seq_s * S
        compute, memory, comm = lin[0] + att[0], lin[1] + att[1], lin[2] + att[2]
        return StepCost(compute + memory + comm + host, compute, memory, comm, host)

    def decode_window(self, context_tokens: np.ndarray, k: int):
        """Costs of ``k`` consecutive decode-only steps of the same sequences.

        Each step every sequence adds one token, so step j attends over
        ``sum(context_tokens) + j·S`` cached tokens. Returns arrays (time, compute, memory,
        comm, host) of length k.
        """
        S = len(context_tokens)
        lin = self._linear(S, S)
        ctx = float(context_tokens.sum()) + S * np.arange(k, dtype=np.float64)
        att, cb, _, _ = self.decode_attention(ctx, S)
        host = np.full(k, self.host_overhead_s + self.host_per_seq_s * S)
        compute = lin[0] + np.where(cb, att, 0.0)
        memory = lin[1] + np.where(cb, 0.0, att)
        comm = np.full(k, lin[2])
        return compute + memory + comm + host, compute, memory, comm, host


def _split(ops: list[OperatorCost]) -> tuple[float, float, float]:
    """(compute-bound, memory-bound, comm) time of a list of operators."""
    parts = {"compute": 0.0, "memory": 0.0, "comm": 0.0}
    for op in ops:
        parts[op.bound] += op.time_s
    return parts["compute"], parts["memory"], parts["comm"]
