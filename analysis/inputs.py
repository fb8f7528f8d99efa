"""What the analysis and calibration commands read, and where they write, checked once.

A JSON, YAML, parquet or CSV file that is missing, empty (0 bytes), truncated, corrupt or of
the wrong shape, a document whose fields are not what its reader needs, or an output folder
that cannot be written, becomes one ``ConfigError`` that names the file (by the command's key
or the file's role, e.g. ``silicon_csv`` or ``summary.json``) and what it should have been.
The commands print it as one line with exit code 2, as ``python -m sim`` does for its config.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow
import yaml
from omegaconf.errors import OmegaConfBaseException

from cli.preflight import one_line
from sim.errors import ConfigError

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_SHAPES = {dict: "an object", list: "a list", str: "a string", int: "a number",
           float: "a number", bool: "a boolean", type(None): "null"}


def _refuse(field: str, path: Path | str, what: str, problem: str) -> ConfigError:
    """The error of a file that is not ``what`` it should be, for ``problem``, on one line."""
    problem = "; ".join(x.strip() for x in str(problem).splitlines() if x.strip())
    return ConfigError(field, str(path), f"{what}; {problem}")


def _check_file(path: Path, field: str, what: str) -> None:
    """``path`` is a regular file with something in it: a missing one, a folder or an empty
    file is an error (no command writes an empty file)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise _refuse(field, path, what, "file not found") from None
    except OSError as e:
        raise _refuse(field, path, what, f"cannot read it ({e.strerror})") from None
    if path.is_dir():
        raise _refuse(field, path, what, "it is a folder, not a file")
    if st.st_size == 0:
        raise _refuse(field, path, what, "the file is empty (0 bytes)")


def read_text(path: Path | str, field: str, what: str) -> str:
    """The text of a file that exists, is not empty and is UTF-8."""
    path = Path(path)
    _check_file(path, field, what)
    try:
        return path.read_text()
    except OSError as e:
        raise _refuse(field, path, what, f"cannot read it ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise _refuse(field, path, what, f"not UTF-8 text ({e.reason} at byte {e.start})") \
            from None


def _shaped(doc: Any, kind: type, field: str, path: Path, what: str) -> Any:
    if not isinstance(doc, kind):
        got = _SHAPES.get(type(doc), type(doc).__name__)
        raise _refuse(field, path, what, f"it holds {got}, not {_SHAPES[kind]}")
    return doc


def read_json(path: Path | str, field: str, what: str, kind: type = dict) -> Any:
    """The JSON document in ``path``, an object (``kind=dict``) or a list; ``what`` says what
    the file should hold, for the message (e.g. ``"a run's summary (a JSON object)"``)."""
    path = Path(path)
    text = read_text(path, field, what)
    try:
        doc = json.loads(text)
    except RecursionError:
        raise _refuse(field, path, what, "not readable JSON: nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, and integers of more than 4,300 digits
        raise _refuse(field, path, what, f"not valid JSON ({e})") from None
    return _shaped(doc, kind, field, path, what)


def _yaml_problem(e: yaml.YAMLError) -> str:
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None)
    if problem and mark is not None:
        return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
    return str(e)


def read_yaml(path: Path | str, field: str, what: str, kind: type = dict) -> Any:
    """The YAML document in ``path``, a mapping (``kind=dict``) or a list."""
    path = Path(path)
    text = read_text(path, field, what)
    try:
        doc = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as e:
        raise _refuse(field, path, what, f"not valid YAML ({_yaml_problem(e)})") from None
    return _shaped(doc, kind, field, path, what)


def _has_columns(df: pd.DataFrame, columns: Sequence[str], field: str, path: Path,
                 what: str) -> pd.DataFrame:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise _refuse(field, path, what, f"it has no column {missing[0]!r}" if len(missing) == 1
                      else f"it lacks the columns {missing}")
    return df


def read_parquet(path: Path | str, field: str, what: str,
                 columns: Sequence[str] = ()) -> pd.DataFrame:
    """The table in a parquet file, with at least ``columns``."""
    path = Path(path)
    _check_file(path, field, what)
    try:
        df = pd.read_parquet(path)
    except (OSError, ValueError, pyarrow.ArrowException) as e:
        raise _refuse(field, path, what, f"not a readable parquet file ({e})") from None
    return _has_columns(df, columns, field, path, what)


def read_csv(path: Path | str, field: str, what: str,
             columns: Sequence[str] = ()) -> pd.DataFrame:
    """The table in a CSV file with a header row, at least one data row and ``columns``."""
    path = Path(path)
    _check_file(path, field, what)
    try:
        df = pd.read_csv(path)
    except OSError as e:
        raise _refuse(field, path, what, f"cannot read it ({e.strerror})") from None
    except ValueError as e:  # pandas' EmptyDataError, ParserError; UnicodeDecodeError
        raise _refuse(field, path, what, f"cannot read as CSV ({e})") from None
    _has_columns(df, columns, field, path, what)
    if df.empty:
        raise _refuse(field, path, what, "it has a header and no rows")
    return df


@contextmanager
def fields_of(path: Path | str, field: str, what: str) -> Iterator[None]:
    """Inside the block, a field of the document read from ``path`` that is missing, of the
    wrong type or out of range (a ``KeyError``, ``TypeError``, a check's ``ConfigError``, …
    while its fields are read) is one error naming the file (a ``ConfigError`` that names
    it already passes as it is). Keep the block to the reading of that document."""
    try:
        yield
    except ConfigError as e:
        if str(e.value) == str(path):
            raise
        raise _refuse(field, path, what, f"its {e}") from None
    except (KeyError, IndexError, TypeError, AttributeError, ValueError,
            OmegaConfBaseException) as e:
        raise _refuse(field, path, what, _field_problem(e)) from None


def _field_problem(e: Exception) -> str:
    if isinstance(e, OmegaConfBaseException):  # before KeyError: some are both
        return f"a field is missing or of the wrong type ({one_line(e)})"
    if isinstance(e, KeyError) and e.args:
        return f"it lacks {e.args[0]!r}"
    return f"a field of the wrong type or value ({type(e).__name__}: {e})"


def _cannot_write(folder: Path) -> str | None:
    """Why a command cannot write into ``folder`` or create it (None when it can): its
    nearest existing part must be a writable folder."""
    try:
        existing = next(p for p in (folder, *folder.parents) if p.exists())
    except OSError as e:  # a part that cannot be searched (no x permission)
        return f"{e.filename} cannot be reached ({e.strerror})"
    if not existing.is_dir():
        return f"{existing} is a file"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    return None


def output_dir(path: Path | str, field: str) -> Path:
    """``path`` as a folder a command can write into, or create."""
    path = Path(path)
    if why := _cannot_write(path):
        raise ConfigError(field, str(path), f"a folder the command can write into; {why}")
    return path


def output_file(path: Path | str, field: str) -> Path:
    """``path`` as a file a command can write: not a folder, in a folder it can write into
    or create."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(field, str(path), "the path of a file to write; it is a folder")
    if why := _cannot_write(path.parent):
        raise ConfigError(field, str(path), f"a file in a folder the command can write "
                          f"into; {why}")
    return path


def check_warmup(requests: pd.DataFrame, cut_s: float, field: str, value: object,
                 run: str) -> None:
    """A fixed warm-up (option ``field`` = ``value``) must leave completed requests of each
    run it cuts (``run`` names the run in the message); one that outlasts a run is an
    error, not a table of NaN."""
    after = requests[(requests["arrival_s"] >= cut_s) & (requests["status"] == "completed")]
    if after.empty:
        t = requests["arrival_s"]
        span = float(t.max() - t.min()) if len(t) else 0.0
        raise ConfigError(field, value, f"a warm-up shorter than the runs: it leaves no "
                          f"completed request of {run}, whose requests arrive over "
                          f"{span:.4g} s")
