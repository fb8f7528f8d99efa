"""The one exception type that means "the user's input is wrong", the one that means "the
outputs could not be written", and how Ctrl-C (or SIGTERM, handled the same) ends a command
outside the simulation loop."""

import signal
import sys
import threading
from contextlib import contextmanager

INTERRUPTED_EXIT_CODE = 130  # the shell's code for SIGINT; a SIGTERM ends the same way
OUTPUT_ERROR_EXIT_CODE = 1  # the outputs could not be written (disk full, read-only, ...)


class ConfigError(ValueError):
    """Bad user input: names the field, the value, and what would be valid.

    Entry points print ``str(error)`` as a single line and exit with code 2.
    """

    def __init__(self, field: str, value: object, expected: str) -> None:
        self.field, self.value, self.expected = field, value, expected
        # every field in args: SimPy re-raises a process's exception as type(e)(*e.args),
        # and a sweep's worker pickles it the same way
        super().__init__(field, value, expected)

    def __str__(self) -> str:
        return f"{self.field}={self.value!r}: {self.expected}"


class InvariantError(AssertionError):
    """A simulation invariant broke (``check_invariants=true``): a bug, not bad input.

    Names the invariant, the replica (−1: the cluster as a whole), the simulated time and
    the requests involved.
    """

    def __init__(self, invariant: str, replica: int, time_s: float, request_ids=(),
                 detail: str = "") -> None:
        self.invariant, self.replica, self.time_s = invariant, int(replica), float(time_s)
        self.request_ids = [int(r) for r in request_ids]
        self.detail = detail
        # every field in args: SimPy re-raises a process's exception as type(e)(*e.args)
        super().__init__(invariant, self.replica, self.time_s, self.request_ids, detail)

    def __str__(self) -> str:
        where = f"replica {self.replica}" if self.replica >= 0 else "the cluster"
        ids, n = self.request_ids[:10], len(self.request_ids)
        more = f" (+{n - 10} more)" if n > 10 else ""
        detail = f": {self.detail}" if self.detail else ""
        return (f"invariant {self.invariant!r} violated on {where} at t={self.time_s:.9g}s"
                f"{detail}; requests {ids}{more}")


def report_error(error: Exception) -> int:
    """Print a command's error as its one line on stderr; the exit code it ends with: 2 for
    bad input, ``OUTPUT_ERROR_EXIT_CODE`` for an output that could not be written."""
    print(f"error: {error}", file=sys.stderr)
    return OUTPUT_ERROR_EXIT_CODE if isinstance(error, OutputError) else 2


class OutputError(OSError):
    """An output could not be written (a full disk, a read-only or missing folder): an
    ``OSError`` naming the file and the system's reason. Entry points print it as one line
    and exit with ``OUTPUT_ERROR_EXIT_CODE``."""

    def __init__(self, path, error: OSError) -> None:
        super().__init__(error.errno, error.strerror or str(error), str(path))

    def __str__(self) -> str:
        return f"cannot write {self.filename}: {self.strerror}"


class Terminated(KeyboardInterrupt):
    """SIGTERM (what schedulers, ``timeout`` and container runtimes send), raised where
    Ctrl-C would raise ``KeyboardInterrupt`` so that it stops a command the same way."""


def sigterm_interrupts(signum, frame) -> None:
    """The SIGTERM handler of a command: raise ``Terminated``, as Ctrl-C raises
    ``KeyboardInterrupt``; ``sim.engine.run`` takes it over while simulating, as it does
    SIGINT's, to stop between two events."""
    raise Terminated


@contextmanager
def ctrl_c_exits():
    """Ctrl-C or SIGTERM anywhere in the block ends the command with one line on stderr and
    exit code 130, not a traceback. (Inside the simulation loop a run stops itself and writes
    partial results first; this covers start-up, e.g. loading and checking the config, and
    the rest.)"""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, sigterm_interrupts) if main else None
    try:
        yield
    except KeyboardInterrupt as e:
        what = "SIGTERM" if isinstance(e, Terminated) else "Ctrl-C"
        print(f"interrupted ({what}): no complete results were written by this command",
              file=sys.stderr)
        raise SystemExit(INTERRUPTED_EXIT_CODE) from None
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
