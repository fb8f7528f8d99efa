"""Helpers for the end-to-end tests of ``python -m sim``: run the CLI in subprocesses.

Each CLI run costs about two seconds of CPU (mostly imports), so the test modules start all
their runs at once in a module-scoped fixture and run them in parallel, one per core.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

TIMEOUT_S = 180


@dataclass
class CLIRun:
    """One finished ``python -m sim`` run: its arguments, exit code, output and run dir."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str
    outdir: Path

    def describe(self) -> str:
        """Everything worth seeing when an assertion on this run fails."""
        return (f"python -m sim {' '.join(self.args)}\nexit code {self.returncode}\n"
                f"--- stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr}")


class SimCLI:
    """Runs ``python -m sim`` in a working directory, with ``CI=1`` and Hydra's usual errors."""

    @staticmethod
    def env() -> dict[str, str]:
        env = dict(os.environ, CI="1")
        env.pop("HYDRA_FULL_ERROR", None)  # would turn errors into full stack traces
        return env

    def run(self, args: list[str], cwd: Path, outdir: Path | None = None) -> CLIRun:
        """One run; unless ``args`` is a sweep (``-m``), ``hydra.run.dir`` is ``outdir``."""
        args = list(args)
        if outdir is not None:
            args.append(f"hydra.run.dir={outdir}")
        proc = subprocess.run([sys.executable, "-m", "sim", *args], cwd=cwd, env=self.env(),
                              capture_output=True, text=True, timeout=TIMEOUT_S)
        return CLIRun(args, proc.returncode, proc.stdout, proc.stderr,
                      outdir if outdir is not None else cwd)

    def run_many(self, jobs: dict[str, list[str]], cwd: Path) -> dict[str, CLIRun]:
        """Run every job (name → overrides) in parallel; each writes into ``cwd/<name>``."""
        workers = max(2, os.cpu_count() or 2)
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = {name: pool.submit(self.run, args, cwd, cwd / name)
                       for name, args in jobs.items()}
            return {name: f.result() for name, f in futures.items()}


@pytest.fixture(scope="session")
def sim_cli() -> SimCLI:
    """Runner of the ``python -m sim`` command line."""
    return SimCLI()
