"""The profiler's ``key=value`` arguments, parsed and checked (one ConfigError per bad one)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from calibration.profile.shapes import ALL_OPS, OP_ALIASES, PLANS
from sim.errors import ConfigError

DEVICES = ("cuda", "cpu")
DEFAULT_FULL_BUDGET_S = 480.0  # the full plan stops measuring after this and writes what it has
USAGE = ("python -m calibration profile out_dir=DIR [device=cuda|cpu] [plan=full|tiny] "
         "[ops=gemm,attention,moe,comm] [gpus=2,4,8] [budget_s=SECONDS] [warmup=N] "
         "[repeats=N] [seed=N] [graph=true|false]")


@dataclass(frozen=True)
class ProfileArgs:
    """One profiler run: where to write, on what, which plan and ops, how long at most.

    ``gpus`` lists the world sizes the collectives run at (None: every power of two up to the
    visible GPU count on CUDA, none on CPU); ``budget_s`` None means no limit.
    """

    out_dir: Path
    device: str = "cuda"
    plan: str = "full"
    ops: tuple[str, ...] = ALL_OPS
    gpus: tuple[int, ...] | None = None
    budget_s: float | None = None
    warmup: int | None = None
    repeats: int | None = None
    seed: int = 0
    graph: bool = True


def _int(field: str, value: str, low: int) -> int:
    try:
        n = int(value)
    except ValueError:
        raise ConfigError(field, value, f"an integer >= {low}") from None
    if n < low:
        raise ConfigError(field, value, f"an integer >= {low}")
    return n


def _ops(value: str) -> tuple[str, ...]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    allowed = (*ALL_OPS, *OP_ALIASES)
    bad = [n for n in names if n not in allowed]
    if not names or bad:
        raise ConfigError("ops", value, f"a comma-separated subset of {', '.join(allowed)}")
    chosen = set()
    for n in names:
        chosen.update(OP_ALIASES.get(n, (n,)))
    return tuple(op for op in ALL_OPS if op in chosen)


def _gpus(value: str) -> tuple[int, ...]:
    if value.lower() in ("none", ""):
        return ()
    try:
        sizes = tuple(sorted({int(v) for v in value.split(",")}))
    except ValueError:
        sizes = ()
    if not sizes or sizes[0] < 2:
        raise ConfigError("gpus", value, "comma-separated world sizes >= 2 (or none)")
    return sizes


def _budget(value: str) -> float | None:
    if value.lower() in ("none", "inf", "0"):
        return None
    try:
        b = float(value)
    except ValueError:
        b = -1.0
    if not b > 0:
        raise ConfigError("budget_s", value, "seconds > 0, or none for no limit")
    return b


def _choice(field: str, value: str, choices) -> str:
    if value not in choices:
        raise ConfigError(field, value, f"one of {', '.join(choices)}")
    return value


def _bool(field: str, value: str) -> bool:
    v = value.lower()
    if v not in ("true", "false"):
        raise ConfigError(field, value, "true or false")
    return v == "true"


PARSERS = {
    "out_dir": lambda v: Path(v),
    "device": lambda v: _choice("device", v, DEVICES),
    "plan": lambda v: _choice("plan", v, tuple(PLANS)),
    "ops": _ops,
    "gpus": _gpus,
    "budget_s": _budget,
    "warmup": lambda v: _int("warmup", v, 0),
    "repeats": lambda v: _int("repeats", v, 2),
    "seed": lambda v: _int("seed", v, 0),
    "graph": lambda v: _bool("graph", v),
}


def parse_overrides(overrides: list[str]) -> ProfileArgs:
    """Arguments from ``key=value`` strings; the first bad one raises ConfigError."""
    values: dict = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or key not in PARSERS:
            raise ConfigError(key if sep else "argument", item if not sep else value,
                              f"key=value with key one of {', '.join(PARSERS)}; usage: {USAGE}")
        if key in values:
            raise ConfigError(key, value, "given once (it was given twice)")
        values[key] = PARSERS[key](value)
    if "out_dir" not in values:
        raise ConfigError("out_dir", None, f"required; usage: {USAGE}")
    if "budget_s" not in values and values.get("plan", "full") == "full":
        values["budget_s"] = DEFAULT_FULL_BUDGET_S
    return ProfileArgs(**values)
