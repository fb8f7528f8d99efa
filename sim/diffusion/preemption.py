"""Where a running gang can be paused: at its next step boundary, the end of the text
encoding or of the denoising step in progress, computed from the run's start (exact without
an event per step). A job whose last step has begun is not paused: it completes instead."""

from __future__ import annotations

import math

from sim.diffusion.unit import Unit

EPS = 1e-9  # relative slack when finding the step in progress


def next_boundary(unit: Unit, now: float) -> tuple[float, int] | None:
    """(time, steps done then) of the running ``unit``'s next step boundary at or after
    ``now``; None once its last step has begun."""
    tm = unit.timing
    enc = 0.0 if unit.encoded else tm.encode_s
    elapsed = now - unit.run_start - enc
    if elapsed < 0:
        return unit.run_start + enc, unit.steps_done
    k = math.ceil(elapsed / tm.step_s - EPS) if tm.step_s > 0 else 0
    if k >= tm.steps - unit.steps_done:
        return None
    return unit.run_start + enc + k * tm.step_s, unit.steps_done + k
