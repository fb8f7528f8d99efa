"""Does a GPU keep its GEMM throughput under sustained load? (docs/diffusion.md, *Validation*:
the FLUX.1 step runs ~11% slower than the operator tables, which were measured in short
calls at locked clocks.)

Runs one bf16 GEMM (``--size`` cubed, 8192 by default) back to back for ``--seconds`` and
prints, per window of ``--window`` seconds, the achieved TFLOP/s and, where ``nvidia-smi`` is
present, the SM clock and power it read at the window's end: a falling rate with a falling
clock is the power cap at work. Writes ``sustained_probe.csv`` to ``--out``.

    python scripts/sustained_probe.py --out DIR [--seconds 30]
    python scripts/sustained_probe.py --out /tmp/p --device cpu --size 256 --seconds 2   # dry run

Needs torch (``pip install '.[profile]'``); not part of the simulator or its tests.
"""

from __future__ import annotations

import argparse
import csv
import shutil
import subprocess
import time
from pathlib import Path

import torch


def smi() -> tuple[str, str]:
    """(SM clock MHz, power W) as nvidia-smi reads them now ("" where it cannot)."""
    if not shutil.which("nvidia-smi"):
        return "", ""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw",
                              "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=5).stdout.strip()
        clock, power = (x.strip() for x in out.split(",")[:2])
        return clock, power
    except (OSError, ValueError, subprocess.SubprocessError):
        return "", ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--window", type=float, default=1.0)
    a = ap.parse_args(argv)
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    x = torch.randn(a.size, a.size, device=a.device, dtype=dtype)
    y = torch.randn(a.size, a.size, device=a.device, dtype=dtype)
    flops = 2.0 * a.size ** 3
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    for _ in range(3):
        x @ y
    sync()
    rows, t_start = [], time.perf_counter()
    while time.perf_counter() - t_start < a.seconds:
        t0, n = time.perf_counter(), 0
        while time.perf_counter() - t0 < a.window:
            for _ in range(8):
                x @ y
            n += 8
            sync()
        dt = time.perf_counter() - t0
        clock, power = smi()
        row = {"t_s": round(time.perf_counter() - t_start, 2),
               "tflops": round(n * flops / dt / 1e12, 2), "sm_clock_mhz": clock,
               "power_w": power}
        rows.append(row)
        print(row)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "sustained_probe.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    first, last = rows[0]["tflops"], rows[-1]["tflops"]
    print(f"first window {first} TFLOP/s, last {last} ({last / first:.3f} of the first); "
          f"written to {out / 'sustained_probe.csv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
