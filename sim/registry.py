"""Registries of pluggable components, built from what each class declares.

A scheduler or router class carries its config ``name`` (the option of ``scheduler.name`` or
``cluster.router``); ``by_name`` turns the classes into the registry every other module looks
names up in, so a new component is its file, its YAML and one line in its package's list.
"""

from __future__ import annotations


def by_name(*classes: type) -> dict[str, type]:
    """``{cls.name: cls}`` in the order given; a missing or repeated name is a programming
    error, raised at import."""
    out: dict[str, type] = {}
    for cls in classes:
        name = getattr(cls, "name", "")
        if not name:
            raise TypeError(f"{cls.__name__} declares no name")
        if name in out:
            raise TypeError(f"{cls.__name__} and {out[name].__name__} both declare {name!r}")
        out[name] = cls
    return out
