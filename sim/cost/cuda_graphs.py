"""CUDA graphs: which steps replay a captured graph, and at what padded size.

An engine captures its model's forward pass once per batch size of a capture list; a step
whose size is not in the list runs the graph of the next larger size, on padding tokens that
compute for nothing. So such a step's token-count operators (projections, MLP/MoE, norms,
all-reduces) cost what the padded size costs. Read from the engines' source:

- **vLLM** 0.10.2/0.11.0 (``VllmConfig._set_cudagraph_sizes``): ``[1, 2, 4] + range(8,
  min(2 · max_num_seqs, 512) + 1, 8)``, sizes above ``max_num_batched_tokens`` dropped;
  ``_get_num_input_tokens`` pads *every* step (prefill, mixed or decode) whose scheduled
  tokens are at most the largest size (decode-only steps replay full graphs, the others
  piecewise ones); larger steps run unpadded.
- **SGLang** 0.5.3–0.5.5 (``server_args._generate_cuda_graph_batch_sizes``): ``[1, 2, 4, 8,
  12] + range(16, 257, 8) + range(272, 512, 16) + range(512, max_bs + 1, 32)`` up to
  ``cuda_graph_max_bs`` (256 below TP 4 on 60–160 GiB GPUs, else 512); only decode steps
  run graphs (``ForwardMode.is_cuda_graph``), padded by ``bisect_left``.
- **TensorRT-LLM** 1.0–1.2 (``llmapi/llm_args.py``: ``cuda_graph_config`` defaults to
  ``CudaGraphConfig()``, ``max_batch_size`` 0 → 128, ``_generate_cuda_graph_batch_sizes``):
  ``range(1, 32) + [32, 64, 128]``, graphs "only for batches that consist of decoding requests
  *only*", and ``enable_padding`` off: a decode batch of another size runs without a graph,
  unpadded.

A step that replays no graph runs the model's Python code. TensorRT-LLM's PyTorch model and
SGLang's (its prefill and mixed steps always, decode steps above ``cuda_graph_max_bs``)
dispatch every kernel from the host one by one (``eager``: the step takes at least its
launches × the per-launch host time, ``sim.cost.eager``); vLLM's steps above its largest size
run torch.compile'd code, whose launches are not priced. ``backend.cuda_graph_batch_sizes``
replaces the default list (vLLM's ``--cudagraph-capture-sizes``, SGLang's ``--cuda-graph-bs``,
TensorRT-LLM's ``cuda_graph_config.batch_sizes``).

``backend.enforce_eager`` (vLLM's ``--enforce-eager``, SGLang's ``--disable-cuda-graph``)
captures nothing: no step is padded and every step dispatches its kernels.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass


@dataclass(frozen=True)
class CudaGraphs:
    """The capture sizes of one replica (ascending; empty: none), whether only decode-only
    steps replay them, whether a step between two sizes replays the larger one (``pad``) or
    runs without a graph, and whether a step without a graph dispatches its kernels one by
    one from the host (``eager``; module doc)."""

    sizes: tuple[int, ...] = ()
    decode_only: bool = False
    pad: bool = True
    eager: bool = False

    def graph_size(self, tokens: int, decode_step: bool) -> int | None:
        """The captured size a step of ``tokens`` tokens replays; None: it runs no graph."""
        if not self.sizes or tokens > self.sizes[-1] or (self.decode_only and not decode_step):
            return None
        size = self.sizes[bisect.bisect_left(self.sizes, tokens)]
        return size if self.pad or size == tokens else None

    def padded(self, tokens: int, decode_step: bool) -> int:
        """The size a step of ``tokens`` tokens runs at."""
        size = self.graph_size(tokens, decode_step)
        return tokens if size is None else size

    def dispatches(self, tokens: int, decode_step: bool) -> bool:
        """Whether the host launches the step's kernels one by one."""
        return self.eager and self.graph_size(tokens, decode_step) is None


TRTLLM_SIZES = (*range(1, 32), 32, 64, 128)  # CudaGraphConfig's, enable_padding off
EAGER_MODEL_CODE = ("sglang", "trtllm")  # backends whose steps without a graph run eager


def runs_eager_code(backend: str, enforce_eager: bool = False) -> bool:
    """Whether some steps of ``backend`` launch their kernels one by one (module doc)."""
    return enforce_eager or backend in EAGER_MODEL_CODE


def capture_sizes(backend: str, max_num_seqs: int, max_num_batched_tokens: int, tp: int,
                  enforce_eager: bool = False, cuda_graph_max_bs: int | None = None,
                  batch_sizes=None) -> CudaGraphs:
    """The engine's capture list (module doc) for this replica's limits; ``batch_sizes``
    (``backend.cuda_graph_batch_sizes``) replaces its default sizes."""
    given = tuple(sorted({int(v) for v in batch_sizes})) if batch_sizes else None
    if enforce_eager:
        return CudaGraphs(eager=runs_eager_code(backend, enforce_eager))
    if backend == "vllm":
        top = min(2 * max_num_seqs, 512)
        # sizes above the step's token budget are dropped, given or default
        sizes = [s for s in (given or [1, 2, 4, *range(8, top + 1, 8)])
                 if s <= max_num_batched_tokens]
        return CudaGraphs(tuple(sizes))
    if backend == "sglang":
        max_bs = cuda_graph_max_bs or (256 if tp < 4 else 512)
        default = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16),
                   *range(512, max_bs + 1, 32)]
        sizes = given or tuple(s for s in default if s <= max_bs)
        return CudaGraphs(sizes, decode_only=True, eager=runs_eager_code(backend))
    return CudaGraphs(given or TRTLLM_SIZES, decode_only=True, pad=False,
                      eager=runs_eager_code(backend))
