"""The compiled loop runs without numba's reference counting, so it must not allocate."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.compiled import kernel
from sim.compiled.sglang_step import _victims_last


def test_the_loop_is_compiled_without_reference_counting():
    assert kernel.run.targetoptions["_nrt"] is False


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
