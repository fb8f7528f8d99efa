"""Files written whole or not at all: every file goes to a temp name in its folder and is
renamed over the target, so an interrupted write never leaves a truncated file under a real
name; a file that cannot be written (a full disk, a read-only folder) raises
``sim.errors.OutputError`` naming it. Every command's writes go through here."""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import yaml

from sim.errors import OutputError

_UMASK = os.umask(0o022)
os.umask(_UMASK)


def atomic_write(path: Path, write: Callable[[str], object]) -> None:
    """Write through a temp file in the same folder, then rename over ``path``: ``write``
    gets the temp file's name and writes the whole file there. The file gets the mode a
    plain write would give it (the umask's, or the mode of the file it replaces)."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise OutputError(path, e) from e
    os.close(fd)
    try:
        write(tmp)
        mode = path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~_UMASK
        os.chmod(tmp, mode)  # mkstemp made it private (0600)
        os.replace(tmp, path)
    except OutputError:
        raise
    except OSError as e:
        raise OutputError(path, e) from e
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def make_folder(folder: Path) -> Path:
    """``folder``, created with its parents if missing (``OutputError`` if it cannot be)."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(folder, e) from e
    return folder


def json_safe(v):
    """``v`` with numpy scalars made Python ones and NaN or infinite floats made ``None``
    (JSON has neither), through dicts, lists and tuples; for ``json.dumps(allow_nan=False)``."""
    if isinstance(v, dict):
        return {str(k): json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    if isinstance(v, np.bool_):
        return bool(v)
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return float(v) if math.isfinite(v) else None
    return v


def write_text(path: Path, text: str) -> None:
    """``path.write_text(text)``, atomically."""
    atomic_write(Path(path), lambda p: Path(p).write_text(text))


def write_yaml(path: Path, doc, header: str = "") -> None:
    """``doc`` as block YAML in the order given (a calibrated file), after ``header``'s lines
    as ``#`` comments, atomically; the folder is created if missing."""
    path = Path(path)
    make_folder(path.parent)
    comments = "".join(f"# {line}\n" for line in header.splitlines())
    write_text(path, comments + yaml.safe_dump(doc, sort_keys=False, width=100))


def write_json(path: Path, doc, **dumps) -> None:
    """``doc`` as indented JSON (NaN and infinities as null), atomically; ``dumps`` are
    further ``json.dumps`` arguments (e.g. ``default=str``)."""
    dumps = {"indent": 2, **dumps}
    write_text(path, json.dumps(json_safe(doc), allow_nan=False, **dumps) + "\n")


def save_figure(fig, path: Path, **savefig) -> None:
    """``fig.savefig(path)``, atomically (the format from ``path``'s suffix unless given)."""
    path = Path(path)
    savefig.setdefault("format", path.suffix.lstrip(".") or "png")
    atomic_write(path, lambda p: fig.savefig(p, **savefig))
