"""Which kernels run a video VAE's 3D convolutions, and how fast (docs/diffusion.md, *The VAE
decode*): the check of the channels-first CUDA-core class (``sim/cost/conv3d.py``), which was
inferred from whole jobs on two GPUs.

Times ``F.conv3d`` (3×3×3, stride 1, padding 1, no bias) at the layers of HunyuanVideo's VAE
decoder on one 17 × 32 × 32-latent tile, in the reference layout (channels-first, contiguous
NCDHW) and in ``torch.channels_last_3d``, in fp16 (the official ``--vae-precision``) and
bf16, with CUDA events after warm-up and ``torch.backends.cudnn.benchmark`` off (as the
reference code runs). Prints, per case, the milliseconds, the TFLOP/s and their fraction of
the bf16 tensor peak and of the FP32 peak given on the command line, and the GPU kernels
``torch.profiler`` saw for one call of each layout (their names say tensor cores or not:
``xmma``/``hmma``/``wgmma``/``sm90`` are tensor-core kernels; ``vol2col`` is PyTorch's fallback).
Writes ``conv3d_probe.csv`` to ``--out``.

    python scripts/conv3d_probe.py --out DIR [--bf16-tflops 989.4 --fp32-tflops 67]
    python scripts/conv3d_probe.py --out /tmp/p --device cpu --tiny     # a dry run

Needs torch (``pip install '.[profile]'``); not part of the simulator or its tests.
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import torch
import torch.nn.functional as F

# (name, input channels, output channels, frames, height, width) of one tile's decoder layers
# (up levels deepest first; the time and space sizes after each level's up-sampling)
LAYERS = (("mid", 512, 512, 17, 32, 32), ("up1", 512, 512, 33, 128, 128),
          ("up2", 256, 256, 65, 256, 256), ("up3", 128, 128, 65, 256, 256))
TINY = (("tiny", 16, 16, 3, 8, 8),)


def timed(fn, device: str, reps: int) -> float:
    """Seconds per call of ``fn`` after two warm-up calls."""
    for _ in range(2):
        fn()
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / reps
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def kernels(fn, device: str) -> str:
    """The GPU kernels (or CPU ops) one call runs, by total time, as ``name x count``."""
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
    rows = prof.key_averages()
    key = "device_time_total" if device == "cuda" else "cpu_time_total"
    rows = sorted(rows, key=lambda r: getattr(r, key, 0.0), reverse=True)
    if device == "cuda":
        rows = [r for r in rows if getattr(r, "device_time_total", 0.0) > 0
                and not r.key.startswith(("aten::", "cudnn::"))]
    return "; ".join(f"{r.key[:90]} x{r.count}" for r in rows[:4])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="one small layer (a dry run)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--bf16-tflops", type=float, default=989.4)
    ap.add_argument("--fp32-tflops", type=float, default=67.0)
    a = ap.parse_args(argv)
    torch.backends.cudnn.benchmark = False
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    print(f"torch {torch.__version__} | cuDNN {cudnn} | device {a.device}"
          + (f" | {torch.cuda.get_device_name(0)}" if a.device == "cuda" else ""))
    dtypes = (torch.float16, torch.bfloat16) if a.device == "cuda" else (torch.float32,)
    rows = []
    for name, cin, cout, t, h, w in (TINY if a.tiny else LAYERS):
        flops = 2.0 * cout * cin * 27 * t * h * w
        for dtype in dtypes:
            for layout in ("channels_first", "channels_last"):
                fmt = (torch.channels_last_3d if layout == "channels_last"
                       else torch.contiguous_format)
                x = torch.randn(1, cin, t, h, w, device=a.device, dtype=dtype)
                x = x.contiguous(memory_format=fmt)
                wt = torch.randn(cout, cin, 3, 3, 3, device=a.device, dtype=dtype)
                wt = wt.contiguous(memory_format=fmt)

                def call(x=x, wt=wt):
                    return F.conv3d(x, wt, padding=1)

                s = timed(call, a.device, a.reps)
                tflops = flops / s / 1e12
                row = {"layer": name, "c_in": cin, "c_out": cout, "t": t, "h": h, "w": w,
                       "dtype": str(dtype).removeprefix("torch."), "layout": layout,
                       "ms": round(s * 1e3, 3), "tflops": round(tflops, 2),
                       "of_bf16_peak": round(tflops / a.bf16_tflops, 3),
                       "of_fp32_peak": round(tflops / a.fp32_tflops, 3),
                       "kernels": kernels(call, a.device)}
                rows.append(row)
                print(f"{name} {cin}->{cout} {t}x{h}x{w} {row['dtype']} {layout}: "
                      f"{row['ms']} ms, {row['tflops']} TFLOP/s ({row['of_bf16_peak']} of bf16 "
                      f"peak, {row['of_fp32_peak']} of FP32 peak) | {row['kernels']}")
                del x, wt
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "conv3d_probe.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"written to {out / 'conv3d_probe.csv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
