"""The calibrated parameter files the cost models read: ``sim/cost/calibrated/<name>/
<backend>.yaml`` (written by ``python -m calibration fit``) or one file a user's fit wrote
(``python -m calibration from-bench``), parsed once per version of the file."""

from __future__ import annotations

import copy
import functools
import os
from importlib import resources

import yaml

from sim.cost.operators import Efficiency
from sim.errors import ConfigError


def load_calibration(name: str, backend: str,
                     field: str = "hardware.calibration") -> tuple[Efficiency, dict]:
    """Read ``sim/cost/calibrated/<name>/<backend>.yaml`` (written by ``python -m calibration
    fit``); ``field`` is the config key the name came from, for the error message. Returns the
    efficiencies and the whole document (host overheads, data hash, fit errors), a copy the
    caller may change."""
    eff, doc = shared_calibration(name, backend, field)
    return eff, copy.deepcopy(doc)


def shared_calibration(name: str, backend: str,
                       field: str = "hardware.calibration") -> tuple[Efficiency, dict]:
    """``load_calibration`` without the copy: the parsed document every caller shares, to
    be read only (building a replica reads its host and frontend blocks; a copy per replica
    cost 36 ms each, 37 s for 1,024 replicas)."""
    if name.endswith((".yaml", ".yml")):  # one file (``python -m calibration from-bench``)
        if not os.path.isfile(name):
            raise ConfigError(field, name, "not a file")
        return _parse_calibration(name, os.stat(name).st_mtime_ns)
    folder = resources.files("sim.cost") / "calibrated" / name
    path = folder / f"{backend}.yaml"
    if not path.is_file():
        have = sorted(p.name.removesuffix(".yaml") for p in folder.iterdir()) \
            if folder.is_dir() else []
        if not have:
            raise ConfigError(field, name, "no calibrated parameters of that name in "
                              "sim/cost/calibrated/")
        raise ConfigError("backend.name", backend,
                          f"not calibrated for {name}; have {have}")
    return _parse_calibration(str(path), os.stat(str(path)).st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _parse_calibration(path: str, mtime_ns: int) -> tuple[Efficiency, dict]:
    """Parse a calibrated file once per version (sweeps and validation build many replicas;
    the files are ~80 kB of YAML). ``mtime_ns`` makes a rewritten file parse again."""
    with open(path) as f:
        doc = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return Efficiency.from_dict(doc["parameters"]), doc
