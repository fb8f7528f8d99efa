"""Schema and checks of ``backend=``: the serving engine whose kernels the costs imitate.

The same model on the same GPU runs at different speeds under vLLM, SGLang and TensorRT-LLM
(different kernels, host overheads and API servers), so the calibrated parameters are per
(``hardware.calibration``, ``backend.name``): ``sim/cost/calibrated/<hardware>/<backend>.yaml``.
``backend.frontend`` is the engine's API server (``sim.engine.frontend``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.errors import ConfigError

BACKENDS = ("vllm", "sglang", "trtllm")
ADMISSIONS = ("fifo", "interleaved")  # the API server's admission disciplines (sim.engine.frontend)
STREAMINGS = ("shared", "own_process")  # which process streams tokens (sim.engine.frontend)
# how each engine's API server takes in a burst and which process streams its tokens, read
# from its source (docs/fidelity.md, "The frontend")
ENGINE_FRONTEND = {"vllm": {"admission": "interleaved", "streaming": "shared"},
                   "sglang": {"admission": "fifo", "streaming": "own_process"},
                   "trtllm": {"admission": "interleaved", "streaming": "shared"}}
FRONTEND_CHOICES = {"admission": ADMISSIONS, "streaming": STREAMINGS}


def frontend_discipline(backend: str | None, calibrated: dict, given=None) -> dict[str, str]:
    """How ``backend``'s API server admits requests and streams tokens: each of
    ``FRONTEND_CHOICES`` from ``given`` (``backend.frontend``) where set, else from the
    calibrated file's ``frontend:`` block (``calibrated``, what its costs were fitted under),
    else the engine's (``ENGINE_FRONTEND``; backend None: fifo, shared). A calibrated file's
    bad value is one error."""
    out = {}
    for key, allowed in FRONTEND_CHOICES.items():
        value = getattr(given, key, None)
        if value is None:
            value = calibrated.get(key, ENGINE_FRONTEND.get(backend, {}).get(key, allowed[0]))
            if value not in allowed:
                raise ConfigError(f"frontend.{key} of the calibrated file", value,
                                  f"one of {list(allowed)}")
        out[key] = value
    return out


@dataclass
class FrontendConfig:
    """The API server's costs (``sim.engine.frontend``); None: the calibrated file's ``frontend:``
    block (0 under ``cost_model=constant`` or where the file has none)."""

    per_request_ms: float | None = None  # HTTP handling and request set-up, per request
    per_prompt_token_us: float | None = None  # tokenization, per prompt token
    per_output_token_us: float | None = None  # detokenize and stream, per streamed token
    latency_ms: float | None = None  # the request path's fixed delay (no server time)
    # fifo: one request after another; interleaved: one instant's arrivals admitted together,
    # as an asyncio API server does (sim.engine.frontend); null: the calibrated file's, else the
    # engine's (ENGINE_FRONTEND)
    admission: str | None = None
    # shared: the API server that admits requests also detokenizes and streams (vLLM,
    # TensorRT-LLM); own_process: a process of its own does (SGLang's DetokenizerManager), so
    # admissions and streamed tokens do not queue behind each other; null: as admission
    streaming: str | None = None


@dataclass
class BackendConfig:
    """Which engine's measured kernels, host overheads and frontend the run uses."""

    name: str = "vllm"
    frontend: FrontendConfig = field(default_factory=FrontendConfig)
    # no CUDA graphs (vLLM's --enforce-eager, SGLang's --disable-cuda-graph): nothing padded,
    # and every kernel is dispatched by the host (sim/cost/eager.py)
    enforce_eager: bool = False
    # host dispatch time per kernel launch of a step that runs eager (enforce_eager, or no
    # captured graph where the engine's model code runs eager: sim/cost/cuda_graphs.py), µs;
    # null: the calibrated value (sim/cost/calibrated/<hardware.calibration>/kernels/execution.yaml)
    eager_launch_us: float | None = None
    # vLLM's --async-scheduling: the next step is scheduled while the GPU runs this one, so
    # a step takes max(GPU, host) instead of GPU + host
    async_scheduling: bool = False
    # SGLang's --cuda-graph-max-bs; null: its default (sim/cost/cuda_graphs.py)
    cuda_graph_max_bs: int | None = None
    # the batch sizes the engine captures CUDA graphs for (vLLM's --cudagraph-capture-sizes,
    # SGLang's --cuda-graph-bs, TensorRT-LLM's cuda_graph_config.batch_sizes); null: its
    # default list (sim/cost/cuda_graphs.py)
    cuda_graph_batch_sizes: list[int] | None = None
    # the engine schedules each step while the one before it runs (TensorRT-LLM's overlap
    # scheduler, SGLang's overlap schedule, vLLM's --async-scheduling), so a request arriving
    # mid-step joins the step after next (sim.engine.replica); null: the engine's default
    # (``overlaps``)
    overlap_scheduler: bool | None = None


def overlaps(b: BackendConfig, pipeline_parallel_size: int = 1) -> bool:
    """Whether the engine schedules a step while the one before it runs: by default
    TensorRT-LLM (``disable_overlap_scheduler`` defaults to False, ``llmapi/llm_args.py``),
    SGLang (``disable_overlap_schedule`` False, ``Scheduler.event_loop_overlap``) and vLLM with
    ``async_scheduling`` (``EngineCore.step_with_batch_queue``); none of them with pipeline
    parallelism (SGLang and vLLM turn it off or refuse it; TensorRT-LLM runs its own
    pipelined loop)."""
    value = getattr(b, "overlap_scheduler", None)
    if value is not None:
        return bool(value)
    if pipeline_parallel_size > 1:
        return False
    return b.name in ("trtllm", "sglang") or (
        b.name == "vllm" and bool(getattr(b, "async_scheduling", False)))


def check_backend(b: BackendConfig) -> None:
    """The backend must be one the project has calibration tables for; frontend costs >= 0."""
    if b.name not in BACKENDS:
        raise ConfigError("backend.name", b.name, f"one of {list(BACKENDS)}")
    max_bs = getattr(b, "cuda_graph_max_bs", None)
    if max_bs is not None and max_bs < 1:
        raise ConfigError("backend.cuda_graph_max_bs", max_bs, "null (the default) or >= 1")
    sizes = getattr(b, "cuda_graph_batch_sizes", None)
    if sizes is not None and (not len(sizes) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in sizes)):
        raise ConfigError("backend.cuda_graph_batch_sizes", list(sizes),
                          "null (the engine's default list) or a non-empty list of integers >= 1")
    launch = getattr(b, "eager_launch_us", None)
    if launch is not None and not (launch >= 0 and launch < float("inf")):
        raise ConfigError("backend.eager_launch_us", launch, "a finite number >= 0 or null")
    frontend = getattr(b, "frontend", None)
    for key in ("per_request_ms", "per_prompt_token_us", "per_output_token_us", "latency_ms"):
        value = getattr(frontend, key, None)
        if value is not None and not (value >= 0 and value < float("inf")):
            raise ConfigError(f"backend.frontend.{key}", value, "a finite number >= 0 or null")
    for key, allowed in FRONTEND_CHOICES.items():
        value = getattr(frontend, key, None)
        if value is not None and value not in allowed:
            raise ConfigError(f"backend.frontend.{key}", value,
                              f"null (the calibrated file's) or one of {list(allowed)}")


# (group, schema name, dataclass) registered with Hydra by ``conf.schema``
SCHEMAS = [
    ("backend", "base_backend", BackendConfig),
]
