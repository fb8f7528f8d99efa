"""The serving frontend: the API server between the clients and one replica's engine.

A request does not reach the engine when the client sends it, and a token does not reach the
client when the engine samples it. Both pass the replica's API server process:

- on the way in, HTTP handling and tokenization (vLLM: the API server's serving layer and
  ``AsyncLLM.add_request`` → ``Processor.process_inputs``, before the request is sent to the
  engine-core process; SGLang: ``TokenizerManager``): a fixed part plus a part per prompt
  token;
- on the way out, every step's new tokens are detokenized and streamed as server-sent events
  (vLLM: the ``output_handler`` loop → ``OutputProcessor.process_outputs``; SGLang: the
  detokenizer and the tokenizer manager's streaming): a part per streamed token.

Where one process does both (``streaming: shared``: vLLM, whose ``vllm serve`` starts one API
server by default, ``--api-server-count 1``; ``trtllm-serve``, whose ``num_postprocess_workers``
is 0 by default), it is one server: a burst of 1,000 requests queues there before the engine
sees them, and while it streams 1,000 running requests' tokens it admits new ones more
slowly. Where a process of its own detokenizes (``streaming: own_process``: SGLang's
``DetokenizerManager``, started beside the ``TokenizerManager`` by ``launch_server``), the
tokens of a step are streamed by that server, and admissions and streaming do not queue
behind each other: the first token of a burst's early request reaches its client while the
burst's later requests are still being tokenized. Its time adds to TTFT, ITL and end-to-end
latency without taking engine time (the engine core runs in its own process).
``latency_ms`` is the request path's fixed delay that occupies no server
(the hops between the HTTP layer, the API server and the engine core).

How a burst passes it is the ``admission`` discipline (docs/fidelity.md, "The frontend"):

- ``fifo`` (SGLang): one request's admission after another; the first of a burst reaches the
  engine after one admission time, the last after all of them. SGLang's
  ``TokenizerManager.generate_request`` tokenizes and sends to the scheduler without
  suspending, once the response's task has started.
- ``interleaved`` (vLLM, TensorRT-LLM): the requests that reach the server at one instant are
  admitted together and reach the engine together, when the server has done all of their
  admission work. An asyncio API server does this when a request's admission suspends on its
  way (vLLM's ``OpenAIServingCompletion.create_completion`` awaits the prompt's rendering
  and its tokenization in ``AsyncMicrobatchTokenizer``; ``trtllm-serve`` awaits
  ``asyncio.to_thread(input_processor, …)``): the event loop resumes ready coroutines in the
  order they became ready, so each of a burst's requests takes its next turn only after every
  other request has taken its current one. None reaches the engine until nearly all of them
  have been tokenized, and the engine then sees the whole burst at once: it fills its first
  steps with full token budgets instead of a trickle of admissions. Requests that arrive at
  different instants are admitted one group after another (groups of one: as ``fifo``).

Each replica has its own frontend (a deployment of N replicas runs N API servers). The costs
are per backend, fitted on measured ``vllm bench serve`` runs (the calibrated file's
``frontend:`` block; ``backend.frontend.*`` overrides them). With every cost 0 the frontend is
a wire and nothing changes. The SimPy engine calls ``FrontendServer``; the compiled loop
(``sim.compiled.kernel``) does the same sums on the same arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.config.backend import FRONTEND_CHOICES

FRONTEND_KEYS = ("per_request_ms", "per_prompt_token_us", "per_output_token_us", "latency_ms")


@dataclass(frozen=True)
class FrontendCosts:
    """The API server's time per request (fixed and per prompt token) and per streamed
    token, and the request path's fixed delay, in seconds."""

    per_request_s: float = 0.0
    per_prompt_token_s: float = 0.0
    per_output_token_s: float = 0.0
    latency_s: float = 0.0
    # the requests that arrive at one instant are admitted together (module docstring)
    interleaved: bool = False
    # a process of its own detokenizes and streams (module docstring)
    own_stream_process: bool = False

    @property
    def is_wire(self) -> bool:
        """Whether the frontend costs nothing (requests and tokens pass at once)."""
        return not (self.per_request_s or self.per_prompt_token_s or self.per_output_token_s
                    or self.latency_s)

    def as_dict(self) -> dict[str, float | str]:
        """The costs in the units of the config and the calibrated file, the admission
        discipline and which process streams."""
        return {"per_request_ms": self.per_request_s * 1e3,
                "per_prompt_token_us": self.per_prompt_token_s * 1e6,
                "per_output_token_us": self.per_output_token_s * 1e6,
                "latency_ms": self.latency_s * 1e3,
                "admission": "interleaved" if self.interleaved else "fifo",
                "streaming": "own_process" if self.own_stream_process else "shared"}

    @classmethod
    def from_units(cls, per_request_ms: float = 0.0, per_prompt_token_us: float = 0.0,
                   per_output_token_us: float = 0.0, latency_ms: float = 0.0,
                   admission: str = "fifo", streaming: str = "shared") -> FrontendCosts:
        """From the config's units (ms, µs per prompt token, µs per output token, ms),
        admission discipline (``fifo`` or ``interleaved``) and streaming process (``shared``
        or ``own_process``)."""
        for key, value in (("admission", admission), ("streaming", streaming)):
            if value not in FRONTEND_CHOICES[key]:
                raise ValueError(f"frontend {key} {value!r}: one of "
                                 f"{list(FRONTEND_CHOICES[key])}")
        return cls(per_request_ms * 1e-3, per_prompt_token_us * 1e-6,
                   per_output_token_us * 1e-6, latency_ms * 1e-3, admission == "interleaved",
                   streaming == "own_process")

    def service_times(self, prompt_tokens: np.ndarray) -> np.ndarray:
        """The API server's time to take in each request (s)."""
        return self.per_request_s + self.per_prompt_token_s * np.asarray(prompt_tokens,
                                                                         np.float64)


class FrontendServer:
    """One replica's API server: its admissions (one by one, or one instant's arrivals
    together) and step outputs, each server's jobs in time order (one server, or a streaming
    process of its own beside it)."""

    def __init__(self, costs: FrontendCosts, service_s: np.ndarray,
                 engine_arrival: np.ndarray) -> None:
        """``service_s``: each request's admission time (``FrontendCosts.service_times``);
        ``engine_arrival``: the run's column of when requests reach an engine (filled here)."""
        self.costs, self.service_s, self.engine_arrival = costs, service_s, engine_arrival
        self.free_at = 0.0  # when the server finishes what it has been given so far
        # when the streaming process does (the same server unless it has its own)
        self.stream_free_at = 0.0
        self.group: list[int] = []  # interleaved: this instant's arrivals, not yet admitted
        self.group_work = 0.0  # their admission times, summed in arrival order

    def admit(self, rid: int, now: float) -> float:
        """Request ``rid`` is sent at ``now`` (``fifo``): when it reaches the engine."""
        done = max(now, self.free_at) + self.service_s[rid]
        self.free_at = done
        at = done + self.costs.latency_s
        self.engine_arrival[rid] = at
        return at

    def join(self, rid: int) -> bool:
        """Request ``rid`` is sent now (``interleaved``): it joins this instant's group;
        whether it opened the group (then the caller closes it once this instant's other
        arrivals have joined: ``admit_group``)."""
        self.group.append(rid)
        self.group_work += self.service_s[rid]
        return len(self.group) == 1

    def drop_group(self) -> None:
        """Forget the group not yet admitted (its replica failed: the requests go elsewhere)."""
        self.group, self.group_work = [], 0.0

    def admit_group(self, now: float) -> tuple[list[int], float]:
        """Admit the group that arrived at ``now``: its requests, in arrival order, and when
        all of them reach the engine."""
        members, work = self.group, self.group_work
        self.group, self.group_work = [], 0.0
        done = max(now, self.free_at) + work
        self.free_at = done
        at = done + self.costs.latency_s
        self.engine_arrival[members] = at
        return members, at

    def stream(self, now: float, tokens: int) -> float:
        """A step ending at ``now`` sampled ``tokens`` tokens: when the clients see them."""
        if not tokens:
            return now
        if self.costs.own_stream_process:
            done = max(now, self.stream_free_at) + self.costs.per_output_token_s * tokens
            self.stream_free_at = done
            return done
        done = max(now, self.free_at) + self.costs.per_output_token_s * tokens
        self.free_at = done
        return done

    @property
    def busy_until(self) -> float:
        """When the server, and its streaming process if it has one, finish what they have
        been given so far."""
        return max(self.free_at, self.stream_free_at)
