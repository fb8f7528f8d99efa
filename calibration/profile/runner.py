"""Runs a plan: every kernel shape through a timer within the time budget, then the
collectives, writing each table as soon as its op is done (a run cut short keeps its tables).
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

from calibration.profile.args import ProfileArgs
from calibration.profile.shapes import TABLES, Plan, estimate_seconds, make_plan
from calibration.profile.timing import TimingConfig
from calibration.profile.writer import TableResult, collection_meta, save_table
from sim.errors import ConfigError

# Only the ratio between ops matters here: it splits the budget in proportion to the work.
NOMINAL_FLOPS, NOMINAL_BW = 9.9e14, 4.8e12
COMM_BUDGET_FRACTION = 0.15
PROGRESS_EVERY = 500


def profile_kernels(plan: Plan, kernels, timer, cfg: TimingConfig, budget_s: float | None,
                    clock: Callable[[], float] = time.monotonic,
                    log: Callable[[str], None] = print) -> Iterator[tuple[str, TableResult]]:
    """Measure each op's shapes; yield ``(op, result)`` as each op finishes.

    With a budget, each op gets the time left times its share of the remaining estimated work
    (``shapes.estimate_seconds``); shapes past an op's deadline are counted as not measured.
    A shape that fails (unsupported dtype, out of memory) is recorded with its reason.
    """
    weight = {op: estimate_seconds(Plan(plan.name, {op: s}, warmup=cfg.warmup,
                                        repeats=cfg.repeats), NOMINAL_FLOPS, NOMINAL_BW)
              for op, s in plan.shapes.items()}
    start, ops = clock(), list(plan.shapes)
    for pos, op in enumerate(ops):
        shapes, res = plan.shapes[op], TableResult(planned=len(plan.shapes[op]))
        deadline = None
        if budget_s is not None:
            left = sum(weight[o] for o in ops[pos:])
            share = weight[op] / left if left > 0 else 1.0
            deadline = clock() + max(0.0, budget_s - (clock() - start)) * share
        op_start = clock()
        for j, shape in enumerate(shapes):
            if deadline is not None and clock() >= deadline:
                res.not_measured = len(shapes) - j
                break
            try:
                built = kernels.build(shape)
                stats = timer.measure(built.fn, cfg).stats()
                res.rows.append({**shape.columns(), "kernel_source": built.source, **stats})
            except Exception as e:  # any failure of one shape must not lose the others
                res.fail(shape.columns(), e)
            built = None
            kernels.release()
            if (j + 1) % PROGRESS_EVERY == 0:
                log(f"  {op}: {j + 1}/{res.planned} shapes, {clock() - op_start:.0f} s")
        log(f"{op}: {len(res.rows)}/{res.planned} shapes in {clock() - op_start:.1f} s "
            f"({sum(len(v) for v in res.failures.values())} failed, "
            f"{res.not_measured} left when the budget ran out)")
        yield op, res


def comm_tables(results: list[dict]) -> dict[tuple, TableResult]:
    """Collective measurements by (family, framework folder, version, table), all world sizes
    in one table: ``comm/<backend>/<backend version>/nccl_perf``, the folder and columns of
    aiconfigurator's NCCL tables. (Not also ``custom_allreduce_perf``: that table holds the
    frameworks' own all-reduce kernels, and torch.distributed's all-reduce is NCCL's.)"""
    tables: dict[tuple, TableResult] = {}
    for r in results:
        t = tables.setdefault(("comm", r["backend"], r["version"], "nccl_perf"), TableResult())
        for f in r["failures"]:
            t.planned += 1
            t.fail({k: f[k] for k in ("op_name", "message_size", "num_gpus")},
                   RuntimeError(f["error"]))
        for row in r["rows"]:
            t.planned += 1
            t.rows.append({"op_name": row["op_name"],
                           "kernel_source": f"torch.distributed.{row['op_name']} ({r['backend']})",
                           "nccl_dtype": "bfloat16", **row})
    return tables


def _timing_text(args: ProfileArgs, cfg: TimingConfig, rotate_bytes: float) -> str:
    if args.device == "cpu":
        return (f"time.perf_counter around back-to-back calls on one CPU thread; "
                f"{cfg.warmup} warm-up calls, "
                f"{cfg.repeats} samples per shape of enough calls to last >= "
                f"{cfg.min_sample_s * 1e3:g} ms (column calls_per_sample)")
    how = "CUDA-graph replays of" if args.graph else "CUDA-event-timed"
    return (f"{how} back-to-back calls, so a sample lasts >= {cfg.min_sample_s * 1e3:g} ms "
            f"(at most {cfg.max_calls} calls, column calls_per_sample); {cfg.warmup} eager "
            f"warm-up calls; {cfg.repeats} samples per shape; operands rotated over copies "
            f"totalling >= {rotate_bytes / 2**20:.0f} MiB (2x L2) so calls read from HBM; "
            "column timing says cuda_graph, or cuda_events where capture failed; collectives: "
            "20 eager calls per sample, slowest rank per sample")


def run(args: ProfileArgs, overrides: list[str], log: Callable[[str], None] = print) -> int:
    """Profile on the device ``args`` name and write the tables; 0 when rows were written."""
    if args.out_dir.exists() and (not args.out_dir.is_dir() or any(args.out_dir.iterdir())):
        raise ConfigError("out_dir", str(args.out_dir), "a new or empty folder (tables of "
                          "two runs must not mix under one collection_meta.yaml)")
    try:
        import torch
    except ImportError:
        raise ConfigError("device", args.device, "the profiler needs PyTorch, which is not "
                          "installed (pip install -e '.[profile]')") from None
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", "cuda", "no CUDA GPU is visible to torch "
                          "(device=cpu runs the smoke test)")
    from calibration.profile.env import environment
    from calibration.profile.ops import TorchKernels
    from calibration.profile.timing import CudaTimer, WallClockTimer

    if args.device == "cpu":  # the smoke test checks the format; one thread keeps it steady
        torch.set_num_threads(1)  # on a loaded machine (two threads wait on time slices)
    env = environment(args.device)
    gpus = args.gpus
    if gpus is None:
        n = env.get("gpu_count", 1)
        gpus = tuple(2 ** p for p in range(1, 4) if 2 ** p <= n) if args.device == "cuda" else ()
    elif args.device == "cuda" and "comm" in args.ops and max(gpus) > env["gpu_count"]:
        raise ConfigError("gpus", ",".join(map(str, gpus)),
                          f"world sizes of at most {env['gpu_count']} (GPUs visible)")
    plan = make_plan(args.plan, args.ops, args.seed)
    cfg = TimingConfig(warmup=plan.warmup if args.warmup is None else args.warmup,
                       repeats=plan.repeats if args.repeats is None else args.repeats)
    rotate = 2.0 * (env.get("l2_cache_bytes") or 0) if args.device == "cuda" else 0.0
    timer = CudaTimer(args.graph) if args.device == "cuda" else WallClockTimer()
    kernels = TorchKernels(args.device, rotate, args.seed)
    run_comm = "comm" in args.ops and bool(gpus) and bool(plan.comm_sizes)
    budget = args.budget_s
    if budget is not None and run_comm:
        budget *= 1.0 - COMM_BUDGET_FRACTION
    meta = collection_meta(
        {k: v for k, v in env.items() if k != "device_name"},
        shlex.join(getattr(sys, "orig_argv", sys.argv)), overrides,
        {"name": plan.name, "seed": args.seed, "warmup": cfg.warmup, "repeats": cfg.repeats,
         "budget_s": args.budget_s, "collective_world_sizes": list(gpus) if run_comm else []},
        datetime.now(UTC).isoformat(timespec="seconds"), _timing_text(args, cfg, rotate))
    log(f"profiling plan={plan.name} on {env['device_name']} (torch {env['torch']}, "
        f"CUDA {env['cuda']}, driver {env['driver']}): {plan.count()} kernel shapes"
        + (f", collectives at {list(gpus)} ranks" if run_comm else ""))
    written: list[tuple[Path, TableResult]] = []
    for op, res in profile_kernels(plan, kernels, timer, cfg, budget, log=log):
        fam, table, op_name = TABLES[op]
        path = save_table(args.out_dir, (fam, "torch", env["torch"], table), op_name, res,
                          env["device_name"], meta)
        written.append((path, res))
    if run_comm:
        from calibration.profile.collectives import measure_collectives

        kernels = None  # rank 0 shares GPU 0 with this process: give its cached memory back
        if args.device == "cuda":
            torch.cuda.empty_cache()

        results = measure_collectives(args.device, gpus, plan.comm_sizes, plan.comm_ops, cfg)
        for key, res in comm_tables(results).items():
            path = save_table(args.out_dir, key, "all_reduce", res, env["device_name"], meta)
            written.append((path, res))
    for path, res in written:
        log(f"{len(res.rows):6d} rows  {res.status()['status']:8s} {path}")
    if any(res.rows for _, res in written):
        from calibration.profile.summary import summarize

        log(summarize(args.out_dir).to_string(index=False, float_format="%.4g"))
    return 0 if any(res.rows for _, res in written) else 1
