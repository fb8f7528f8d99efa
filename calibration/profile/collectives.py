"""Collectives over ``torch.distributed``: one process per GPU (NCCL) or per CPU rank (gloo).

For each world size, ``torch.multiprocessing.spawn`` starts the ranks, which meet through a
file store in a temporary folder (no network), time every (collective, message size) with the
same number of back-to-back calls per sample on every rank (so no rank waits on a call the
others never make), and take the slowest rank's time per sample, as nccl-tests does.
``message_size`` counts bfloat16 elements of the full buffer (nccl-tests' size): the reduced
buffer for all_reduce, the gathered output for all_gather, the scattered input for
reduce_scatter, each rank's send buffer for alltoall.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path

from calibration.profile.timing import Measurement, TimingConfig

CALLS_PER_SAMPLE = 20


def _collective(op: str, n: int, world: int, device):
    """A zero-argument launch of ``op`` on ``n`` elements, or None if ``n`` does not split."""
    import torch
    import torch.distributed as dist

    if n % world:
        return None
    x = torch.randn(n, device=device).to(torch.bfloat16)
    if op == "all_reduce":
        return lambda: dist.all_reduce(x)
    if op == "all_gather":
        part, out = x[: n // world].clone(), torch.empty_like(x)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: gather(out, part)
    if op == "reduce_scatter":
        out = torch.empty(n // world, device=device, dtype=torch.bfloat16)
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: scatter(out, x)
    if op == "alltoall":
        out = torch.empty_like(x)
        return lambda: dist.all_to_all_single(out, x)
    raise ValueError(f"unknown collective {op!r}")


def _worker(rank: int, world: int, device_type: str, sizes: list[int], ops: list[str],
            cfg: dict, store: str, out_file: str) -> None:
    import torch
    import torch.distributed as dist

    from calibration.profile.env import nccl_version
    from calibration.profile.timing import CudaTimer, WallClockTimer

    if device_type == "cuda":
        torch.cuda.set_device(rank)
        device, backend, timer = torch.device("cuda", rank), "nccl", CudaTimer(use_graph=False)
    else:
        device, backend, timer = torch.device("cpu"), "gloo", WallClockTimer()
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank,
                            world_size=world, timeout=timedelta(minutes=5))
    tcfg = TimingConfig(**cfg)
    rows, failures = [], []
    try:
        for op in ops:
            for n in sizes:
                try:
                    launch = _collective(op, n, world, device)
                    if launch is None:
                        continue
                    m = timer.measure(lambda i, f=launch: f(), tcfg)
                    slowest = torch.tensor(m.samples_s, dtype=torch.float64, device=device)
                    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                    stats = Measurement(slowest.cpu().numpy(), m.method, m.calls).stats()
                    rows.append({"op_name": op, "message_size": n, "num_gpus": world, **stats})
                except RuntimeError as e:  # op unsupported by the backend, or out of memory
                    failures.append({"op_name": op, "message_size": n, "num_gpus": world,
                                     "error": f"{type(e).__name__}: {str(e).splitlines()[0]}"})
                    if device_type == "cuda":
                        torch.cuda.empty_cache()
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if rank == 0:
        version = str(torch.__version__) if backend == "gloo" else nccl_version()
        Path(out_file).write_text(json.dumps({"backend": backend, "version": version,
                                              "rows": rows, "failures": failures}))


def measure_collectives(device_type: str, world_sizes: tuple[int, ...], sizes: list[int],
                        ops: tuple[str, ...], cfg: TimingConfig) -> list[dict]:
    """One result per world size: ``{backend, version, rows, failures}`` from rank 0."""
    import torch.multiprocessing as mp

    cfg = TimingConfig(**{**asdict(cfg), "fixed_calls": CALLS_PER_SAMPLE})
    results = []
    for world in world_sizes:
        with tempfile.TemporaryDirectory(prefix="profile_comm_") as tmp:
            out = Path(tmp) / "rank0.json"
            mp.spawn(_worker, args=(world, device_type, list(sizes), list(ops), asdict(cfg),
                                    str(Path(tmp) / "store"), str(out)),
                     nprocs=world, join=True)
            results.append(json.loads(out.read_text()))
    return results
