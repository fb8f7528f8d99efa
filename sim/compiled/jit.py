"""How the compiled loop's functions are compiled: one decorator for all of them."""

from __future__ import annotations

from numba import njit


def compiled(fn):
    """``fn`` compiled by numba, cached on disk, without numba's reference counting (NRT).

    The loop never allocates: every array it touches is the run's, held by Python for the
    whole call. With NRT each call that binds an array, or a tuple of them, increments and
    decrements every array's count with atomic instructions, and the loop's calls pass tuples
    of a dozen arrays: that was 40% of its time (``benchmarks/bench_default.py``). Without
    NRT, an allocation added to the loop fails to compile instead of running slowly.
    """
    return njit(cache=True, _nrt=False)(fn)
