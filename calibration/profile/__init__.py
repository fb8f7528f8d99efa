"""GPU profiler: measures GEMM, prefill and decode attention, MoE and collectives with PyTorch
and writes them in the aiconfigurator table layout that the calibration fit reads.

    python -m calibration profile out_dir=DIR device=cuda|cpu plan=full|tiny [ops=...]

(also ``python -m calibration.profile ...``). Everything but the kernel launches (the shape
plan, the timing statistics, the writer) works without torch; torch is imported only to run.
"""

from __future__ import annotations

import sys

from sim.errors import ConfigError


def main(overrides: list[str]) -> int:
    """Run the profiler with ``key=value`` overrides; 0 on success, 2 on bad input (one line
    on stderr), 1 when no shape could be measured."""
    from calibration.profile.args import parse_overrides
    from calibration.profile.runner import run

    try:
        return run(parse_overrides(overrides), overrides)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


__all__ = ["main"]
