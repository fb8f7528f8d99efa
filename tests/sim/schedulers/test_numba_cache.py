"""The compiled loop's numba cache is dropped when any source it was built from changed."""

from __future__ import annotations

from sim.compiled import drop_stale_numba_cache


def test_a_source_change_drops_the_numba_cache(tmp_path):
    """Numba keys a cached function by its own file only; the package drops its cache when any
    of its sources changed, so a kernel inlining an edited helper is recompiled."""
    (tmp_path / "kernel.py").write_text("x = 1\n")
    (tmp_path / "helper.py").write_text("y = 1\n")
    drop_stale_numba_cache(tmp_path)
    entry = tmp_path / "__pycache__" / "kernel.run-1.py311.nbi"
    entry.write_bytes(b"cached")
    drop_stale_numba_cache(tmp_path)
    assert entry.exists()  # same sources: kept
    (tmp_path / "helper.py").write_text("y = 2\n")
    drop_stale_numba_cache(tmp_path)
    assert not entry.exists()


def test_an_edit_of_a_module_it_compiles_constants_from_drops_the_cache(tmp_path):
    here, read = tmp_path / "compiled", tmp_path / "schedulers"
    here.mkdir(), read.mkdir()
    (here / "kernel.py").write_text("x = 1\n")
    (read / "sglang.py").write_text("RATIO = 0.7\n")
    drop_stale_numba_cache(here, read)
    entry = here / "__pycache__" / "kernel.run-1.py311.nbi"
    entry.write_bytes(b"cached")
    drop_stale_numba_cache(here, read)
    assert entry.exists()
    (read / "sglang.py").write_text("RATIO = 0.8\n")
    drop_stale_numba_cache(here, read)
    assert not entry.exists()
