"""What runs around one engine step, for ``python -m sim.explain``: whether the step replays a
captured CUDA graph or the host launches its kernels one by one (``sim.cost.cuda_graphs``),
and what the replica's API server adds (``sim.engine.frontend``)."""

from __future__ import annotations

import numpy as np

from sim.builders import build_frontend_costs
from sim.cost import RooflineCostModel


def cuda_graph_line(model, new: np.ndarray, ctx: np.ndarray) -> str:
    """What the step runs as: the captured CUDA graph it replays (at which size), or no graph
    and the kernels the host then launches one by one (``sim.cost.cuda_graphs``); empty for a
    cost model without graphs."""
    if not isinstance(model, RooflineCostModel):
        return ""
    decode = (new == 1) & (ctx > 0)
    tokens = model.graph_tokens(new)
    size = model.graphs.graph_size(tokens, bool(decode.all()))
    if size is not None:
        padded = f" (padded from {tokens})" if size != tokens else ""
        return f"CUDA graph: replays the one captured for {size} tokens{padded}"
    kernels = model.launches(tokens, not decode.all(), bool(decode.any()))
    if kernels:
        return (f"CUDA graph: none for this step; the host launches its {kernels} kernels one "
                f"by one, {kernels * model.eager_launch_s * 1e3:.2f} ms (eager.host_dispatch: "
                "what outlasts the GPU's work)")
    if model.graphs.eager:
        return ("CUDA graph: none for this step; its kernel launches are not priced (no "
                "launch time for this GPU: backend.eager_launch_us)")
    return "CUDA graph: none for this step; it runs compiled code (launches not priced)"


def frontend_line(cfg, sequences: int) -> str:
    """What the replica's API server adds around the engine (``sim.engine.frontend``): each
    request's admission and path to the engine, and each streamed token, with the time to
    stream one token of each of this step's ``sequences`` (at most: a prefill chunk that does
    not end its prompt samples none); empty where it costs nothing."""
    fe = build_frontend_costs(cfg)
    if fe.is_wire:
        return ""
    admission = ("one instant's arrivals together" if fe.interleaved else
                 "one after another")
    streamer = ("a process of its own" if fe.own_stream_process else
                "the same server, so streaming and admissions queue behind each other")
    return (f"API server: {fe.per_request_s * 1e3:.2f} ms + {fe.per_prompt_token_s * 1e6:.2f} "
            f"us per prompt token to admit a request ({admission}), "
            f"{fe.latency_s * 1e3:.1f} ms more to reach the engine; "
            f"{fe.per_output_token_s * 1e6:.0f} us per streamed token in {streamer} "
            f"(up to {sequences * fe.per_output_token_s * 1e3:.2f} ms for one token of each "
            f"of this step's {sequences} sequences)")
