"""The engine's per-step CPU time: scheduling and input preparation the GPU does not overlap.

Each step of an engine runs host code before (and, without async scheduling, instead of) its
GPU work. What that code touches decides its cost, read from vLLM 0.11's V1 engine:

- a fixed part: ``Scheduler.schedule`` and ``update_from_output``, the model runner's
  ``execute_model`` set-up and sampling bookkeeping, the worker hand-off;
- per sequence in the step: the scheduler's loop over running requests
  (``allocate_slots``), the batch's block-table and sampling-metadata rows, each
  sequence's output row (``ModelRunnerOutput``);
- per new request (a request whose prompt starts in this step, or restarts after a
  recompute preemption): its ``NewRequestData`` built by the scheduler and sent to the
  worker, its ``CachedRequestState`` and ``InputBatch.add_request`` (which copies the
  prompt's token ids into the persistent batch);
- per scheduled token: ``GPUModelRunner._prepare_inputs`` (positions, token indices and
  slot mapping computed per token on the CPU, then copied to the GPU).

SGLang's ``Scheduler.get_next_batch_to_run`` / ``ScheduleBatch.prepare_for_extend`` and
TensorRT-LLM's executor loop do the same kinds of work. The four coefficients are fitted per
backend and GPU (``python -m calibration validate fit_host=true``) into the ``host:`` block of
``sim/cost/calibrated/<hardware>/<backend>.yaml``; a block without a key prices it at 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# the host block's keys, in the units the calibrated files and config overrides use
KEYS = ("overhead_ms", "per_seq_us", "per_new_request_us", "per_token_us")
SCALE = {"overhead_ms": 1e-3, "per_seq_us": 1e-6, "per_new_request_us": 1e-6,
         "per_token_us": 1e-6}


@dataclass(frozen=True)
class HostCosts:
    """Seconds of host time per step, per sequence, per new request and per scheduled token."""

    overhead_s: float = 0.0
    per_seq_s: float = 0.0
    per_new_request_s: float = 0.0
    per_token_s: float = 0.0

    @classmethod
    def from_units(cls, overhead_ms: float = 0.0, per_seq_us: float = 0.0,
                   per_new_request_us: float = 0.0, per_token_us: float = 0.0) -> HostCosts:
        """From the calibrated file's units (``KEYS``)."""
        return cls(overhead_ms * 1e-3, per_seq_us * 1e-6, per_new_request_us * 1e-6,
                   per_token_us * 1e-6)

    def units(self) -> dict[str, float]:
        """The four coefficients in the calibrated file's units (``KEYS``)."""
        return {k: float(v) / SCALE[k] for k, v in zip(KEYS, self.vector(), strict=True)}

    def vector(self) -> np.ndarray:
        """(overhead, per sequence, per new request, per token), seconds."""
        return np.array([self.overhead_s, self.per_seq_s, self.per_new_request_s,
                         self.per_token_s])

    def time(self, seqs, new_requests, tokens):
        """Host seconds of a step of ``seqs`` sequences, ``new_requests`` of them new, and
        ``tokens`` scheduled tokens (scalars or arrays)."""
        return (self.overhead_s + self.per_seq_s * seqs + self.per_new_request_s * new_requests
                + self.per_token_s * tokens)


def new_requests(context_tokens: np.ndarray) -> int:
    """Sequences of a step whose prompt starts in it: chunks with no context before them (a
    prompt whose first chunk hits the prefix cache counts as continuing: its state is built
    from cached blocks, an approximation that only matters with prefix caching)."""
    return int(np.count_nonzero(np.asarray(context_tokens) == 0))
