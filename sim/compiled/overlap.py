"""When an overlapping engine takes a held request: the one rule both engines share.

An engine that schedules each step while the one before it runs (``backend.overlap_scheduler``)
holds a request that reaches it mid-step; it joins the first step scheduled after it came
(``sim.engine.replica.Replica._release``, ``sim.compiled.kernel._release_held``). It lives in
``sim/compiled/`` so that numba's cache of the kernel, which inlines it, is rebuilt when it
changes (``sim.compiled.drop_stale_numba_cache``).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from sim.compiled.jit import compiled


@njit(cache=True)  # with reference counting: the SimPy engine passes arrays of step starts
def arrival_cutoff(start):
    """Requests that reached an overlapping engine before this time came before a step that
    started at ``start`` (a number or an array). A rounding error's difference is the same
    instant: the SimPy engine's clock reaches an arrival time through a sum that may land an
    ulp off it, and both engines must take the same request into the same step."""
    return start - 1e-12 * np.maximum(1.0, np.abs(start))


def released_in_window(start: float, ends: np.ndarray, at):
    """When a request held since ``at`` (a time or an array of them) reaches the scheduler of
    an engine running a decode window that began at ``start`` and whose steps end at
    ``ends``: the end of the first step that began after it came (inf: after the window)."""
    starts = np.concatenate(([start], ends[:-1]))
    k = np.searchsorted(arrival_cutoff(starts), at, side="right")  # first it came before
    return np.where(k < len(ends), ends[np.minimum(k, len(ends) - 1)], np.inf)


@compiled
def came_before(at, start):
    """Whether a request that reached an overlapping engine at ``at`` came before a step that
    started at ``start`` (``inf``: every request)."""
    return at < arrival_cutoff(start) if start < math.inf else True
