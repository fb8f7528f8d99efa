"""The one interface the replica sees: batch shape in, step time (and its breakdown) out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

BOUNDS = ("compute", "memory", "comm", "host")


@dataclass(frozen=True)
class StepCost:
    """Time of one engine step, split by what bound each part of it."""

    time_s: float
    compute_s: float = 0.0
    memory_s: float = 0.0
    comm_s: float = 0.0
    host_s: float = 0.0

    @property
    def bound(self) -> str:
        """The resource that takes the largest share of this step."""
        parts = (self.compute_s, self.memory_s, self.comm_s, self.host_s)
        return BOUNDS[int(np.argmax(parts))]


@dataclass(frozen=True)
class OperatorCost:
    """One operator of a step on the roofline: work, traffic, intensity, binding roof, time.

    ``count`` is how many times it runs per step (e.g. once per layer); ``flops``, ``bytes``
    and ``time_s`` are totals over those runs, per GPU. ``dtype`` is the math dtype whose peak
    it runs against ("" where no FLOPs count: memory-only kernels and communication). Priced
    at many token counts at once (``sim.cost.pricing``), ``flops``, ``bytes`` and ``time_s``
    are arrays over the counts and ``bound`` is one name or an array of them.
    """

    name: str
    count: int
    flops: float
    bytes: float
    time_s: float
    bound: str
    dtype: str = ""

    def scaled(self, n: float) -> OperatorCost:
        """The same operator run ``n`` times as often (e.g. once in each of ``n`` layers)."""
        return OperatorCost(self.name, int(round(self.count * n)), self.flops * n,
                            self.bytes * n, self.time_s * n, self.bound, self.dtype)

    @property
    def intensity(self) -> float:
        """Arithmetic intensity in FLOP per byte moved."""
        return self.flops / self.bytes if self.bytes else float("inf")


class CostModel(Protocol):
    """What a replica needs from a cost model.

    A batch shape is two aligned integer arrays, one entry per scheduled sequence:
    ``new_tokens`` (tokens computed this step: a prefill chunk, or 1 in decode) and
    ``context_tokens`` (tokens already in that sequence's KV cache).
    """

    def step_cost(self, new_tokens: np.ndarray, context_tokens: np.ndarray) -> StepCost:
        """Time of one step and its split by bound."""
        ...

    def breakdown(self, new_tokens: np.ndarray, context_tokens: np.ndarray) -> list[OperatorCost]:
        """Every operator of the step with its roofline numbers."""
        ...

    def decode_window(self, context_tokens: np.ndarray, k: int) -> tuple[np.ndarray, ...]:
        """(time, compute, memory, comm, host) arrays of k decode-only steps of one batch,
        each sequence one token longer per step; step j must equal ``step_cost`` of it."""
        ...
