"""Token-length distributions: fixed, uniform, truncated lognormal, empirical (resampled CSV),
and vLLM's random dataset (``random_dataset_lengths``).

``sample_lengths`` draws ``n`` integer lengths >= 1 for one ``LengthConfig`` from the generator
it is given (the run's lengths stream) and nothing else.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from scenarios.bench_datasets import random_length_bounds
from scenarios.errors import WorkloadError
from scenarios.input_file import read_input_file
from scenarios.trace_formats import csv_header, read_csv_columns


def _lognorm(mu: float, sigma: float):
    return stats.lognorm(s=sigma, scale=np.exp(mu))


def truncated_lognormal_ppf(
    q: np.ndarray | float, mu: float, sigma: float, low: float, high: float
) -> np.ndarray:
    """Quantile function of a lognormal(mu, sigma) truncated to ``[low, high]`` (continuous).

    ``F^-1(F(low) + q (F(high) - F(low)))`` with scipy's ``lognorm(s=sigma, scale=exp(mu))``;
    through the survival function when the window lies in the upper tail, where the CDF would
    lose precision, and through scipy's log-space ``truncnorm`` when the window's probability
    underflows (a window many sigmas away from the median).
    """
    d = _lognorm(mu, sigma)
    q = np.asarray(q, dtype=float)
    if low >= high:
        return np.full(q.shape, float(low))
    if d.cdf(low) <= 0.5:
        a, b = d.cdf(low), d.cdf(high)
        x = d.ppf(a + q * (b - a))
    else:
        a, b = d.sf(low), d.sf(high)
        x = d.isf(a - q * (a - b))
    if not abs(b - a) > 1e-250:
        za, zb = (np.log(low) - mu) / sigma, (np.log(high) - mu) / sigma
        x = np.exp(stats.truncnorm.ppf(q, za, zb, loc=mu, scale=sigma))
    return np.clip(x, low, high)


def sample_truncated_lognormal(
    mu: float, sigma: float, low: int, high: int, n: int, rng: np.random.Generator
) -> np.ndarray:
    """``n`` integer lengths from a lognormal truncated to ``[low, high]``, sampled exactly.

    Inverse-CDF sampling: ``u ~ U(0, 1)`` mapped through the truncated quantile function
    (``x = F^-1(F(low) + u (F(high) - F(low)))``), rounded to the nearest int and clipped to
    ``[low, high]``. No rejection, so any window, however far in a tail, costs the same.
    """
    x = truncated_lognormal_ppf(rng.uniform(size=n), mu, sigma, low, high)
    return np.clip(np.rint(x), low, high).astype(np.int64)


def read_length_column(path: str, column: str, field: str) -> np.ndarray:
    """Read one integer column (all values >= 1) of a CSV, for empirical resampling (the file
    read once, by content: ``scenarios.input_file``).

    Any problem (missing file or column, empty, non-numeric, non-integer or < 1 values) raises
    one ``WorkloadError`` naming ``field`` (the config path of ``path``).
    """
    src = read_input_file(path, field)
    try:
        header = csv_header(src)
        # as text: messages quote the cell as written
        raw = read_csv_columns(src, [column])[column] if column in header else None
    except (ValueError, pd.errors.ParserError) as e:  # UnicodeDecodeError included
        raise WorkloadError(field, path, f"cannot read as CSV ({e})") from None
    if raw is None:
        raise WorkloadError(field, path, f"missing column {column!r} (has {header})")
    values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=float)
    if values.size == 0:
        raise WorkloadError(field, path, f"column {column!r} has no rows")
    bad = ~np.isfinite(values) | (values != np.floor(values)) | (values < 1)
    if bad.any():
        i = int(np.argmax(bad))
        raise WorkloadError(field, path, f"column {column!r} {src.row(raw.index[i])} is "
                            f"{raw.iloc[i]!r}; lengths must be integers >= 1")
    return values.astype(np.int64)


def sample_lengths(
    length: Any, n: int, rng: np.random.Generator, field: str, default_column: str
) -> np.ndarray:
    """Draw ``n`` int64 lengths >= 1 from one ``LengthConfig``.

    ``field`` is the config path of ``length`` (e.g. ``workload.input``), used in error messages;
    ``default_column`` is the CSV column an empirical distribution resamples when it names none.
    """
    if length.dist == "fixed":
        return np.full(n, int(length.value), dtype=np.int64)
    if length.dist == "uniform":
        return rng.integers(
            int(length.low), int(length.high), size=n, endpoint=True, dtype=np.int64
        )
    if length.dist == "lognormal":
        return sample_truncated_lognormal(
            float(length.mu), float(length.sigma), int(length.low), int(length.high), n, rng
        )
    if length.dist == "empirical":
        if not length.path:
            raise WorkloadError(
                f"{field}.path",
                length.path,
                "a CSV file to resample is required when dist is 'empirical'",
            )
        values = read_length_column(
            str(length.path), length.column or default_column, f"{field}.path"
        )
        return rng.choice(values, size=n, replace=True).astype(np.int64)
    raise WorkloadError(
        f"{field}.dist", length.dist, "one of ['fixed', 'uniform', 'lognormal', 'empirical']"
    )


def split_total_lengths(
    total_length: Any, prefill_fraction: float, n: int, rng: np.random.Generator, field: str
) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``n`` total lengths from ``total_length`` and split each into (input, output).

    As Vidur's synthetic workloads (a total length with a prefill:decode ratio; 3:1 is
    ``prefill_fraction=0.75``): ``input = round(prefill_fraction · total)``, clipped to
    ``[1, total - 1]`` so both parts have at least one token, and ``output = total - input``.
    """
    total = sample_lengths(total_length, n, rng, field, "total_tokens")
    if n and int(total.min()) < 2:
        raise WorkloadError(field, int(total.min()), "total lengths must be >= 2 to split")
    inputs = np.clip(np.rint(prefill_fraction * total), 1, total - 1).astype(np.int64)
    return inputs, total - inputs


def random_dataset_lengths(
    rd: Any, n: int, rng_in: np.random.Generator, rng_out: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` (own prompt tokens, output tokens) of vLLM's random dataset (``workload.random``):
    uniform integers between ``random_length_bounds``, inputs from ``rng_in`` and outputs from
    ``rng_out``. The shared prefix is added by ``scenarios.prefixes.add_shared_prefix``."""
    (in_low, in_high), (out_low, out_high) = random_length_bounds(rd)
    inputs = rng_in.integers(in_low, in_high, size=n, endpoint=True, dtype=np.int64)
    outputs = rng_out.integers(out_low, out_high, size=n, endpoint=True, dtype=np.int64)
    return inputs, outputs
