"""Fit truncated lognormal length distributions to a CSV of request lengths.

``python -m scenarios.fit_lengths PATH [--low-input 1 --high-input 8192 --low-output 1
--high-output 1024]`` fits, by maximum likelihood, a lognormal truncated to ``[low, high]`` to
the ``input_tokens`` and ``output_tokens`` columns of PATH and prints YAML for the ``input:`` and
``output:`` blocks of a ``conf/workload`` file, with the data's quantiles next to the model's as
comments. Rows outside ``[low, high]`` are left out of the fit (their count is reported).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize, special, stats

from scenarios.errors import WorkloadError
from scenarios.lengths import read_length_column, truncated_lognormal_ppf

QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9, 0.99)


@dataclass
class LognormalFit:
    """A fitted truncated lognormal: log-space ``mu``/``sigma`` on ``[low, high]``."""

    mu: float
    sigma: float
    low: int
    high: int
    n: int  # rows used by the fit
    dropped: int  # rows outside [low, high]


def truncated_lognormal_nll(
    mu: float, sigma: float, x: np.ndarray, low: float, high: float
) -> float:
    """Negative log-likelihood ``-sum(logpdf(x)) + n log(F(high) - F(low))`` of a truncated
    lognormal (scipy's ``lognorm(s=sigma, scale=exp(mu))``) at data ``x`` inside the bounds."""
    logpdf = stats.lognorm.logpdf(x, s=sigma, scale=np.exp(mu))
    a, b = (np.log(low) - mu) / sigma, (np.log(high) - mu) / sigma
    # log(Phi(b) - Phi(a)), stable in both tails.
    if a > 0:
        a, b = -b, -a
    log_mass = special.log_ndtr(b) + np.log1p(-np.exp(special.log_ndtr(a) - special.log_ndtr(b)))
    return float(-logpdf.sum() + x.size * log_mass)


def fit_truncated_lognormal(x: np.ndarray, low: int, high: int) -> LognormalFit:
    """Maximum-likelihood ``mu``, ``sigma`` of a lognormal truncated to ``[low, high]``."""
    x = np.asarray(x, dtype=float)
    inside = x[(x >= low) & (x <= high)]
    if inside.size < 2:
        raise ValueError(f"need at least 2 values in [{low}, {high}], got {inside.size}")
    logs = np.log(inside)
    start = np.array([logs.mean(), np.log(max(logs.std(), 1e-3))])

    def nll(p: np.ndarray) -> float:
        value = truncated_lognormal_nll(p[0], np.exp(p[1]), inside, low, high)
        return value if np.isfinite(value) else 1e300

    res = optimize.minimize(
        nll, start, method="Nelder-Mead", options={"xatol": 1e-7, "fatol": 1e-7, "maxiter": 20000}
    )
    res = optimize.minimize(nll, res.x, method="L-BFGS-B")
    return LognormalFit(
        float(res.x[0]),
        float(np.exp(res.x[1])),
        int(low),
        int(high),
        int(inside.size),
        int(x.size - inside.size),
    )


def format_fit(block: str, fit: LognormalFit, data: np.ndarray) -> str:
    """YAML for one length block (``input``/``output``) with data-vs-model quantile comments."""
    q = np.array(QUANTILES)
    data_q = np.quantile(data, q)
    model_q = truncated_lognormal_ppf(q, fit.mu, fit.sigma, fit.low, fit.high)
    lines = [
        f"# {block}: {fit.n} rows in [{fit.low}, {fit.high}]"
        + (f" ({fit.dropped} outside, left out)" if fit.dropped else ""),
        "#   quantile    data   model",
    ]
    lines += [
        f"#   p{100 * p:<8g} {d:7.0f} {m:7.0f}" for p, d, m in zip(q, data_q, model_q, strict=True)
    ]
    lines += [
        f"{block}:",
        "  dist: lognormal",
        f"  mu: {fit.mu:.4f}",
        f"  sigma: {fit.sigma:.4f}",
        f"  low: {fit.low}",
        f"  high: {fit.high}",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry: fit both columns of PATH and print YAML; exit 2 on bad input."""
    parser = argparse.ArgumentParser(
        prog="python -m scenarios.fit_lengths", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("path", help="CSV with input_tokens and output_tokens columns")
    parser.add_argument("--low-input", type=int, default=1)
    parser.add_argument("--high-input", type=int, default=8192)
    parser.add_argument("--low-output", type=int, default=1)
    parser.add_argument("--high-output", type=int, default=1024)
    args = parser.parse_args(argv)
    blocks = []
    for block, low, high in (
        ("input", args.low_input, args.high_input),
        ("output", args.low_output, args.high_output),
    ):
        if not 1 <= low <= high:
            print(
                f"--low-{block}={low}, --high-{block}={high}: need 1 <= low <= high",
                file=sys.stderr,
            )
            return 2
        try:
            data = read_length_column(args.path, f"{block}_tokens", "path")
            fit = fit_truncated_lognormal(data, low, high)
        except (WorkloadError, ValueError) as e:
            print(f"{block}: {e}", file=sys.stderr)
            return 2
        blocks.append(format_fit(block, fit, data))
    print(f"# fitted by: python -m scenarios.fit_lengths {args.path}")
    print("\n".join(blocks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
