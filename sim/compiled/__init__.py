"""A compiled event loop for the configurations most runs use (``sim.compiled.core``).

Numba's on-disk cache (``cache=True``) keys each function by the text of its own file only,
so after an edit or upgrade of ``step_price.py`` the cached ``kernel.run`` that inlines it would
still load: stale machine code, silently. Importing the package therefore drops every cached
entry when the package's sources, or those of ``sim/schedulers/`` whose constants it compiles
in (``SglangScheduler``'s), differ from those the cache was built from.
"""

from __future__ import annotations

import hashlib
from pathlib import Path


def drop_stale_numba_cache(here: Path, *read: Path) -> None:
    """Delete ``here/__pycache__/*.nbi|*.nbc`` unless they were built from the exact sources
    of ``here/*.py`` and of the ``*.py`` in the folders ``read``."""
    cache = here / "__pycache__"
    sources = [p for folder in (here, *read) for p in sorted(folder.glob("*.py"))]
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources))
    stamp = cache / "numba_sources.sha256"
    try:
        if stamp.is_file() and stamp.read_text() == digest.hexdigest():
            return
        for entry in [*cache.glob("*.nbi"), *cache.glob("*.nbc")]:
            entry.unlink(missing_ok=True)
        cache.mkdir(exist_ok=True)
        stamp.write_text(digest.hexdigest())
    except OSError:  # a read-only install: numba then keeps its cache elsewhere or none
        pass


drop_stale_numba_cache(Path(__file__).parent, Path(__file__).parent.parent / "schedulers")
