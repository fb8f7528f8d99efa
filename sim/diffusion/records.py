"""What the diffusion node pool emits: one row per job, and node occupancy over time.

``JobTable`` holds one numpy array per column, indexed by job id (the row of the job table
``scenarios`` produced); ``DiffusionRecords.jobs`` becomes ``jobs.parquet``. Node occupancy
changes (a gang starts or ends, a node fails or comes back) are appended to a
``sim.records.ColumnBuffer`` and become ``nodes.parquet``. Definitions in docs/metrics.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from sim.records import ColumnBuffer

JOB_STATUS = ("pending", "queued", "running", "completed", "rejected", "failed")
PENDING, QUEUED, RUNNING, COMPLETED, REJECTED, FAILED = range(len(JOB_STATUS))
JOB_ENDED = (COMPLETED, REJECTED, FAILED)
# why a job was refused at arrival: no gang size of the pool has a valid plan for its shape
JOB_REJECT_REASONS = ("", "no_valid_plan")
NO_VALID_PLAN = 1
# why a job ended without completing: its nodes failed more than cluster.failure.max_retries
# times, or every node is lost for good (cluster.failure.mttr_s null)
JOB_FAIL_REASONS = ("", "retries_exhausted", "no_node_left")
RETRIES_EXHAUSTED, NO_NODE_LEFT = 1, 2
NODE_COLUMNS = {"time_s": "f8", "node": "i4", "busy_gpus": "i4", "running_jobs": "i4",
                "up": "?"}


class JobTable:
    """Per job: what the pool did with it, as columnar arrays indexed by job id."""

    def __init__(self, jobs: pd.DataFrame) -> None:
        n = len(jobs)
        self.size = n
        self.arrival = jobs["arrival_time_s"].to_numpy(np.float64).copy()
        self.images = jobs["images"].to_numpy(np.int64)
        self.frames = jobs["frames"].to_numpy(np.int64)
        self.priority = jobs["priority"].to_numpy(np.int64)
        nan = np.full(n, np.nan)
        self.start, self.first_step, self.completion = nan.copy(), nan.copy(), nan.copy()
        self.service = np.zeros(n)  # seconds holding GPUs, over every run
        self.step_s = nan.copy()  # seconds per denoising step of its last plan
        self.node = np.full(n, -1, np.int32)
        self.gpus = np.zeros(n, np.int32)
        self.plan = np.full(n, -1, np.int32)  # index into ``labels``
        self.steps = np.zeros(n, np.int64)
        self.steps_done = np.zeros(n, np.int64)
        self.preemptions = np.zeros(n, np.int32)
        self.restarts = np.zeros(n, np.int32)
        self.batch = np.ones(n, np.int32)  # jobs run together in its gang
        self.status = np.zeros(n, np.int8)
        self.reject_reason = np.zeros(n, np.int8)
        self.fail_reason = np.zeros(n, np.int8)
        self.labels: list[str] = []
        self._label_ids: dict[str, int] = {}

    def label_id(self, label: str) -> int:
        """The code of a plan label (added on first use)."""
        i = self._label_ids.get(label)
        if i is None:
            i = self._label_ids[label] = len(self.labels)
            self.labels.append(label)
        return i

    def frame(self, jobs: pd.DataFrame) -> pd.DataFrame:
        """``jobs.parquet``: the job's own columns, then what happened to it."""
        labels = np.array([*self.labels, ""], dtype=object)
        own = [c for c in jobs.columns if c != "arrival_time_s"]
        out = pd.DataFrame({"job_id": np.arange(self.size)})
        for c in own:
            out[c] = jobs[c].to_numpy()
        out = out.assign(
            arrival_s=self.arrival, start_s=self.start, first_step_s=self.first_step,
            completion_s=self.completion, service_s=self.service, step_s=self.step_s,
            node=self.node, gpus=self.gpus, plan=labels[self.plan],
            # the resolved count once started (0 in the workload: the pipeline's default)
            steps=np.where(self.steps > 0, self.steps, jobs["steps"].to_numpy(np.int64)),
            steps_done=self.steps_done, num_preemptions=self.preemptions,
            num_restarts=self.restarts, batch_size=self.batch,
            status=np.array(JOB_STATUS)[self.status],
            reject_reason=np.array(JOB_REJECT_REASONS)[self.reject_reason],
            fail_reason=np.array(JOB_FAIL_REASONS)[self.fail_reason])
        return out


def node_buffer() -> ColumnBuffer:
    """An empty ``nodes.parquet`` buffer: (time, node, busy GPUs, running gangs, up)."""
    return ColumnBuffer(NODE_COLUMNS, capacity=1024)


@dataclass
class DiffusionRecords:
    """Everything a node pool produced, for ``analysis`` to summarise and plot.

    ``jobs``: one row per job (docs/metrics.md); ``nodes``: one row per change of a node's
    occupancy, with the state after it (the first rows: every node idle at time 0);
    ``meta``: nodes, GPUs per node, node failures, policy; ``partial`` when Ctrl-C stopped
    the run.
    """

    jobs: pd.DataFrame
    nodes: pd.DataFrame
    meta: dict = field(default_factory=dict)

    @property
    def partial(self) -> bool:
        """Whether the run was stopped before every job ended (Ctrl-C)."""
        return bool(self.meta.get("partial", False))
