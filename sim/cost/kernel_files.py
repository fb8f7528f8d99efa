"""Measured-kernel parameter files beside a hardware calibration's backend files:
``sim/cost/calibrated/<hardware.calibration>/kernels/<name>.yaml``, written by the
``python -m calibration fit-*`` commands (attention kernel classes, eager-mode DiT costs) and
read here once per file version."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from importlib import resources
from typing import Any

import yaml

FOLDER = "kernels"  # beside the backends' files, out of their namespace


def kernel_file(calibration: str, name: str):
    """Where ``kernels/<name>.yaml`` of ``hardware.calibration`` is (or would be written)."""
    return resources.files("sim.cost") / "calibrated" / calibration / FOLDER / f"{name}.yaml"


def read_kernel_file(calibration: str, name: str, parse: Callable[[dict], Any]) -> Any:
    """``parse`` of the file's document (``parse({})`` when there is none), computed once
    per file version."""
    path = kernel_file(calibration, name)
    if not path.is_file():
        return parse({})
    return _parsed(str(path), os.stat(str(path)).st_mtime_ns, parse)


@functools.lru_cache(maxsize=16)
def _parsed(path: str, mtime_ns: int, parse: Callable[[dict], Any]) -> Any:
    with open(path) as f:
        return parse(yaml.safe_load(f) or {})
