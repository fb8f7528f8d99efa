"""The Hydra callback that writes a multirun's ``sweep_summary.parquet`` and ``.csv``.

Registered under ``hydra.callbacks`` in ``conf/config.yaml``. Hydra calls
``on_multirun_end`` in the launching process once every job has returned, whichever
launcher ran them (basic, joblib, Ray, submitit), so the table sees every job's folder; it
holds this sweep's jobs only, never the folders an earlier sweep left in the same directory
(``analysis.sweep_jobs``).
"""

from __future__ import annotations

import sys
from typing import Any

import pandas as pd
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from analysis.collect import failure_lines, write_sweep_summary
from sim.errors import ConfigError


class SweepSummary(Callback):
    """At the end of a multirun, aggregate its job folders into one table in the sweep dir."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Write the table and print where it is, how many jobs failed, and one line per
        failed (or interrupted) job with its overrides and error."""
        sweep_dir = str(config.hydra.sweep.dir)
        try:
            out = write_sweep_summary(sweep_dir)
        except ConfigError as e:  # no job folder here, e.g. the nodes share no file system
            print(f"sweep summary not written: {e}", file=sys.stderr)
            return
        table = pd.read_parquet(out)
        lines = failure_lines(table)
        print(f"sweep: {len(table)} jobs, {len(lines)} failed → {out} (and .csv)")
        for line in lines:
            print(line)
