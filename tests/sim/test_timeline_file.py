"""The timeline streamed to ``timeline.parquet`` as the run goes (``sim.timeline_file``): the
same rows as the in-memory timeline, the same step metrics, at most a row group held per
replica, and no file left by a run that fails."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from hydra import compose, initialize_config_module

import conf.schema  # noqa: F401  (registers the config schemas)
import sim.timeline_file as tf
from analysis.metrics import step_metrics
from analysis.plots import write_plots
from scenarios import requests_for_seed
from sim import simulate
from sim.engine.replica import TIMELINE_COLUMNS

CASES = {
    "compiled": ["workload.num_requests=300"],
    "python_3_replicas": ["workload.num_requests=300", "cluster.replicas=3",
                          "scheduler=sglang", "cluster.router=jsq_tokens"],
    "disaggregated": ["workload.num_requests=200", "cluster=disagg",
                      "cluster.prefill_replicas=1", "cluster.decode_replicas=2"],
}


def config(*overrides):
    with initialize_config_module("conf", version_base=None):
        return compose("config", overrides=list(overrides))


def _sorted(tl: pd.DataFrame) -> pd.DataFrame:
    return tl.sort_values(["time_s", "replica", "kind"], kind="stable", ignore_index=True)


@pytest.mark.parametrize("case", list(CASES))
def test_the_file_holds_the_in_memory_rows_and_gives_the_same_step_metrics(
        case, tmp_path, monkeypatch):
    monkeypatch.setattr(tf, "ROW_GROUP_ROWS", 100)  # many row groups, and direct writes
    cfg = config(*CASES[case])
    req = requests_for_seed(cfg.workload, 0)
    held = simulate(cfg, req)
    streamed = simulate(cfg, req, timeline_path=tmp_path / "timeline.parquet")
    assert streamed.meta["engine"] == held.meta["engine"]
    assert len(streamed.timeline) == 0 and streamed.meta["timeline_file"] == str(
        tmp_path / "timeline.parquet")
    f = pq.ParquetFile(tmp_path / "timeline.parquet")
    assert f.metadata.num_row_groups > 2
    assert max(f.metadata.row_group(i).num_rows
               for i in range(f.metadata.num_row_groups)) <= 100
    disk = pd.read_parquet(tmp_path / "timeline.parquet")
    a, b = _sorted(held.timeline), _sorted(disk.assign(
        bound=disk["bound"].cat.codes.astype("int8"), kind=disk["kind"].cat.codes.astype("int8")))
    assert list(b.columns) == list(a.columns)
    assert (a.dtypes == b.dtypes).all()
    pd.testing.assert_frame_equal(a, b)
    m_held, m_streamed = step_metrics(held.timeline, held.meta), step_metrics(
        streamed.timeline, streamed.meta)
    assert m_held.keys() == m_streamed.keys()
    for k, v in m_held.items():
        assert m_streamed[k] == pytest.approx(v, rel=1e-9, abs=1e-12), k
    pd.testing.assert_frame_equal(held.requests, streamed.requests)


def test_the_file_reads_as_pandas_wrote_it(tmp_path):
    # the coded columns as categories, the rest in the timeline's dtypes
    cfg = config("workload.num_requests=50")
    rec = simulate(cfg, requests_for_seed(cfg.workload, 0),
                   timeline_path=tmp_path / "timeline.parquet")
    disk = pd.read_parquet(rec.meta["timeline_file"])
    assert list(disk.columns) == ["replica", *TIMELINE_COLUMNS, "kind"]
    assert list(disk["bound"].cat.categories) == ["compute", "memory", "comm", "host"]
    assert set(disk["kind"]) == {"step"}


def test_a_replica_holds_at_most_a_row_group(tmp_path):
    sink = tf.TimelineFile(tmp_path / "t.parquet", TIMELINE_COLUMNS)
    steps = tf.StreamedSteps(sink, 4, TIMELINE_COLUMNS, rows=10)
    row = (0.0, 0.01, 2, 3, 1, 2, 0, 5, 0.004, 0.006, 0.0, 0.0, 1, 0.0)
    for i in range(25):
        steps.append(float(i), *row[1:])
        assert len(steps.buffer) < 10
    steps.extend(30, np.arange(25, 55, dtype=float), *row[1:])  # more than a group: direct
    steps.extend(3, np.arange(55, 58, dtype=float), *row[1:])
    assert len(steps.buffer) == 3 and len(steps) == 58
    steps.flush()
    sink.close()
    disk = pd.read_parquet(tmp_path / "t.parquet")
    assert disk["time_s"].tolist() == [float(i) for i in range(58)]
    assert (disk["replica"] == 4).all() and steps.to_dict()["num_steps"] == 58


def test_a_failed_run_leaves_no_timeline(tmp_path, monkeypatch):
    cfg = config("workload.num_requests=50", "engine=python")
    import sim.engine.run

    def boom(*a, **k):
        raise RuntimeError("stop")

    monkeypatch.setattr(sim.engine.run, "run_until", boom)
    with pytest.raises(RuntimeError, match="stop"):
        simulate(cfg, requests_for_seed(cfg.workload, 0),
                 timeline_path=tmp_path / "timeline.parquet")
    assert list(tmp_path.iterdir()) == []


def test_plots_read_the_streamed_file(tmp_path):
    cfg = config("workload.num_requests=200", "cluster.replicas=2")
    rec = simulate(cfg, requests_for_seed(cfg.workload, 0),
                   timeline_path=tmp_path / "timeline.parquet")
    paths = write_plots(rec, tmp_path, cfg)
    assert [p.name for p in paths] == ["latency_ecdf.png", "timeline.png", "bound_share.png"]
    assert all(p.stat().st_size > 0 for p in paths)
