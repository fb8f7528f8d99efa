"""The per-step timeline written as it is produced, so a run's memory does not grow with its
steps: each replica hands ``StreamedSteps`` its rows, which go to one ``TimelineFile`` as
parquet row groups of at most ``ROW_GROUP_ROWS`` rows.

The file has the columns and types of an in-memory timeline written by pandas (``replica``,
the step columns, ``bound`` and ``kind`` as dictionary-coded strings), but its rows are in
row groups each from one replica (or the KV transfers of a disaggregated run), in that
replica's time order: sort by ``time_s`` to interleave the replicas. It is written under a
temporary name and moved into place when the run closes it, so a reader never sees half a
file under the final name.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sim.cost.base import BOUNDS
from sim.errors import OutputError
from sim.records import ColumnBuffer, StepTotals

ROW_GROUP_ROWS = 1 << 16  # rows a replica holds before they are written
KINDS = ("step", "kv_transfer")  # codes of the ``kind`` column
_CODED = {"bound": BOUNDS, "kind": KINDS}


def _arrow_type(name: str, dtype: str) -> pa.DataType:
    if name in _CODED:
        return pa.dictionary(pa.int8(), pa.string())
    return pa.from_numpy_dtype(np.dtype(dtype))


class TimelineFile:
    """One run's ``timeline.parquet``, written a row group at a time."""

    def __init__(self, path: Path, columns: dict[str, str]) -> None:
        """``columns``: the step columns and their numpy dtypes (``TIMELINE_COLUMNS``)."""
        self.path = Path(path)
        self.tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        self.columns = {"replica": "i4", **columns, "kind": "i1"}
        self.schema = pa.schema([(n, _arrow_type(n, d)) for n, d in self.columns.items()])
        self._dictionaries = {n: pa.array(v, pa.string()) for n, v in _CODED.items()}
        self._writer: pq.ParquetWriter | None = None
        self.rows = 0

    def write(self, replica, kind: int, columns: dict[str, np.ndarray]) -> None:
        """Append ``columns`` (the step columns, equal lengths) of the rows of ``replica`` (an
        id, or one per row) of ``kind`` (0: engine steps, 1: KV transfers), in row groups of
        at most ``ROW_GROUP_ROWS`` rows."""
        n = len(next(iter(columns.values())))
        if not n:
            return
        full = {"replica": np.broadcast_to(np.asarray(replica, np.int32), (n,)), **columns,
                "kind": np.full(n, kind, np.int8)}
        arrays = []
        for name, dtype in self.columns.items():
            values = np.asarray(full[name], dtype=dtype)
            if name in _CODED:
                arrays.append(pa.DictionaryArray.from_arrays(pa.array(values, pa.int8()),
                                                             self._dictionaries[name]))
            else:
                arrays.append(pa.array(values))
        try:
            if self._writer is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._open()
            self._writer.write_table(pa.Table.from_arrays(arrays, schema=self.schema),
                                     row_group_size=ROW_GROUP_ROWS)
        except OSError as e:
            raise OutputError(self.path, e) from e
        self.rows += n

    def _open(self) -> None:
        # dictionary-encode the coded columns only: tried on every float and count column
        # it doubled the write time (and the read time) and did not shrink the file
        self._writer = pq.ParquetWriter(self.tmp, self.schema, use_dictionary=list(_CODED))

    def close(self) -> Path:
        """Finish the file and move it to ``path`` (an empty timeline is a file too)."""
        try:
            if self._writer is None:
                self._open()
            self._writer.close()
            os.replace(self.tmp, self.path)
        except OSError as e:
            raise OutputError(self.path, e) from e
        return self.path

    def abort(self) -> None:
        """Drop what was written (the run ended without results)."""
        if self._writer is not None:
            self._writer.close()
        self.tmp.unlink(missing_ok=True)


class StreamedSteps:
    """One replica's timeline rows on their way to a ``TimelineFile`` (at most ``rows`` held
    at a time), with the ``StepTotals`` the run's summary reads. Takes the rows as a timeline
    ``ColumnBuffer`` does (``append``/``extend`` in ``TIMELINE_COLUMNS`` order)."""

    def __init__(self, sink: TimelineFile, replica: int, columns: dict[str, str],
                 rows: int | None = None) -> None:
        """``rows``: most rows held before they are written (None: ``ROW_GROUP_ROWS``)."""
        self.sink, self.replica = sink, int(replica)
        self.rows = int(rows if rows is not None else ROW_GROUP_ROWS)
        self.names = list(columns)
        self.buffer = ColumnBuffer(columns, capacity=self.rows)
        self.totals = StepTotals()

    def append(self, *values) -> None:
        """One step."""
        self.totals.append(*values)
        self.buffer.append(*values)
        if len(self.buffer) >= self.rows:
            self.flush()

    def extend(self, k: int, *columns) -> None:
        """``k`` steps (a decode window, or a compiled chunk): arrays of length k or scalars."""
        self.totals.extend(k, *columns)
        if len(self.buffer) + k > self.rows:
            self.flush()
        if k >= self.rows:  # more than a row group: straight to the file
            self.sink.write(self.replica, 0, {n: np.broadcast_to(c, (k,))
                                              for n, c in zip(self.names, columns, strict=True)})
            return
        self.buffer.extend(k, *columns)
        if len(self.buffer) >= self.rows:
            self.flush()

    def flush(self) -> None:
        """Write the rows held."""
        if len(self.buffer):
            frame = self.buffer.to_frame(copy=False)
            self.sink.write(self.replica, 0, {n: frame[n].to_numpy() for n in self.names})
            self.buffer.clear()

    def __len__(self) -> int:
        return len(self.totals)

    def to_dict(self) -> dict:
        """The replica's step totals, JSON-ready (``StepTotals.to_dict``)."""
        return self.totals.to_dict()
