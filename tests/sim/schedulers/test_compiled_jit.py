"""The compiled loop runs without numba's reference counting, so it must not allocate."""

from __future__ import annotations

import importlib
import pkgutil

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from numba.core.registry import CPUDispatcher as Dispatcher

import sim.compiled
from sim.compiled.sglang_step import _victims_last


def test_the_loop_is_compiled_without_reference_counting():
    """Every numba function under ``sim/compiled/`` but ``arrival_cutoff`` (which the SimPy
    engine calls with arrays)."""
    found = []
    for info in pkgutil.iter_modules(sim.compiled.__path__, "sim.compiled."):
        module = importlib.import_module(info.name)
        for name, f in vars(module).items():
            if isinstance(f, Dispatcher) and f.__module__ == info.name:
                found.append(name)
                assert f.targetoptions.get("_nrt", True) is (name == "arrival_cutoff"), name
    assert "run" in found and "arrival_cutoff" in found and len(found) > 40


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 3)), min_size=0, max_size=40))
def test_retraction_order_is_sglang_s_lexsort_reversed(rows):
    """Ties (equal generated and prompt) are frequent here, so the stability is checked too."""
    generated = np.array([g for g, _ in rows], np.int64)
    prompt = np.array([p for _, p in rows], np.int64)
    m = len(rows)
    ids = np.arange(m, dtype=np.int64)[::-1].copy()  # not in id order
    expected = ids[np.lexsort((-prompt[ids], generated[ids]))][::-1]
    keep, buf = np.append(ids, [-7, -7]), np.zeros(m + 2, np.int64)
    _victims_last(keep, m, generated, prompt, buf)
    assert keep[:m].tolist() == expected.tolist()
    assert keep[m:].tolist() == [-7, -7]
