"""Timing of one kernel: warm-up, then repeated samples; statistics of the samples.

A kernel is a callable ``fn(i)`` that launches one call on operand copy ``i`` (the caller
cycles copies to keep the cache cold). A timer returns per-call seconds, one value per sample:
on a GPU each sample is a CUDA-graph replay of ``calls`` back-to-back launches timed with CUDA
events (plain event-timed launches when capture fails); on a CPU, ``time.perf_counter``.
Only :class:`CudaTimer` needs torch, and imports it when built.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from calibration.profile.shapes import calls_per_sample

Kernel = Callable[[int], object]


@dataclass(frozen=True)
class TimingConfig:
    """How hard to time each kernel: eager warm-up calls, samples, calls per sample bounds."""

    warmup: int = 3
    repeats: int = 10
    min_sample_s: float = 5e-4
    max_calls: int = 100
    fixed_calls: int | None = None  # same on every rank of a collective; else from an estimate


@dataclass(frozen=True)
class Measurement:
    """Per-call seconds of each sample, how they were taken and how many calls each spans."""

    samples_s: np.ndarray
    method: str
    calls: int

    def stats(self) -> dict:
        """Row columns in milliseconds: ``latency`` is the mean (as aiconfigurator's tables),
        with the median, minimum and standard deviation over samples beside it."""
        ms = np.asarray(self.samples_s, dtype=np.float64) * 1e3
        if ms.size == 0 or not np.all(np.isfinite(ms)) or np.any(ms <= 0):
            raise ValueError(f"invalid timing samples {ms!r}")
        return {
            "latency": float(ms.mean()),
            "latency_median": float(np.median(ms)),
            "latency_min": float(ms.min()),
            "latency_std": float(ms.std(ddof=1)) if ms.size > 1 else 0.0,
            "num_samples": int(ms.size),
            "calls_per_sample": int(self.calls),
            "timing": self.method,
        }


class WallClockTimer:
    """perf_counter timing for the CPU: each call runs synchronously, so the wall clock is the
    kernel's time (plus Python's call overhead, which a CPU smoke test does not care about)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock

    def measure(self, kernel: Kernel, cfg: TimingConfig) -> Measurement:
        """Warm up, estimate one call, then ``repeats`` samples of enough calls each."""
        for i in range(cfg.warmup):
            kernel(i)
        t0 = self.clock()
        kernel(0)
        calls = cfg.fixed_calls or calls_per_sample(self.clock() - t0, cfg.min_sample_s,
                                                    cfg.max_calls)
        samples = np.empty(cfg.repeats)
        for r in range(cfg.repeats):
            t0 = self.clock()
            for i in range(calls):
                kernel(i)
            samples[r] = (self.clock() - t0) / calls
        return Measurement(samples, "perf_counter", calls)


class CudaTimer:
    """CUDA-event timing on the current device: graph replays of ``calls`` launches when the
    kernel can be captured (launch gaps removed, as aiconfigurator's collector does), else
    event-timed eager launches."""

    def __init__(self, use_graph: bool = True) -> None:
        import torch

        self.torch = torch
        self.use_graph = use_graph

    def _events(self):
        ev = self.torch.cuda.Event
        return ev(enable_timing=True), ev(enable_timing=True)

    def _time_once(self, launch: Callable[[], object]) -> float:
        start, end = self._events()
        start.record()
        launch()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e-3

    def measure(self, kernel: Kernel, cfg: TimingConfig) -> Measurement:
        """Warm up, estimate one call, then time ``repeats`` samples of ``calls`` calls."""
        torch = self.torch
        for i in range(cfg.warmup):
            kernel(i)
        torch.cuda.synchronize()
        calls = cfg.fixed_calls or calls_per_sample(self._time_once(lambda: kernel(0)),
                                                    cfg.min_sample_s, cfg.max_calls)

        def eager() -> None:
            for i in range(calls):
                kernel(i)

        if self.use_graph:
            try:
                return self._measure_graph(kernel, calls, cfg)
            except RuntimeError:  # not capturable (host sync, unsupported op): time eagerly
                torch.cuda.synchronize()
        samples = np.array([self._time_once(eager) / calls for _ in range(cfg.repeats)])
        return Measurement(samples, "cuda_events", calls)

    def _measure_graph(self, kernel: Kernel, calls: int, cfg: TimingConfig) -> Measurement:
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # capture needs libraries' workspaces made beforehand
            kernel(0)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(calls):
                kernel(i)
        graph.replay()
        samples = np.array([self._time_once(graph.replay) / calls for _ in range(cfg.repeats)])
        del graph
        return Measurement(samples, "cuda_graph", calls)
