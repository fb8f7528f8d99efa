"""The Hydra callback that gives every run (and every sweep) a folder of its own.

Hydra creates the run folder and writes ``.hydra/`` (the config) into it before the app
runs, so by the time ``cli.app.main`` could look, a second run would already have replaced
the first one's config. ``on_run_start`` and ``on_multirun_start`` come before that: there a
folder that already holds a run (``.hydra/``, ``summary.json``, ``failed.json``, a table) or
a sweep (``multirun.yaml``, job folders) is refused with one line and exit code 2, unless
``resume=true`` says to reuse it (skip what is complete, rerun the rest in place); a run
refused for bad input gives its folder back (``release_run_dir``). The
folder is claimed atomically (``mkdir .hydra`` for a run, an exclusive ``multirun.yaml`` for
a sweep), so of two runs started at once into one folder exactly one goes on. A folder that
cannot be made or written is one line and exit code 2 too, as for the other commands'
output folders (``analysis.inputs.output_dir``).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any, NoReturn

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from analysis.inputs import output_dir
from analysis.report import FAILED_JSON, RUN_FILES, SUMMARY_JSON
from sim.errors import ConfigError

REFUSED_EXIT_CODE = 2  # the folder given is another run's, or cannot be written: bad input
RUN_MARKS = (SUMMARY_JSON, FAILED_JSON, *RUN_FILES)
SWEEP_MARKS = ("multirun.yaml", "sweep_summary.parquet", "sweep_summary.csv")


def _refuse(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(REFUSED_EXIT_CODE)


def _unwritable(key: str, folder: Path, error: OSError) -> NoReturn:
    _refuse(str(ConfigError(key, str(folder), "a folder the command can write into; "
                            f"{error.strerror or error}")))


def holds_run(folder: Path, subdir: str | None) -> bool:
    """Whether ``folder`` holds (or held) a run: Hydra's ``subdir`` or a run's outputs."""
    return ((subdir is not None and (folder / subdir).exists())
            or any((folder / name).exists() for name in RUN_MARKS))


def holds_sweep(folder: Path) -> bool:
    """Whether ``folder`` holds (or held) a sweep: its record, its table or job folders."""
    return (any((folder / name).exists() for name in SWEEP_MARKS)
            or any(folder.glob("*/.hydra")))


def _make(folder: Path, key: str) -> None:
    """Create ``folder`` (and its parents), or end the command: it cannot be written."""
    try:
        output_dir(folder, key)
        folder.mkdir(parents=True, exist_ok=True)
    except ConfigError as e:
        _refuse(str(e))
    except OSError as e:
        _unwritable(key, folder, e)


def _claim(make, key: str, folder: Path) -> bool:
    """Run ``make`` (an exclusive creation); whether another run made it first."""
    try:
        make()
    except FileExistsError:
        return True
    except OSError as e:
        _unwritable(key, folder, e)
    return False


def claim_run_dir(folder: Path, subdir: str | None, resume: bool) -> None:
    """Make ``folder`` this run's, before Hydra writes into it, or end the command."""
    key = "hydra.run.dir"
    _make(folder, key)
    if resume:
        return
    used = holds_run(folder, subdir)
    if not used and subdir is not None:  # atomic: of two runs starting at once, one makes it
        used = _claim(lambda: (folder / subdir).mkdir(), key, folder)
    if used:
        _refuse(f"{key}={folder} already holds a run: choose another folder with "
                f"{key}=NEW_DIR, or add resume=true to skip it if complete for the same "
                "config, else rerun into it")


def claim_sweep_dir(folder: Path, resume: bool) -> None:
    """Make ``folder`` this sweep's, before Hydra writes into it, or end the command."""
    key = "hydra.sweep.dir"
    _make(folder, key)
    if resume:
        return
    used = holds_sweep(folder)
    if not used:  # atomic: Hydra's sweeper writes the real record over it right after
        used = _claim(lambda: os.close(os.open(folder / "multirun.yaml",
                                               os.O_CREAT | os.O_EXCL | os.O_WRONLY)),
                      key, folder)
    if used:
        _refuse(f"{key}={folder} already holds a sweep: choose another folder with "
                f"{key}=NEW_DIR, or add resume=true to finish it there (complete jobs of "
                "the same config are skipped)")


def release_run_dir(folder: Path, subdir: str | None) -> None:
    """Give back the folder of a run refused before it simulated (bad input): remove what
    Hydra wrote (``subdir``, ``<job>.log``) when the folder holds no run's outputs, and the
    folder itself when that leaves it empty, so the corrected command can run there."""
    if any((folder / name).exists() for name in RUN_MARKS):
        return  # a resumed run's folder: its outputs stay, and so does its claim
    if subdir is not None:
        shutil.rmtree(folder / subdir, ignore_errors=True)
    for log in folder.glob("*.log"):
        log.unlink(missing_ok=True)
    try:
        folder.rmdir()
    except OSError:
        pass  # it holds the user's own files: leave them and the folder


class OneRunPerDir(Callback):
    """Registered under ``hydra.callbacks`` in ``conf/config.yaml``: refuses an output
    folder that already holds another run or sweep (``claim_run_dir``, ``claim_sweep_dir``)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Before a single run: claim ``hydra.run.dir``."""
        claim_run_dir(Path(str(config.hydra.run.dir)), config.hydra.output_subdir,
                      bool(config.get("resume", False)))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Before a sweep: claim ``hydra.sweep.dir``."""
        claim_sweep_dir(Path(str(config.hydra.sweep.dir)), bool(config.get("resume", False)))
