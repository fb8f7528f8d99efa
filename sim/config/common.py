"""Helpers shared by the config checks."""

from __future__ import annotations

from sim.errors import ConfigError

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "fp8": 1}


def positive(field: str, value: float) -> None:
    """Refuse a value that is missing or not > 0, naming its field."""
    if value is None or value <= 0:
        raise ConfigError(field, value, "must be > 0")
