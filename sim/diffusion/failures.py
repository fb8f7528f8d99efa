"""Node failures of the diffusion node pool (``cluster.failure``, ``cluster.checkpointing``).

Each node fails after exponential times of mean ``mtbf_s`` (its own stream
``(NODE_FAULT_STREAM, node)`` under the run's ``SeedSequence``) and comes back empty
``mttr_s`` later, or never (``mttr_s`` null). A failure stops every gang on the node: with
checkpointing a job keeps its completed steps (and its encoded prompt), else it starts over;
it queues again, which counts as one restart. The failure that ends a job is not a restart:
a job already restarted ``max_retries`` times fails (``retries_exhausted``), and when the
last node is lost for good the jobs on it and every waiting job fail (``no_node_left``).
"""

from __future__ import annotations

import math

import numpy as np

from sim.diffusion.records import FAILED, NO_NODE_LEFT, RETRIES_EXHAUSTED

NODE_FAULT_STREAM = 8  # spawn key under the run SeedSequence (cluster 2, 4; faults 5, 6; jobs 7)
EPS = 1e-9  # relative slack when counting the steps done


class NodeFailures:
    """The failure process of each node of one ``NodePool``, and what a failure does."""

    def __init__(self, pool, seed: int) -> None:
        self.pool = pool
        self.log: list[list] = []  # [node, down at, up at (NaN: still down)]
        f = pool.c.failure
        if f.mtbf_s is not None:
            for node in range(pool.n):
                ss = np.random.SeedSequence(seed, spawn_key=(NODE_FAULT_STREAM, node))
                pool.env.process(self._process(node, np.random.default_rng(ss)))

    def _process(self, node: int, rng: np.random.Generator):
        p, f = self.pool, self.pool.c.failure
        while True:
            yield p.env.timeout(rng.exponential(f.mtbf_s))
            entry = [node, p.env.now, np.nan]
            self.log.append(entry)
            self.fail(node, lost=f.mttr_s is None)
            if f.mttr_s is None:
                return
            yield p.env.timeout(f.mttr_s)
            self.repair(node)
            entry[2] = p.env.now

    @staticmethod
    def progress(unit, now: float) -> tuple[int, bool]:
        """(steps completed, prompt encoded) of a running ``unit`` at ``now``."""
        tm = unit.timing
        enc = 0.0 if unit.encoded else tm.encode_s
        encoded = unit.encoded or now >= unit.run_start + enc
        done = unit.steps_done
        if encoded and tm.step_s > 0:
            done += int(math.floor((now - unit.run_start - enc) / tm.step_s + EPS))
        return min(done, tm.steps), encoded

    def fail(self, node: int, lost: bool = False) -> None:
        """Node ``node`` goes down now (``lost``: for good): its gangs stop and queue again
        (from their last completed step with checkpointing, else from the start), or fail
        (module doc)."""
        p = self.pool
        now, limit = p.env.now, p.c.failure.max_retries
        p.up[node] = False
        p.free[node] = 0
        victims = list(p.running[node])
        last = lost and p.lost_nodes + 1 == p.n  # no node will ever run them again
        p.dispatching = True  # requeue them all before anything starts again
        try:
            for u in victims:
                done, encoded = self.progress(u, now)
                if p.c.checkpointing:
                    p.stop(u, done, encoded)
                else:
                    p.stop(u, 0, False)
                if limit is not None and u.restarts >= limit:
                    p.end(u.ids, FAILED, fail=RETRIES_EXHAUSTED)
                elif last:
                    p.end(u.ids, FAILED, fail=NO_NODE_LEFT)
                else:
                    u.restarts += 1
                    p.table.restarts[u.ids] += 1
                    p.enqueue(u)
        finally:
            p.dispatching = False
        p.draining[node] = 0
        if lost:
            p.lost_nodes += 1
            if p.lost_nodes == p.n:
                self.give_up()
        if not victims:  # else each stopped gang logged the node's new state
            p.log_node(node)
        p.check("after a node failed")
        p.dispatch()

    def give_up(self) -> None:
        """Every node is lost for good: whatever waits fails."""
        p = self.pool
        waiting = p.queue.units() + p.batcher.drop_open()
        for u in waiting:
            p.queue.remove(u)
            p.end(u.ids, FAILED, fail=NO_NODE_LEFT)

    def repair(self, node: int) -> None:
        """Node ``node`` is back, empty."""
        self.pool.bring_up(node, "after a node was repaired")
