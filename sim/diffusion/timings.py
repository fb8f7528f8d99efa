"""What the node pool asks of the cost model, cached: a job shape's timing on a gang size
(the fixed plan, or the best plan of that size), which sizes are valid, the elastic gang
size under load, and the work a unit has left."""

from __future__ import annotations

from collections.abc import Callable

from sim.diffusion.job import JobShape, JobTiming, ParallelPlan
from sim.diffusion.policies.gang import GangSizer
from sim.diffusion.unit import Unit
from sim.errors import ConfigError


class Timings:
    """The pool's view of a ``DiffusionCost``: timings per (shape, GPUs), cached by a shape
    id, since the pool asks again at every event."""

    def __init__(self, cost, plan: ParallelPlan | None, sizer: GangSizer) -> None:
        self.cost, self.plan, self.sizer = cost, plan, sizer
        self._timings: dict[tuple[int, int], JobTiming | None] = {}
        self._targets: dict[int, int | None] = {}  # elastic gang size under load, per shape
        self._shape_ids: dict[JobShape, int] = {}

    def shape_id(self, shape: JobShape) -> int:
        """The id of ``shape`` (its key in the caches)."""
        sid = self._shape_ids.get(shape)
        if sid is None:
            sid = self._shape_ids[shape] = len(self._shape_ids)
        return sid

    def timing(self, shape: JobShape, gpus: int) -> JobTiming | None:
        """The job's time on ``gpus`` GPUs (the fixed plan, or the best one); None when no
        plan of that size can run it."""
        return self.cached(shape, self.shape_id(shape), gpus)

    def cached(self, shape: JobShape, sid: int, gpus: int) -> JobTiming | None:
        """``timing`` of ``shape`` whose id ``sid`` is known."""
        k = (sid, gpus)
        if k not in self._timings:
            try:
                t = (self.cost.timing(shape, self.plan) if self.plan is not None
                     else self.cost.best(shape, gpus))
            except ConfigError:
                t = None
            self._timings[k] = t
        return self._timings[k]

    def valid(self, unit: Unit) -> Callable[[int], bool]:
        """Whether a plan of ``g`` GPUs runs ``unit``, as a function of ``g``."""
        return lambda g: self.cached(unit.shape, unit.sid, g) is not None

    def target(self, unit: Unit) -> int | None:
        """The elastic gang size of ``unit``'s shape under load (``GangSizer.target``: the
        largest size at the pool's parallel efficiency)."""
        if unit.sid not in self._targets:
            def total(g: int) -> float | None:
                t = self.cached(unit.shape, unit.sid, g)
                return None if t is None else t.total_s
            self._targets[unit.sid] = self.sizer.target(total)
        return self._targets[unit.sid]

    @staticmethod
    def remaining_s(unit: Unit, t: JobTiming) -> float:
        """Seconds of work ``unit`` has left under ``t``: the encoding unless done, the steps
        not done, the decode."""
        return ((0.0 if unit.encoded else t.encode_s) + (t.steps - unit.steps_done) * t.step_s
                + t.decode_s)

    def predict(self, unit: Unit) -> None:
        """Set ``unit.predicted_s`` (for sjf): the work left, on the largest valid size."""
        for g in reversed(self.sizer.sizes):
            t = self.cached(unit.shape, unit.sid, g)
            if t is not None:
                unit.predicted_s = self.remaining_s(unit, t)
                return

    def check_shapes(self, shapes) -> None:
        """Every job's own shape must be one its pipeline can make (and, on a fixed plan,
        one that plan runs and holds in memory): else one error naming the workload field
        (or the plan and the GiB), before the run. Under ``plan=auto`` a job that no gang
        size can run or hold is rejected when it arrives (``no_valid_plan``), as is a batch
        a fixed plan cannot run."""
        for shape in dict.fromkeys(shapes):
            try:
                if self.plan is not None:
                    self.cost.timing(shape, self.plan)
                    continue
                if not any(self.cached(shape, self.shape_id(shape), g) is not None
                           for g in self.sizer.sizes):
                    try:
                        self.cost.best(shape, max(self.sizer.sizes))
                    except ConfigError as e:
                        if e.field.startswith("job."):
                            raise  # the shape itself: refused before the run
            except ConfigError as e:
                field = e.field
                if field.startswith("job."):
                    field = "workload." + field[4:]
                raise ConfigError(field, e.value, e.expected) from None
