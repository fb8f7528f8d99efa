"""What a finished cluster hands over to its ``Records``: every replica's steps as one
timeline (in memory, or the run's timeline file finished), the step totals a run without a
timeline keeps, and the run's derived facts (replica layout, failures, faults, frontend)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from sim.engine.cluster import Cluster
from sim.engine.faults import fault_meta
from sim.engine.replica import TIMELINE_COLUMNS
from sim.records import ColumnBuffer


def cluster_timeline(cluster: Cluster) -> pd.DataFrame:
    """Every replica's steps (and KV transfers), with its ``replica`` id, in time order
    (no rows when the run keeps step totals only, or wrote them to its timeline file,
    which this finishes)."""
    if cluster.timeline_file is not None:
        _finish_timeline_file(cluster)
    if not cluster.keep_timeline:
        tl = ColumnBuffer(TIMELINE_COLUMNS, capacity=0).to_frame()
        tl.insert(0, "replica", np.empty(0, np.int32))
        return tl.assign(kind=np.empty(0, np.int8))
    disagg = cluster.disagg
    tl = cluster.shared_timeline.to_frame(ordered=disagg is None)
    tl["kind"] = np.int8(0)
    if disagg is None:
        return tl
    tl = pd.concat([tl, disagg.timeline()], ignore_index=True)
    return tl.sort_values(["time_s", "replica"], kind="stable", ignore_index=True)

def _finish_timeline_file(cluster: Cluster) -> None:
    """Write what the replicas still hold and the KV transfers, and close the file."""
    f = cluster.timeline_file
    for pool in cluster.pools:
        for rep in pool.replicas:
            rep.steps.flush()
    if cluster.disagg is not None:
        rows = cluster.disagg.timeline()
        f.write(rows["replica"].to_numpy(), 1,
                {c: rows[c].to_numpy() for c in TIMELINE_COLUMNS})
    f.close()
    cluster.timeline_file, cluster.timeline_path = None, f.path  # finished once

def step_totals(cluster: Cluster) -> list[dict]:
    """Per replica (by run-wide id), its ``StepTotals`` as a dict (``timeline: false``)."""
    return [rep.steps.to_dict() for pool in cluster.pools for rep in pool.replicas]


def run_meta(cluster: Cluster, sim_time_s: float) -> dict:
    """Derived facts of the run: the first pool's replica facts, the layout of every
    replica, the failures, and the fault settings and episodes."""
    meta = dict(cluster.pools[0].parts[0].meta)
    pools, blocks = [], []
    for pool in cluster.pools:
        pools += [pool.name] * len(pool.replicas)
        blocks += [pool.parts[0].meta["num_gpu_blocks"]] * len(pool.replicas)
    log = np.array(cluster.failure_log, float).reshape(-1, 3)
    down = np.minimum(np.nan_to_num(log[:, 2], nan=sim_time_s), sim_time_s) - log[:, 1]
    meta.update(num_replicas=len(pools), replica_pools=pools,
                replica_num_gpu_blocks=blocks, num_failures=len(log),
                replica_downtime_s=float(down.sum()),
                failures=[{"replica": int(g), "down_s": float(a),
                           "up_s": None if np.isnan(b) else float(b)} for g, a, b in log])
    meta.update(fault_meta(cluster.cfg.cluster, cluster.speeds, cluster.link, sim_time_s))
    meta["frontend"] = cluster.frontend_costs.as_dict()
    if cluster.checker is not None:
        meta["invariant_checks"] = cluster.checker.counts()
    if cluster.autoscaler is not None:
        meta["autoscaler"] = cluster.autoscaler.meta(sim_time_s)
    if cluster.disagg is not None:
        meta["pools"] = {p.name: dict(p.parts[0].meta) for p in cluster.pools}
    return meta
