"""What the node pool queues and runs: a ``Unit``, one job or a batch of same-shape image
jobs that run as one gang, with its progress (encoded prompt, steps done) and its run."""

from __future__ import annotations

import math

from sim.diffusion.job import JobShape


class Unit:
    """Jobs that run as one gang: one job, or a batch of same-shape image jobs."""

    __slots__ = ("uid", "ids", "shape", "sid", "key", "priority", "seq", "encoded", "steps_done",
                 "predicted_s", "node", "gpus", "timing", "run_start", "run_id", "draining",
                 "restarts")

    def __init__(self, uid: int, ids: list[int], shape: JobShape, key: tuple, priority: int,
                 seq: int) -> None:
        self.uid, self.ids, self.shape, self.key = uid, ids, shape, key
        self.sid = -1  # the pool's id of ``shape`` (its timing cache key)
        self.priority, self.seq = priority, seq
        self.encoded, self.steps_done, self.restarts = False, 0, 0
        self.predicted_s = 0.0
        self.node, self.gpus, self.timing = -1, 0, None
        self.run_start, self.run_id, self.draining = math.nan, 0, False

    @property
    def fresh(self) -> bool:
        """Never started: it may still join a batch."""
        return not self.encoded and self.steps_done == 0 and self.restarts == 0 and \
            self.timing is None
