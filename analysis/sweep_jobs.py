"""Which job folders of a sweep directory belong to the last sweep that Hydra ran there.

A sweep rerun into its folder (``resume=true``) with other values leaves the earlier sweep's
job folders beyond its own: job 2 of ``seed=0,1,2`` stays after ``seed=5,6``. Hydra's sweeper
records the sweep in ``multirun.yaml`` (its overrides and ``hydra.sweeper.params``); the basic
sweeper numbers the jobs in the order of its combinations, and each job folder records its
number (``.hydra/hydra.yaml``) and overrides (``.hydra/overrides.yaml``). A folder is the
last sweep's when its overrides are that sweep's combination of its number.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def sweep_job_overrides(root: Path) -> list[list[str]] | None:
    """Each job's overrides (by job number) of the last sweep recorded in
    ``root/multirun.yaml``; None when that cannot be told (no record, another sweeper than
    Hydra's basic one, overrides it cannot expand)."""
    try:
        cfg = OmegaConf.load(Path(root) / "multirun.yaml")
        sweeper = cfg.hydra.sweeper
        if sweeper.get("_target_") != BASIC_SWEEPER:
            return None
        params = sweeper.get("params")
        params = OmegaConf.to_container(params, resolve=False) if params else {}
        task = [str(o) for o in OmegaConf.to_container(cfg.hydra.overrides.task,
                                                       resolve=False)]
        overrides = OverridesParser.create().parse_overrides(
            [f"{k}={v}" for k, v in params.items()] + task)
        return BasicSweeper.split_arguments(overrides, None)[0]
    except (OSError, ValueError, AttributeError, TypeError, OmegaConfBaseException,
            HydraException):
        return None


def last_sweep_dirs(root: Path, dirs: list[Path],
                    number: Callable[[Path], int | None]) -> list[Path]:
    """The folders of ``dirs`` that are jobs of the last sweep run into ``root`` (all of
    them when that cannot be told); ``number`` reads a folder's job number."""
    expected = sweep_job_overrides(root)
    if expected is None:
        return dirs
    mine = []
    for d in dirs:
        num = number(d)
        try:
            given = [str(o) for o in OmegaConf.load(d / ".hydra" / "overrides.yaml")]
        except (OSError, ValueError, TypeError, OmegaConfBaseException):
            given = None
        if num is not None and 0 <= num < len(expected) and given == expected[num]:
            mine.append(d)
    return mine
