"""The simulation calls of the diffusion side: ``simulate_diffusion`` (``cluster=diffusion``)
and ``simulate_mixed`` (``cluster=mixed``: LLM replicas and diffusion nodes in one SimPy
environment). Like ``sim.engine.run.simulate`` they take tables (the job table of
``scenarios.diffusion.build_jobs``, columns ``sim.diffusion.job.JOB_COLUMNS``) and return
records; they import neither scenarios nor analysis. A job's ``height``, ``width`` or
``frames`` of 0 is its pipeline's default (``sim.diffusion.shapes.resolve_sizes``), filled in
before the pool runs, so the records hold the real shape. Ctrl-C stops the event loop between two
events and returns what was simulated so far, marked partial.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import simpy

from sim.builders import plain
from sim.diffusion.constant_cost import ConstantDiffusionCost
from sim.diffusion.job import DiffusionCost
from sim.diffusion.pool import NodePool
from sim.diffusion.records import DiffusionRecords
from sim.diffusion.shapes import Pipelines, resolve_sizes
from sim.engine.run import build_llm, llm_records, run_until, unfinished_rows
from sim.errors import ConfigError
from sim.records import Records


def build_diffusion_cost(cfg) -> DiffusionCost:
    """The ``DiffusionCost`` that ``cluster.job_cost`` names: the roofline pipelines of
    ``sim.diffusion.cost`` on ``hardware`` (with ``backend``'s calibration), or fixed times."""
    j = cfg.cluster.job_cost
    if j.name == "constant":
        return ConstantDiffusionCost.from_config(j)
    try:
        from sim.diffusion.cost import DiffusionCostModel
    except ImportError:  # the roofline pipelines are not in this checkout
        raise ConfigError("cluster.job_cost.name", j.name, "constant (the diffusion roofline "
                          "cost model sim.diffusion.cost is not available)") from None
    return DiffusionCostModel.from_config(plain(cfg))


def _pool(env, cfg, jobs: pd.DataFrame, cost, progress) -> NodePool:
    jobs = resolve_sizes(jobs, Pipelines.of_run(cfg))  # 0: the pipeline's default size
    return NodePool(env, cfg.cluster, int(cfg.hardware.gpus_per_node), cost, jobs,
                    seed=int(getattr(cfg, "seed", 0)), progress=progress,
                    check_invariants=bool(getattr(cfg, "check_invariants", False)))


def _finish(pool: NodePool, env, interrupted: bool) -> DiffusionRecords:
    records = pool.records(float(env.now), partial=interrupted)
    if interrupted:
        records.meta["interrupted_at_sim_s"] = float(env.now)
    elif pool.checker is not None:
        pool.checker.check("at the end of the run")
    return records


def simulate_diffusion(cfg, jobs: pd.DataFrame, progress=None, cost=None) -> DiffusionRecords:
    """Run the node pool of ``cfg.cluster`` over ``jobs``; its records. ``cost``: a
    ``DiffusionCost`` (default: ``build_diffusion_cost(cfg)``); ``progress``: a tqdm-like
    object updated by ended job counts."""
    env = simpy.Environment()
    pool = _pool(env, cfg, jobs, cost or build_diffusion_cost(cfg), progress)
    interrupted = run_until(env, pool.done, unfinished_rows(pool.table.completion))
    return _finish(pool, env, interrupted)


def simulate_mixed(cfg, requests: pd.DataFrame, jobs: pd.DataFrame, progress=None,
                   keep_itl_samples: bool = False, cost=None) -> tuple[Records,
                                                                       DiffusionRecords]:
    """LLM replicas (``cfg.cluster.replicas`` of ``cfg.model``) over ``requests`` and the
    diffusion pool (``cfg.cluster.nodes``) over ``jobs``, in one environment, until both have
    ended; the records of each."""
    env = simpy.Environment()
    llm = build_llm(env, cfg, requests, progress, keep_itl_samples)
    pool = _pool(env, cfg, jobs, cost or build_diffusion_cost(cfg), progress)
    done = env.all_of([llm.arrivals.done, pool.done])
    requests_left = unfinished_rows(llm.table.completion)
    jobs_left = unfinished_rows(pool.table.completion)
    interrupted = run_until(env, done, lambda: np.concatenate([requests_left(),
                                                               -1 - jobs_left()]))
    return llm_records(llm, interrupted), _finish(pool, env, interrupted)
