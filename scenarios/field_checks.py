"""Range checks of single workload fields, shared by the workload's schemas
(``scenarios.config``, ``scenarios.bench_datasets``): each raises one ``WorkloadError`` naming
the dotted field and the value."""

from __future__ import annotations

import math
import numbers
from typing import Any

from scenarios.errors import WorkloadError
from scenarios.traces import MAX_TIME_S, MAX_TOKENS


def finite(x: Any) -> bool:
    """Whether ``x`` is a real number (not a bool) and finite."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def check_positive(name: str, x: Any) -> None:
    """A finite number > 0."""
    if not (finite(x) and x > 0):
        raise WorkloadError(name, x, "must be a finite number > 0")


def check_nonnegative(name: str, x: Any) -> None:
    """A finite number >= 0."""
    if not (finite(x) and x >= 0):
        raise WorkloadError(name, x, "must be a finite number >= 0")


def check_seconds(name: str, x: Any) -> None:
    """A wait that moves the clock: past ``MAX_TIME_S`` float seconds lose step resolution."""
    check_nonnegative(name, x)
    if x > MAX_TIME_S:
        raise WorkloadError(name, x, f"must be at most {MAX_TIME_S:g} s")


def check_choice(name: str, x: Any, choices: tuple[str, ...]) -> None:
    """One of ``choices``."""
    if x not in choices:
        raise WorkloadError(name, x, f"one of {list(choices)}")


def check_int_at_least(name: str, x: Any, least: int) -> None:
    """An integer (not a bool) >= ``least``."""
    if not (isinstance(x, numbers.Integral) and not isinstance(x, bool) and x >= least):
        raise WorkloadError(name, x, f"must be an integer >= {least}")


def check_at_most(name: str, x: Any, most: int) -> None:
    """An upper bound on a count the run holds in memory (one entry per request, prompt or
    turn), so a typo fails here rather than as an allocation of terabytes."""
    if x > most:
        raise WorkloadError(name, x, f"must be at most {most:_}".replace("_", ","))


def check_tokens(name: str, x: Any) -> None:
    """A token count: an integer in [1, ``MAX_TOKENS``]."""
    check_int_at_least(name, x, 1)
    if x > MAX_TOKENS:
        raise WorkloadError(name, x, f"must be at most {MAX_TOKENS} tokens")
