"""Shortest predicted job first: the job with the least predicted remaining service time
starts next (ties: arrival order); non-preemptive."""

from __future__ import annotations

from sim.diffusion.policies.base import Policy


class SJFPolicy(Policy):
    """Orders by ``unit.predicted_s``: the cost model's time of the work the job has left on
    the reference gang (``cluster.gpus_per_job``, or a whole node when elastic)."""

    name = "sjf"

    def key(self, unit) -> tuple:
        """Predicted remaining time, then arrival order."""
        return (unit.predicted_s, unit.seq)
