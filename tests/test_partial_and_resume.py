"""Nothing lost: atomic outputs, Ctrl-C keeps what was simulated (``"partial": true``, exit
130), ``summary.json`` as the completion marker, and ``resume=true`` in a sweep."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_module
from matplotlib.figure import Figure

import cli.app
from analysis.files import atomic_write, save_figure
from analysis.report import run_is_complete
from scenarios import requests_for_seed
from sim.engine.run import simulate

N = 200
FINISHED = ("completed", "rejected")


WIRE = [f"backend.frontend.{k}=0" for k in ("per_request_ms", "per_prompt_token_us",
                                            "per_output_token_us", "latency_ms")]


def _cfg(*overrides: str):
    with initialize_config_module("conf", version_base=None):
        # the engine's interrupt semantics, without a frontend streaming after the clock
        return compose("config", overrides=[f"workload.num_requests={N}", "progress=false",
                                            *WIRE, *overrides])


class StopAfter:
    """A progress object that raises KeyboardInterrupt (as Ctrl-C would) once ``n``
    requests have ended."""

    def __init__(self, n: int) -> None:
        self.n, self.ended = n, 0

    def update(self, k: int) -> None:
        self.ended += k
        if self.ended >= self.n:
            raise KeyboardInterrupt


def _interrupting_simulate(n: int):
    """``simulate`` as ``cli.app.run`` calls it, but interrupted after ``n`` requests."""
    def fake(cfg, requests, progress=None, keep_itl_samples=False, timeline_path=None):
        return simulate(cfg, requests, progress=StopAfter(n), keep_itl_samples=keep_itl_samples,
                        timeline_path=timeline_path)
    return fake


@pytest.fixture(scope="module")
def full_and_partial():
    """The same run simulated to the end and interrupted after 60 requests ended."""
    cfg = _cfg()
    requests = requests_for_seed(cfg.workload, cfg.seed)
    return simulate(cfg, requests), simulate(cfg, requests, progress=StopAfter(60))


def test_interrupted_simulation_returns_what_was_simulated(full_and_partial):
    full, part = full_and_partial
    assert not full.partial and full.meta["partial"] is False
    assert part.partial and part.meta["interrupted_at_sim_s"] == part.meta["sim_time_s"]
    assert part.meta["sim_time_s"] < full.meta["sim_time_s"]
    req = part.requests
    assert len(req) == N
    ended = req["status"].isin(FINISHED)
    assert ended.sum() >= 60 and (~ended).sum() > 0
    assert set(req.loc[~ended, "status"]) <= {"pending", "waiting", "running"}
    assert req.loc[~ended, "completion_s"].isna().all()
    assert (req.loc[ended, "completion_s"] <= part.meta["sim_time_s"]).all()
    # up to the interruption, the partial run is the full run
    done = req.index[req["status"] == "completed"]
    pd.testing.assert_frame_equal(req.loc[done], full.requests.loc[done])
    tl, full_tl = part.timeline, full.timeline
    assert 0 < len(tl) < len(full_tl) and (tl["time_s"] <= part.meta["sim_time_s"]).all()
    pd.testing.assert_frame_equal(tl, full_tl.iloc[:len(tl)])


def test_partial_run_writes_a_partial_summary_without_nan(tmp_path, monkeypatch, capsys):
    cfg = _cfg("plots=false")
    monkeypatch.setattr(cli.app, "simulate", _interrupting_simulate(50))
    summary = cli.app.run(cfg, tmp_path)
    doc = json.loads((tmp_path / "summary.json").read_text())
    assert doc["partial"] is True and summary["partial"] is True
    assert doc["interrupted_at_sim_s"] == doc["sim_time_s"] > 0
    assert doc["completed"] >= 50 and doc["unfinished"] > 0
    assert doc["completed"] + doc["rejected"] + doc.get("failed", 0) + doc["unfinished"] == N
    for key in ("duration_s", "request_throughput", "output_throughput", "mean_ttft_ms",
                "p99_ttft_ms", "mean_tpot_ms", "mean_e2el_ms", "mean_itl_ms",
                "request_goodput", "slo_attainment", "mean_batch_size"):
        assert isinstance(doc[key], float) and math.isfinite(doc[key]), key
    req = pd.read_parquet(tmp_path / "requests.parquet")
    assert (req["status"] == "completed").sum() == doc["completed"]
    assert doc["outputs"] == ["requests.parquet", "timeline.parquet"]
    assert not run_is_complete(tmp_path)
    out = capsys.readouterr().out
    assert re.search(rf"^Unfinished requests \(interrupted\)\s+{doc['unfinished']}$", out, re.M)


def test_main_exits_130_with_one_line_after_ctrl_c(tmp_path, capsys):
    summary = {"interrupted_at_sim_s": 12.5, "completed": 3, "rejected": 1, "unfinished": 7}
    with pytest.raises(SystemExit) as e:
        cli.app.interrupted(summary, tmp_path)
    assert e.value.code == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"interrupted at 12.500 simulated s: partial results (3 completed, "
                   f"1 rejected, 7 unfinished) in {tmp_path}/summary.json"]


@pytest.fixture(scope="module")
def complete_run(tmp_path_factory):
    """A complete small run with plots, through ``cli.app.run``."""
    out = tmp_path_factory.mktemp("complete")
    cfg = _cfg("workload.num_requests=40")
    return cfg, out, cli.app.run(cfg, out)


def test_complete_run_lists_its_outputs_and_is_complete(complete_run):
    cfg, out, summary = complete_run
    doc = json.loads((out / "summary.json").read_text())
    assert doc["partial"] is False and doc["unfinished"] == 0
    assert "interrupted_at_sim_s" not in doc
    assert doc["outputs"] == ["requests.parquet", "timeline.parquet", "latency_ecdf.png",
                              "timeline.png", "bound_share.png"]
    assert run_is_complete(out)
    assert cli.app.completed_summary(cfg, out) == doc
    # no temp file is left behind by the atomic writes
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]


def test_resume_needs_the_same_config(complete_run):
    cfg, out, _ = complete_run
    same = _cfg("workload.num_requests=40", "resume=true", "progress=true")
    assert cli.app.completed_summary(same, out) is not None
    other = _cfg("workload.num_requests=41")
    assert cli.app.config_digest(other) != cli.app.config_digest(cfg)
    assert cli.app.completed_summary(other, out) is None


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for p in src.iterdir():
        if p.is_file():
            (dst / p.name).write_bytes(p.read_bytes())
    return dst


@pytest.mark.parametrize("damage", ["no summary", "partial", "missing file", "failed.json",
                                    "no outputs list", "bad json"])
def test_incomplete_run_folders(complete_run, tmp_path, damage):
    d = _copy(complete_run[1], tmp_path / "run")
    assert run_is_complete(d)
    doc = json.loads((d / "summary.json").read_text())
    if damage == "no summary":
        (d / "summary.json").unlink()
    elif damage == "partial":
        (d / "summary.json").write_text(json.dumps({**doc, "partial": True}))
    elif damage == "missing file":
        (d / "timeline.png").unlink()
    elif damage == "failed.json":
        (d / "failed.json").write_text("{}")
    elif damage == "no outputs list":
        (d / "summary.json").write_text(json.dumps({k: v for k, v in doc.items()
                                                    if k != "outputs"}))
    else:
        (d / "summary.json").write_text(json.dumps(doc)[:100])
    assert not run_is_complete(d)


def test_atomic_write_keeps_the_old_file_when_writing_fails(tmp_path):
    path = tmp_path / "t.parquet"
    old = pd.DataFrame({"x": [1, 2, 3]})
    atomic_write(path, lambda p: old.to_parquet(p))

    def half_then_ctrl_c(p):
        Path(p).write_bytes(b"PAR1 truncated")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(path, half_then_ctrl_c)
    pd.testing.assert_frame_equal(pd.read_parquet(path), old)
    assert [p.name for p in tmp_path.iterdir()] == ["t.parquet"]


def test_atomic_write_gives_the_mode_of_a_plain_write(tmp_path):
    (tmp_path / "plain").write_text("x")
    atomic_write(tmp_path / "atomic", lambda p: Path(p).write_text("x"))
    assert (tmp_path / "atomic").stat().st_mode == (tmp_path / "plain").stat().st_mode
    (tmp_path / "atomic").chmod(0o640)
    atomic_write(tmp_path / "atomic", lambda p: Path(p).write_text("y"))
    assert (tmp_path / "atomic").stat().st_mode & 0o777 == 0o640


def test_rerun_interrupted_while_writing_leaves_the_folder_incomplete(complete_run, tmp_path,
                                                                      monkeypatch):
    cfg, src, _ = complete_run
    d = _copy(src, tmp_path / "run")

    def broken(self, path, **kw):
        Path(path).write_bytes(b"PAR1 half a file")
        raise KeyboardInterrupt

    monkeypatch.setattr(pd.DataFrame, "to_parquet", broken)
    with pytest.raises(KeyboardInterrupt):
        cli.app.run(cfg, d)
    # the earlier run's files were cleared before the rerun: never mixed with its own
    assert not (d / "requests.parquet").exists() and not (d / "timeline.png").exists()
    assert not (d / "summary.json").exists() and not run_is_complete(d)
    assert not [p.name for p in d.iterdir() if p.name.startswith(".")]


def test_save_figure_is_atomic_png(tmp_path):
    fig = Figure()
    fig.subplots().plot([0, 1], [1, 0])
    save_figure(fig, tmp_path / "a.png", dpi=50)
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["a.png"]


# ---- through the command line ------------------------------------------------------------


def _env() -> dict[str, str]:
    env = dict(os.environ, CI="1")
    env.pop("HYDRA_FULL_ERROR", None)
    return env


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl_c", "sigterm"])
def test_an_interrupt_on_the_cli_writes_partial_results_and_exits_130(tmp_path, sig):
    """Ctrl-C, and SIGTERM (what schedulers, ``timeout`` and container runtimes send)."""
    outdir, stdout = tmp_path / "run", tmp_path / "stdout.txt"
    with open(stdout, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "sim", "workload.num_requests=100000",
                                 "plots=false", "progress=true", f"hydra.run.dir={outdir}"],
                                env=_env(), stdout=out, stderr=subprocess.PIPE,
                                # Ctrl-C must reach it even if this shell ignores SIGINT
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    err: list[bytes] = []
    reader = threading.Thread(target=lambda: err.extend(iter(lambda: proc.stderr.read(1), b"")))
    reader.start()
    started = re.compile(rb"simulating:[^\r\n]*\|\s*[1-9]\d*/100000")
    deadline = time.monotonic() + 60
    try:  # the progress bar has counted ended requests: the event loop is running
        while not started.search(b"".join(err)):
            assert proc.poll() is None and time.monotonic() < deadline, b"".join(err)[-2000:]
            time.sleep(0.05)
        proc.send_signal(sig)
        proc.wait(timeout=60)
    finally:
        proc.kill()
        reader.join()
    stderr = b"".join(err).decode()
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr
    notice = [ln for ln in stderr.splitlines() if ln.startswith("interrupted at ")]
    assert len(notice) == 1 and f"in {outdir}/summary.json" in notice[0]
    doc = json.loads((outdir / "summary.json").read_text())
    assert doc["partial"] is True and doc["unfinished"] > 0 and doc["completed"] > 0
    assert doc["completed"] + doc["rejected"] + doc.get("failed", 0) + doc["unfinished"] == 100000
    req = pd.read_parquet(outdir / "requests.parquet")
    assert len(req) == 100000 and (req["status"] == "completed").sum() == doc["completed"]
    assert np.isnan(req.loc[req["status"] == "pending", "completion_s"]).all()
    assert "Completed requests" in stdout.read_text()
    assert not run_is_complete(outdir)


def _sweep(sweep_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sim", "-m", "seed=0,1,2",
                           "workload.num_requests=20", "plots=false", "progress=false",
                           f"hydra.sweep.dir={sweep_dir}", *extra], cwd=sweep_dir.parent,
                          env=_env(), capture_output=True, text=True, timeout=300)


def test_resume_reruns_only_the_job_without_complete_outputs(tmp_path):
    sweep = tmp_path / "sweep"
    first = _sweep(sweep)
    assert first.returncode == 0, first.stderr[-3000:]
    (sweep / "1" / "summary.json").unlink()
    mtimes = {j: (sweep / j / "requests.parquet").stat().st_mtime_ns for j in "012"}
    again = _sweep(sweep, "resume=true")
    assert again.returncode == 0, again.stderr[-3000:]
    after = {j: (sweep / j / "requests.parquet").stat().st_mtime_ns for j in "012"}
    assert after["0"] == mtimes["0"] and after["2"] == mtimes["2"]
    assert after["1"] > mtimes["1"]
    skipped = re.findall(r"job (\d+): complete outputs exist, skipped", again.stdout)
    assert skipped == ["0", "2"]
    assert again.stdout.count("Completed requests") == 1
    table = pd.read_parquet(sweep / "sweep_summary.parquet")
    assert table["seed"].tolist() == [0, 1, 2] and table["status"].tolist() == ["ok"] * 3
    assert (table["completed"] + table["rejected"] == 20).all()
    assert "sweep: 3 jobs, 0 failed" in again.stdout
    assert run_is_complete(sweep / "1")


def test_report_of_a_partial_run_says_so(tmp_path):
    from analysis.report_md import write_report

    (tmp_path / "summary.json").write_text(json.dumps(
        {"completed": 5, "rejected": 0, "partial": True, "unfinished": 9,
         "interrupted_at_sim_s": 4.5, "outputs": []}))
    text = write_report(tmp_path).read_text()
    assert ("**Partial run**: stopped by Ctrl-C at 4.5 simulated s with 9 requests unfinished"
            in text)
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_ctrl_c_during_start_up_is_one_line_and_exit_130(monkeypatch, tmp_path, capsys):
    import logging
    import runpy

    from hydra.core.global_hydra import GlobalHydra

    def interrupted_while_checking(cfg):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.app, "validate_config", interrupted_while_checking)
    monkeypatch.setattr(sys, "argv", ["sim", f"hydra.run.dir={tmp_path}", "progress=false"])
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        with pytest.raises(SystemExit) as e:
            runpy.run_module("sim", run_name="__main__")
    finally:  # the in-process Hydra run set up logging to this test's captured stderr
        for h in root.handlers:
            if h not in handlers:
                h.close()
        root.handlers[:] = handlers
        root.setLevel(level)
        GlobalHydra.instance().clear()
    assert e.value.code == 130
    err = capsys.readouterr().err.strip()
    assert err.startswith("interrupted (Ctrl-C)") and "\n" not in err and "Traceback" not in err
    assert not (tmp_path / "summary.json").exists()
