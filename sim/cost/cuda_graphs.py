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
- **TensorRT-LLM** (``CudaGraphConfig``): ``enable_padding`` is off by default, so a batch
  runs a graph only at a captured size and is never padded.

``backend.enforce_eager`` (vLLM's ``--enforce-eager``, SGLang's ``--disable-cuda-graph``)
captures nothing: no step is padded.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass


@dataclass(frozen=True)
class CudaGraphs:
    """The capture sizes of one replica (ascending; empty: no padding) and whether only
    decode-only steps replay them."""

    sizes: tuple[int, ...] = ()
    decode_only: bool = False

    def padded(self, tokens: int, decode_step: bool) -> int:
        """The size a step of ``tokens`` tokens runs at."""
        if not self.sizes or tokens > self.sizes[-1] or (self.decode_only and not decode_step):
            return tokens
        return self.sizes[bisect.bisect_left(self.sizes, tokens)]


def capture_sizes(backend: str, max_num_seqs: int, max_num_batched_tokens: int, tp: int,
                  enforce_eager: bool = False, cuda_graph_max_bs: int | None = None
                  ) -> CudaGraphs:
    """The engine's default capture list (module doc) for this replica's limits."""
    if enforce_eager:
        return CudaGraphs()
    if backend == "vllm":
        top = min(2 * max_num_seqs, 512)
        sizes = [s for s in [1, 2, 4, *range(8, top + 1, 8)] if s <= max_num_batched_tokens]
        return CudaGraphs(tuple(sizes))
    if backend == "sglang":
        max_bs = cuda_graph_max_bs or (256 if tp < 4 else 512)
        sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16),
                 *range(512, max_bs + 1, 32)]
        return CudaGraphs(tuple(s for s in sizes if s <= max_bs), decode_only=True)
    return CudaGraphs()
