"""Roofline cost model of one replica: every operator of a step, per GPU, on the roofline.

A step is: the embedding; then, through ``pp`` pipeline stages (``sim.cost.pipeline``), each
stage's layers, each layer one attention-side kind (full or sliding-window softmax attention,
GQA or MLA, or Gated DeltaNet linear attention) and one FFN kind (dense MLP or MoE) with its
tensor- and expert-parallel communication (``sim.cost.layers``, ``sim.cost.moe``) and its
attention over the cache (``sim.cost.attention``); then the final norm, LM head, logits
all-gather and sampler. Each operator takes ``max(compute, memory) + launch`` with calibrated
efficiencies; the step adds a host overhead (scheduling, input preparation) that the GPU does
not overlap. FP8 checkpoints (per-tensor ``fp8`` or block-scaled ``fp8_block``, each with its
calibrated efficiency) run the layer GEMMs (and FP8 experts) at the FP8 peak; the embedding,
LM head, router and attention math stay bf16.
"""

from __future__ import annotations

import numpy as np

from sim.config import HardwareConfig, ModelConfig
from sim.cost.attention import AttentionOps
from sim.cost.base import OperatorCost, StepCost
from sim.cost.cuda_graphs import CudaGraphs
from sim.cost.host import HostCosts, new_requests
from sim.cost.layers import head_ops, layer_token_ops
from sim.cost.memo import Memo
from sim.cost.moe import expert_efficiency_key, expert_math_dtype
from sim.cost.operators import Efficiency
from sim.cost.pipeline import makespan, micro_batches, send_ops
from sim.cost.pricing import Pricer
from sim.model.layout import ATTENTION_KINDS, FFN_KINDS, LayerCounts, PerGpu, stage_layer_counts

BOUND_INDEX = {"compute": 0, "memory": 1, "comm": 2}
TOKEN_BLOCK = 256  # token counts priced together (RooflineCostModel._price_token_block)


def bound_parts(ops) -> np.ndarray:
    """(compute, memory, comm) time of a list of operators: shape (3,), or (3, n) for
    operators priced at n token counts at once (each count summed on its own roofs, in the
    same order as one count alone: adding a 0.0 changes no sum)."""
    out = None
    for op in ops:
        if out is None:
            out = np.zeros((3,) + np.shape(op.time_s))
        if isinstance(op.bound, str):
            out[BOUND_INDEX[op.bound]] += op.time_s
        else:
            out[0] += np.where(op.bound == "compute", op.time_s, 0.0)
            out[1] += np.where(op.bound == "memory", op.time_s, 0.0)
    return np.zeros(3) if out is None else out


def _kernel_parts(kernels, k: int) -> np.ndarray:
    """(compute, memory, comm) × k steps of per-step kernels."""
    out = np.zeros((3, k))
    for kern in kernels:
        compute = np.where(kern.compute_bound, kern.time, 0.0)
        out[0] += compute
        out[1] += kern.time - compute  # exact: t − t or t − 0
    return out


def merge(ops: list[OperatorCost]) -> list[OperatorCost]:
    """One row per operator name, in order of first appearance, totals summed; the bound is
    that of the largest contribution."""
    rows: dict[str, list[OperatorCost]] = {}
    for op in ops:
        rows.setdefault(op.name, []).append(op)
    out = []
    for name, group in rows.items():
        top = max(group, key=lambda o: o.time_s)
        out.append(OperatorCost(name, sum(o.count for o in group), sum(o.flops for o in group),
                                sum(o.bytes for o in group), sum(o.time_s for o in group),
                                top.bound, top.dtype))
    return out


class RooflineCostModel:
    """Step time of one replica on ``tp × pp`` GPUs from per-operator rooflines (module doc).

    ``ep`` is 1 (experts tensor-parallel) or ``tp`` (experts spread over the group).
    """

    def __init__(self, model: ModelConfig, hw: HardwareConfig, tp: int, kv_bytes: int,
                 eff: Efficiency, host: HostCosts | None = None,
                 pp: int = 1, ep: int = 1, graphs: CudaGraphs | None = None,
                 overlap: bool = False, eager_launch_s: float = 0.0) -> None:
        """``host``: the engine's per-step CPU time (``sim.cost.host``; None: none);
        ``graphs``: the engine's CUDA-graph capture sizes (``sim.cost.cuda_graphs``; None:
        no step is padded); ``overlap``: the engine schedules a step while the GPU runs the
        one before it (``sim.config.backend.overlaps``), so its host work overlaps the GPU's
        and a step takes the longer of the two;
        ``eager_launch_s``: the host's dispatch time per kernel launch of a step that replays
        no graph where the engine's model code runs eager (``graphs.dispatches``): such a
        step's GPU work takes at least its launches × this."""
        self.overlap = overlap
        self.host = host or HostCosts()
        self.eager_launch_s = eager_launch_s
        self.model, self.hw, self.tp, self.pp, self.ep, self.eff = model, hw, tp, pp, ep, eff
        self.graphs = graphs or CudaGraphs()
        self.kv_bytes = kv_bytes
        self.p = Pricer(hw, eff)
        self.g = PerGpu.of(model, tp, ep, kv_bytes)
        for dtype in (model.dtype, "bfloat16"):
            self.p.check_dtype("model.dtype", model.dtype, dtype, eff.gemm)
        if model.num_experts:
            self.p.check_dtype("model.moe_dtype", self.g.expert_dtype,
                               expert_efficiency_key(self.g, eff.moe), eff.moe)
            self.p.check_dtype("model.moe_dtype", self.g.expert_dtype,
                               expert_math_dtype(self.g), eff.gemm)
        self.att = AttentionOps(self.p, self.g)
        self.stages: list[LayerCounts] = stage_layer_counts(model, pp)
        self.attention_kinds = [k for k in ATTENTION_KINDS if any(s.of(k) for s in self.stages)]
        # per stage: (attention kind, layers of it) with at least one layer
        self._stage_attention = [[(k, s.of(k)) for k in self.attention_kinds if s.of(k)]
                                 for s in self.stages]
        # bounded memos of pure functions of (tokens, sequences); the token-count operators
        # depend on the sequence count only through linear attention's convolution state
        # (otherwise they are priced a block of token counts at a time: _price_token_block)
        self._token_parts = Memo(16384)
        self._token_key_seqs = bool(self.g.lin_value_heads)
        self._head_parts = Memo(16384)
        self._sends = Memo(4096)
        self._kernels: dict[tuple[bool, bool], int] = {}

    # ---- cached pieces (only their (compute, memory, comm) totals are kept) -------------------
    def _stage_token_parts(self, T: int, S: int, decode_step: bool = False
                           ) -> list[np.ndarray]:
        """(compute, memory, comm) of each stage's token-count operators, at the CUDA-graph
        size the step runs at (``decode_step``: every sequence decodes one token)."""
        T = self.graphs.padded(T, decode_step)
        if self._token_key_seqs or T < 1:
            return self._token_parts.get_or((T, S), lambda: self._token_stage_parts(T, S))
        parts = self._token_parts.get(T)
        return self._price_token_block(T) if parts is None else parts

    def _price_token_block(self, T: int) -> np.ndarray:
        """Price the token-count operators of every count in ``T``'s block of
        ``TOKEN_BLOCK`` at once (numpy over the counts: a run meets thousands of distinct
        counts, and pricing each alone in Python was a quarter of the default run's time),
        remember them and return ``T``'s. A count is always priced in the same block, so
        its price does not depend on which counts a run met first."""
        lo = T - T % TOKEN_BLOCK
        counts = np.arange(max(lo, 1), lo + TOKEN_BLOCK, dtype=np.int64)
        block = np.moveaxis(np.array(self._token_stage_parts(counts, counts)), -1, 0)
        block = np.ascontiguousarray(block)
        block.setflags(write=False)  # rows are shared by every step of that count
        memo = self._token_parts
        if len(memo) + len(counts) > memo.size:
            memo.clear()
        memo.update(zip(counts.tolist(), block, strict=True))
        return memo[T]

    def _token_stage_parts(self, T, S) -> list[np.ndarray]:
        """Each stage's (compute, memory, comm) of the token-count operators of a step of
        ``T`` tokens over ``S`` sequences; (3, n) arrays for arrays of n counts."""
        ops = layer_token_ops(self.p, self.g, self.hw, T, S)
        per_kind = {kind: bound_parts(ops[kind]) for kind in ops}
        stages = []
        for counts in self.stages:
            total = np.zeros((3,) + np.shape(T))
            for kind in ATTENTION_KINDS + FFN_KINDS:
                if counts.of(kind):
                    total = total + counts.of(kind) * per_kind[kind]
            stages.append(total)
        return stages

    def _head(self, T: int, S: int) -> np.ndarray:
        return self._head_parts.get_or((T, S), lambda: bound_parts(
            sum(head_ops(self.p, self.g, self.hw, T, S), [])))

    def _send_time(self, tokens: int) -> float:
        """Sends of a ``tokens``-token micro-batch along the pipeline's fill path."""
        return self._sends.get_or(tokens, lambda: sum(op.time_s for op in send_ops(
            self.p, self.hw, self.tp, self.pp, tokens, self.g.hidden)))

    # ---- attention of a micro-batch ---------------------------------------------------------
    def _attention_ops(self, kind: str, n: np.ndarray, c: np.ndarray) -> list[OperatorCost]:
        """One layer of ``kind``: prefill chunks and decode tokens of the micro-batch."""
        decode = (n == 1) & (c > 0)
        ops = []
        if decode.any():
            ops += [kern.op(0) for kern in self.att.decode(kind, c[decode], 1)]
        if not decode.all():
            ops += self.att.prefill(kind, n[~decode], c[~decode])
        return ops

    def _stages(self, tok: list[np.ndarray], att: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Each stage's (compute, memory, comm): token parts plus attention parts."""
        out = []
        for kinds, total in zip(self._stage_attention, tok, strict=True):
            for kind, count in kinds:
                total = total + count * att[kind]
            out.append(total)
        return out

    def _micro_batch_parts(self, n: np.ndarray, c: np.ndarray) -> list[np.ndarray]:
        """Each stage's (compute, memory, comm) time for one micro-batch of a general step."""
        decode = (n == 1) & (c > 0)
        num_decode = int(np.count_nonzero(decode))
        prefill = ~decode
        att = {}
        for kind in self.attention_kinds:
            part = np.zeros(3)
            if num_decode < len(n):
                for op in self.att.prefill(kind, n[prefill], c[prefill]):
                    part[BOUND_INDEX[op.bound]] += op.time_s
            if num_decode:
                for kern in self.att.decode(kind, c[decode], 1):
                    part[0 if kern.compute_bound[0] else 1] += kern.time[0]
            att[kind] = part
        return self._stages(self._stage_token_parts(int(n.sum()), len(n),
                                                    num_decode == len(n)), att)

    def _window_parts(self, c: np.ndarray, k: int) -> list[np.ndarray]:
        """Each stage's (3, k) time for one decode-only micro-batch over k steps."""
        S = len(c)
        att = {kind: _kernel_parts(self.att.decode(kind, c, k), k)
               for kind in self.attention_kinds}
        tok = [t[:, None] for t in self._stage_token_parts(S, S, True)]
        return self._stages(tok, att)

    def _finish(self, layers, S: int, R: int, T: int, head: np.ndarray, send_s,
                kernels: int = 0):
        """(time, compute, memory, comm, host) of a step of ``S`` sequences, ``R`` of them
        new, and ``T`` scheduled tokens, from its layers' and head's parts; in eager mode its
        ``kernels`` launches."""
        compute = head[0] + layers[0]
        memory = head[1] + layers[1]
        comm = head[2] + layers[2] + send_s
        gpu = compute + memory + comm
        host = self._host_time(gpu, self.host.time(S, R, T), kernels)[0]
        return gpu + host, compute, memory, comm, host

    def _host_time(self, gpu, scheduling, kernels: int):
        """(host time the step shows beyond its GPU work, the part of it that is kernel
        launches). The host launches ``kernels`` one by one ahead of the GPU (eager code);
        without an overlap scheduler it schedules first, then launches; with one it
        schedules and launches this step while the GPU runs the last, so only what the two
        together outlast the GPU's work by shows."""
        launch = kernels * self.eager_launch_s
        if self.overlap:
            host = np.maximum(0.0, scheduling + launch - gpu)
            return host, np.minimum(host, launch)
        dispatch = np.maximum(0.0, launch - gpu)
        return scheduling + dispatch, dispatch

    def graph_tokens(self, n: np.ndarray) -> int:
        """The batch size a step's CUDA graph would be captured for: its tokens, or with
        pipeline parallelism its largest micro-batch's (each runs the forward on its own)."""
        if self.pp == 1:
            return int(n.sum())
        return max(int(n[mb].sum()) for mb in micro_batches(len(n), self.pp))

    def launches(self, tokens: int, prefill: bool, decode: bool) -> int:
        """Kernels the host launches one by one in a step of ``tokens`` tokens with prefill
        chunks and/or decode tokens: 0 where it replays a CUDA graph (or runs compiled)."""
        if not self.eager_launch_s or not self.graphs.dispatches(tokens, not prefill):
            return 0
        return self.kernel_launches(prefill, decode)

    def kernel_launches(self, prefill: bool, decode: bool) -> int:
        """Kernels one GPU launches in a step with prefill chunks and/or decode tokens: every
        operator's runs on the busiest stage plus the head's (their counts do not depend on
        the step's size)."""
        key = (bool(prefill), bool(decode))
        prefill, decode = key
        if key not in self._kernels:
            n = np.array([2] * prefill + [1] * decode)
            c = np.array([0] * prefill + [8] * decode)
            self._kernels[key] = sum(op.count for op in self._operators(n, c)[0])
        return self._kernels[key]

    # ---- the CostModel interface ---------------------------------------------------------
    def step_cost(self, new_tokens: np.ndarray, context_tokens: np.ndarray) -> StepCost:
        """Step time and its split by bound (decode-only steps share decode_window's path)."""
        n, c = np.asarray(new_tokens), np.asarray(context_tokens)
        T, S = int(n.sum()), len(n)
        if T == S and c.min() > 0:
            w = self.decode_window(c, 1)
            return StepCost(*(float(a[0]) for a in w))
        if self.pp == 1:
            layers, send_s = self._micro_batch_parts(n, c)[0], 0.0
        else:
            mbs = micro_batches(S, self.pp)
            parts = [[p[:, None] for p in self._micro_batch_parts(n[mb], c[mb])] for mb in mbs]
            layers = makespan(parts, self.pp)[0][:, 0]
            send_s = self._send_time(max(int(n[mb].sum()) for mb in mbs))
        kernels = self.launches(self.graph_tokens(n), True, bool(((n == 1) & (c > 0)).any())
                                ) if self.eager_launch_s else 0
        return StepCost(*(float(a) for a in self._finish(layers, S, new_requests(c), T,
                                                         self._head(T, S), send_s, kernels)))

    def decode_window(self, context_tokens: np.ndarray, k: int):
        """Costs of ``k`` consecutive decode-only steps of the same sequences.

        Each step every sequence adds one token, so step j sees ``context_tokens + j`` cached
        tokens (capped at the window on sliding layers, ignored on linear ones). Returns
        arrays (time, compute, memory, comm, host) of length k.
        """
        c = np.asarray(context_tokens)
        S = len(c)
        if self.pp == 1:
            layers, send_s = self._window_parts(c, k)[0], 0.0
        else:
            mbs = micro_batches(S, self.pp)
            layers = makespan([self._window_parts(c[mb], k) for mb in mbs], self.pp)[0]
            send_s = self._send_time(len(c[mbs[0]]))
        kernels = self.launches(S if self.pp == 1 else max(len(c[mb]) for mb in mbs), False,
                                True) if self.eager_launch_s else 0
        time, compute, memory, comm, host = self._finish(layers, S, 0, S, self._head(S, S),
                                                         send_s, kernels)
        return time, compute, memory, comm, np.broadcast_to(host, (k,)).astype(float)

    def breakdown(self, new_tokens: np.ndarray, context_tokens: np.ndarray) -> list[OperatorCost]:
        """Every operator of the step on one GPU of the busiest pipeline stage, plus the
        pipeline's sends and bubble (its idle time) and the host overhead, as pseudo-operators;
        their times add up to ``step_cost``."""
        n, c = np.asarray(new_tokens), np.asarray(context_tokens)
        ops, mbs = self._operators(n, c)
        step = self.step_cost(n, c)
        if self.pp > 1:
            ops += merge(send_ops(self.p, self.hw, self.tp, self.pp,
                                  max(int(n[mb].sum()) for mb in mbs), self.g.hidden))
            split = np.array([step.compute_s, step.memory_s, step.comm_s]) - bound_parts(ops)
            bound = ("compute", "memory", "comm")[int(np.argmax(split))]
            ops.append(OperatorCost("pp_bubble", 1, 0.0, 0.0, float(split.sum()), bound))
        decode = (n == 1) & (c > 0)
        kernels = self.launches(self.graph_tokens(n), not decode.all(), bool(decode.any()))
        dispatch = float(self._host_time(step.compute_s + step.memory_s + step.comm_s,
                                         self.host.time(len(n), new_requests(c),
                                                        int(n.sum())), kernels)[1])
        if dispatch:
            ops.append(OperatorCost("eager.host_dispatch", 1, 0.0, 0.0, dispatch, "host"))
        return ops + [OperatorCost("host_overhead", 1, 0.0, 0.0, step.host_s - dispatch,
                                   "host")]

    def _operators(self, n: np.ndarray, c: np.ndarray):
        """The step's operators on one GPU of the busiest pipeline stage, with the head's
        (merged by name), and the micro-batches."""
        T, S = int(n.sum()), len(n)
        mbs = micro_batches(S, self.pp)
        per_stage = [[] for _ in self.stages]
        for mb in mbs:
            decode = bool(((n[mb] == 1) & (c[mb] > 0)).all())
            padded = self.graphs.padded(int(n[mb].sum()), decode)
            tok = layer_token_ops(self.p, self.g, self.hw, padded, len(n[mb]))
            att = {kind: self._attention_ops(kind, n[mb], c[mb]) for kind in self.attention_kinds}
            for s, counts in enumerate(self.stages):
                for kind in ATTENTION_KINDS + FFN_KINDS:
                    if counts.of(kind):
                        ops = tok[kind] + att.get(kind, [])
                        per_stage[s] += [op.scaled(counts.of(kind)) for op in ops]
        busiest = max(per_stage, key=lambda ops: sum(op.time_s for op in ops))
        pre, post = head_ops(self.p, self.g, self.hw, T, S)
        return merge(pre + busiest + post), mbs
