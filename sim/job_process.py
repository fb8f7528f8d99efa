"""Run one sweep job in a child process of its pool worker, which only waits for it.

hydra-joblib-launcher runs jobs in loky workers. When a worker dies (SIGKILL from the
out-of-memory killer, a segfault in compiled code, a ``kill -9``), loky marks the whole pool
broken, kills the other workers and raises ``TerminatedWorkerError`` in the launching process:
every job still running or queued is lost and Hydra's sweep ends with a traceback, without
telling which job died. The launcher has no hook to change that. So the job runs in a fork of
the worker instead: the heavy process that dies is the child, and the worker, left alive,
records the loss in that job's ``failed.json`` and returns to loky like any finished job.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from collections.abc import Callable

from omegaconf import DictConfig, OmegaConf

DONE, FAILED, CRASHED, INTERRUPTED = 0, 3, 4, 130  # how a child ended, as its exit code


class JobKilled(RuntimeError):
    """A sweep job's process ended by a signal (or a crash) before it recorded its outcome:
    the out-of-memory killer's SIGKILL, a segfault in compiled code, a ``kill -9``."""


def isolates_jobs(hc: DictConfig) -> bool:
    """Whether this sweep job (Hydra config ``hc``) runs in a pool worker that losing the
    job's process would take down with every other job (hydra-joblib-launcher's loky
    workers), on a platform that can fork: then it runs in a child (``run_in_child``)."""
    target = str(OmegaConf.select(hc, "launcher._target_", default="") or "")
    return "joblib" in target.lower() and hasattr(os, "fork")


def run_in_child(body: Callable[[], int]) -> int:
    """Run ``body`` in a forked child and wait for it; the child's exit code (``body``'s
    return value; ``INTERRUPTED`` after Ctrl-C or SIGTERM, ``CRASHED`` after any other
    escape), or minus the signal that killed it.

    While waiting, this process ignores SIGINT (Ctrl-C reaches the child from the terminal,
    which stops its simulation between two events) and passes a SIGTERM on to the child."""
    pid = os.fork()
    if pid == 0:  # the child: never return into the worker's code
        code = CRASHED
        try:
            code = body()
        except KeyboardInterrupt:
            code = INTERRUPTED
        except BaseException:  # reported, then the child ends whatever happened
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda signum, frame: os.kill(pid, signal.SIGTERM))
    try:
        _, status = os.waitpid(pid, 0)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return os.waitstatus_to_exitcode(status)


def how_it_ended(code: int) -> str:
    """A child's end in words: "killed by SIGKILL (signal 9)" or "exited with code 1"."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name} (signal {-code})"
    return f"exited with code {code}"
