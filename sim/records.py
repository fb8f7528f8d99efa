"""What a simulation emits: flat per-request rows, a per-step timeline, and ITL samples.

Records are columnar (numpy blocks grown by doubling), never per-token Python objects. The
inter-token latencies are kept as a log-binned histogram with exact per-bin sums (relative
bin width 0.1%), optionally with the raw samples too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd


class ColumnBuffer:
    """Append-only table of numeric columns, stored as growing numpy arrays."""

    def __init__(self, dtypes: dict[str, str], capacity: int = 4096) -> None:
        self._cols = {k: np.empty(capacity, dtype=v) for k, v in dtypes.items()}
        self._n = 0

    def append(self, *values) -> None:
        """Add one row; values in the column order given at construction."""
        n = self._n
        if n == len(next(iter(self._cols.values()))):
            for k, a in self._cols.items():
                self._cols[k] = np.concatenate([a, np.empty_like(a)])
        for a, v in zip(self._cols.values(), values, strict=True):
            a[n] = v
        self._n = n + 1

    def extend(self, k: int, *columns) -> None:
        """Add ``k`` rows; one array of length k (or a scalar, repeated) per column, in order."""
        while self._n + k > len(next(iter(self._cols.values()))):
            for name, a in self._cols.items():
                self._cols[name] = np.concatenate([a, np.empty_like(a)])
        for a, c in zip(self._cols.values(), columns, strict=True):
            a[self._n: self._n + k] = c
        self._n += k

    def __len__(self) -> int:
        return self._n

    def clear(self) -> None:
        """Forget the rows (their storage is reused)."""
        self._n = 0

    def to_frame(self, copy: bool = True) -> pd.DataFrame:
        """The rows appended so far (``copy=False``: views of the buffer, for a frame built
        once at the end of a run, which then owns the memory)."""
        return pd.DataFrame({k: a[: self._n].copy() if copy else a[: self._n]
                             for k, a in self._cols.items()}, copy=False)


class SharedTimeline:
    """The timeline rows of every replica of a run in one ``ColumnBuffer`` (a ``replica``
    column first), in the order they were added: one buffer to grow and to sort at the end,
    however many replicas (``rows_of`` gives each replica its own way in)."""

    def __init__(self, dtypes: dict[str, str]) -> None:
        """``dtypes``: the step columns (``replica`` is added in front)."""
        self.buffer = ColumnBuffer({"replica": "i4", **dtypes})
        self.replicas = 0

    def rows_of(self, replica: int) -> ReplicaRows:
        """What replica ``replica`` appends its rows to."""
        self.replicas = max(self.replicas, int(replica) + 1)
        return ReplicaRows(self.buffer, replica)

    def extend(self, k: int, replica: np.ndarray, *columns) -> None:
        """``k`` rows of the replicas ``replica`` (an array of k ids), then the step columns."""
        if k:
            self.replicas = max(self.replicas, int(replica.max()) + 1)
        self.buffer.extend(k, replica, *columns)

    def to_frame(self, ordered: bool = True) -> pd.DataFrame:
        """Every row, by time and then replica, each replica's rows in the order it added
        them (a stable sort; one replica's are already in time order), with the buffer's
        memory; ``ordered=False``: as added (for a caller that sorts them with more)."""
        frame = self.buffer.to_frame(copy=False)
        if self.replicas <= 1 or not ordered:
            return frame
        order = np.lexsort((frame["replica"].to_numpy(), frame["time_s"].to_numpy()))
        return pd.DataFrame({c: frame[c].to_numpy()[order] for c in frame.columns}, copy=False)


class ReplicaRows:
    """One replica's way into a ``SharedTimeline``: takes its rows as a ``ColumnBuffer``
    would (``append``/``extend`` in the step columns' order)."""

    __slots__ = ("buffer", "replica")

    def __init__(self, buffer: ColumnBuffer, replica: int) -> None:
        self.buffer, self.replica = buffer, int(replica)

    def append(self, *values) -> None:
        """One step."""
        self.buffer.append(self.replica, *values)

    def extend(self, k: int, *columns) -> None:
        """``k`` steps: arrays of length k or scalars."""
        self.buffer.extend(k, self.replica, *columns)


def _total(x, k: int) -> float:
    """Sum of a window's column: an array of its k steps, or one value for all of them."""
    return float(np.sum(x)) if np.ndim(x) else float(x) * k


class StepTotals:
    """Running totals of one replica's engine steps, instead of one timeline row each.

    Takes the same rows as a timeline ``ColumnBuffer`` (``append``/``extend`` with the
    timeline's columns in order: time_s, step_time_s, batch_size, …, swap_s) and keeps what
    the summary's step metrics need: step count, time, time-weighted sums of batch size and KV
    blocks in use, the largest KV use, and the time of each roof. Its memory does not grow
    with the run, so ``timeline: false`` runs of millions of steps stay flat.
    """

    __slots__ = ("num_steps", "time_s", "batch_time", "kv_time", "max_kv_blocks",
                 "compute_s", "memory_s", "comm_s", "host_s")

    def __init__(self) -> None:
        self.num_steps = 0
        self.time_s = self.batch_time = self.kv_time = 0.0
        self.compute_s = self.memory_s = self.comm_s = self.host_s = 0.0
        self.max_kv_blocks = 0

    def append(self, _start, step_s, batch_size, _sched, _prefill, _decode, _queue, kv_used,
               compute_s, memory_s, comm_s, host_s, _bound, _swap_s) -> None:
        """Count one step."""
        self.num_steps += 1
        self.time_s += step_s
        self.batch_time += batch_size * step_s
        self.kv_time += kv_used * step_s
        self.max_kv_blocks = max(self.max_kv_blocks, int(kv_used))
        self.compute_s += compute_s
        self.memory_s += memory_s
        self.comm_s += comm_s
        self.host_s += host_s

    def extend(self, k: int, _starts, step_s, batch_size, _sched, _prefill, _decode, _queue,
               kv_used, compute_s, memory_s, comm_s, host_s, _bound, _swap_s) -> None:
        """Count ``k`` steps (a decode window: arrays of length k, or scalars repeated)."""
        step_s = np.broadcast_to(step_s, (k,))
        kv_used = np.broadcast_to(kv_used, (k,))
        self.num_steps += k
        total = float(step_s.sum())
        self.time_s += total
        # (products summed, not ``np.dot``: BLAS's threads cost milliseconds a call on a busy
        # machine, for a few thousand rows)
        self.batch_time += float((np.broadcast_to(batch_size, (k,)) * step_s).sum())
        self.kv_time += float((kv_used * step_s).sum())
        self.max_kv_blocks = max(self.max_kv_blocks, int(kv_used.max()))
        self.compute_s += _total(compute_s, k)
        self.memory_s += _total(memory_s, k)
        self.comm_s += _total(comm_s, k)
        self.host_s += _total(host_s, k)

    def __len__(self) -> int:
        return self.num_steps

    def to_dict(self) -> dict:
        """The totals, JSON-ready."""
        return {k: getattr(self, k) for k in self.__slots__}


class LogHistogram:
    """Histogram of positive durations in log-spaced bins, with exact count, sum and bin sums."""

    LOW_S = 1e-7
    RATIO = 1.001
    NUM_BINS = int(math.ceil(math.log(1e4 / LOW_S) / math.log(RATIO))) + 1

    def __init__(self, keep_samples: bool = False) -> None:
        self.counts = np.zeros(self.NUM_BINS, np.int64)
        self.sums = np.zeros(self.NUM_BINS, np.float64)
        self._samples: list[np.ndarray] | None = [] if keep_samples else None
        self._log_ratio = math.log(self.RATIO)

    def _bin(self, v):
        idx = np.floor(np.log(np.maximum(v, self.LOW_S) / self.LOW_S) / self._log_ratio)
        return np.clip(idx, 0, self.NUM_BINS - 1).astype(np.int64)

    def _bin_scalar(self, v: float) -> int:
        idx = math.floor(math.log(max(v, self.LOW_S) / self.LOW_S) / self._log_ratio)
        return min(max(idx, 0), self.NUM_BINS - 1)

    def add(self, values: np.ndarray) -> None:
        """Add a batch of durations in seconds."""
        if not len(values):
            return
        if self._samples is not None:
            self._samples.append(np.array(values, dtype=np.float64))
        first = float(values[0])
        if values.min() == values.max():  # the usual decode step: every gap is the same
            b = self._bin_scalar(first)
            self.counts[b] += len(values)
            self.sums[b] += first * len(values)
        else:
            b = self._bin(values)
            np.add.at(self.counts, b, 1)
            np.add.at(self.sums, b, values)

    def add_repeated(self, values: np.ndarray, times: int) -> None:
        """Add each duration of ``values`` ``times`` times (one decode step's gaps)."""
        if not len(values) or times <= 0:
            return
        if self._samples is not None:
            self._samples.append(np.repeat(np.asarray(values, dtype=np.float64), times))
        b = self._bin(values)
        np.add.at(self.counts, b, times)
        np.add.at(self.sums, b, values * times)

    @property
    def count(self) -> int:
        """Number of durations added."""
        return int(self.counts.sum())

    @property
    def total(self) -> float:
        """Sum of all durations added."""
        return float(self.sums.sum())

    def samples(self) -> np.ndarray | None:
        """Raw durations, when kept."""
        if self._samples is None:
            return None
        return np.concatenate(self._samples) if self._samples else np.empty(0)

    def quantile(self, q: float) -> float:
        """q-quantile (0..1) with numpy's linear interpolation between the two ranks around
        ``(n − 1)·q``, each rank's value taken as the mean of the bin that holds it."""
        n = self.count
        if n == 0:
            return float("nan")
        cum = np.cumsum(self.counts)
        h = (n - 1) * q
        lo, hi = math.floor(h), math.ceil(h)
        b_lo, b_hi = np.searchsorted(cum, [lo + 1, hi + 1], side="left")
        v_lo = self.sums[b_lo] / self.counts[b_lo]
        v_hi = self.sums[b_hi] / self.counts[b_hi]
        return float(v_lo + (h - lo) * (v_hi - v_lo))


@dataclass
class Records:
    """Everything one simulation produced, for ``analysis`` to summarise and plot.

    ``requests``: one row per request (see ``docs/metrics.md`` for columns);
    ``timeline``: one row per engine step (empty with ``timeline: false``, when
    ``meta["step_totals"]`` has each replica's ``StepTotals`` instead); ``itl``: inter-token
    latencies; ``meta``: derived facts of the run (KV blocks, memory budget, ...; ``partial``
    and ``interrupted_at_sim_s`` when Ctrl-C stopped it early).
    """

    requests: pd.DataFrame
    timeline: pd.DataFrame
    itl: LogHistogram
    meta: dict = field(default_factory=dict)

    @property
    def partial(self) -> bool:
        """Whether the run was stopped before every request ended (Ctrl-C)."""
        return bool(self.meta.get("partial", False))
