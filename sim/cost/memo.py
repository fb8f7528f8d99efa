"""A bounded memo for the cost model's pure functions of a shape."""

from __future__ import annotations

from collections.abc import Callable, Hashable


class Memo(dict):
    """Values of a pure function by key, at most ``size`` of them: emptied when full, which
    bounds the memory a long run's many distinct shapes can take (a dict of a few thousand
    entries costs well under a megabyte; refilling it costs one evaluation per key)."""

    def __init__(self, size: int = 4096) -> None:
        super().__init__()
        self.size = size

    def get_or(self, key: Hashable, compute: Callable[[], object]):
        """The value for ``key``, computed by ``compute()`` the first time."""
        v = self.get(key)
        if v is None:
            if len(self) >= self.size:
                self.clear()
            v = self[key] = compute()
        return v
