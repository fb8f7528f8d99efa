"""A cost model where every step takes the same time: for tests and queueing-theory checks."""

from __future__ import annotations

import numpy as np

from sim.cost.base import OperatorCost, StepCost


class ConstantCostModel:
    """Each step takes ``step_time_s`` whatever the batch (an M/D/1 server when batch = 1)."""

    def __init__(self, step_time_s: float) -> None:
        self._cost = StepCost(time_s=step_time_s, host_s=step_time_s)

    def step_cost(self, new_tokens: np.ndarray, context_tokens: np.ndarray) -> StepCost:
        """Always the configured time."""
        return self._cost

    def breakdown(self, new_tokens: np.ndarray, context_tokens: np.ndarray) -> list[OperatorCost]:
        """One pseudo-operator holding the whole step."""
        return [OperatorCost("constant_step", 1, 0.0, 0.0, self._cost.time_s, "host")]

    def decode_window(self, context_tokens: np.ndarray, k: int):
        """``k`` identical steps (time, compute, memory, comm, host arrays)."""
        c = self._cost
        z = np.zeros(k)
        return np.full(k, c.time_s), z, z.copy(), z.copy(), np.full(k, c.host_s)
