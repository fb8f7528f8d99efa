"""At the edges (issue 20): a run says when it is not a steady state, and no result is lost
or mixed with another run's.

- Every run reports the offered and served rates and whether it was overloaded, first in the
  printed table and in ``summary.json``; rejections by reason; nothing completed: exit 1.
- SIGTERM is handled like Ctrl-C; the metrics are written before any plot; an output dir
  that already holds a run is refused; a full disk is one line; a sweep never counts old
  jobs; a report embeds only its run's files; a killed joblib job fails alone.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import runpy
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

import cli.app
from analysis.collect import collect_sweep
from analysis.report import run_is_complete

# a replica that serves 1 request at a time in 5 steps of 20 ms: about 10 req/s
QUEUE = ["cost_model=constant", "cost_model.step_time_ms=20", "scheduler.max_num_seqs=1",
         "workload=poisson", "workload.input_tokens=100", "workload.output_tokens=5",
         "workload.num_requests=300", "progress=false", "plots=false"]
# one node whose FLUX.1-dev jobs (50 steps of 100 ms) hold all its GPUs: 0.2 jobs/s
POOL = ["workload=diffusion", "model=flux1_dev", "cluster=diffusion", "cluster.nodes=1",
        "cluster.job_cost.name=constant", "cluster.job_cost.step_ms=100",
        "workload.num_requests=200", "progress=false", "plots=false"]
TINY = ["workload.num_requests=20", "progress=false", "plots=false"]


def _cfg(*overrides: str):
    with initialize_config_module("conf", version_base=None):
        return compose("config", overrides=list(overrides))


def _env() -> dict[str, str]:
    env = dict(os.environ, CI="1")
    env.pop("HYDRA_FULL_ERROR", None)
    return env


def _main(*argv: str) -> int:
    """``python -m sim ARGV`` in this process (Hydra, callbacks and all); its exit code."""
    root = logging.getLogger()
    handlers, level, old_argv = root.handlers[:], root.level, sys.argv
    sys.argv = ["sim", *argv]
    try:
        runpy.run_module("sim", run_name="__main__")
        return 0
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    finally:  # the in-process Hydra run set up logging to this test's captured streams
        sys.argv = old_argv
        for h in root.handlers:
            if h not in handlers:
                h.close()
        root.handlers[:] = handlers
        root.setLevel(level)
        GlobalHydra.instance().clear()


def _summary(d: Path) -> dict:
    return json.loads((d / "summary.json").read_text())


def _no_temp_files(d: Path) -> bool:
    return not [p.name for p in d.iterdir() if p.name.startswith(".") and p.name != ".hydra"]


# ---- A. say when a run is not a steady state ---------------------------------------------


@pytest.mark.parametrize("rate, overloaded", [(20, True), (3, False)])
def test_llm_run_says_whether_it_is_overloaded(tmp_path, capsys, rate, overloaded):
    summary = cli.app.run(_cfg(*QUEUE, f"workload.rate={rate}"), tmp_path)
    doc = _summary(tmp_path)
    assert doc["offered_rate"] == pytest.approx(rate, rel=0.15)
    assert doc["overloaded"] is overloaded and doc["steady"] is (not overloaded)
    assert doc["closed_loop"] is False
    assert summary["overloaded"] is overloaded
    first = capsys.readouterr().out.splitlines()[0]
    served = f"served {doc['request_throughput']:.2f} req/s"
    if overloaded:
        assert first.startswith(f"OVERLOADED: offered {doc['offered_rate']:.2f} req/s, {served}")
        assert "TTFT still growing" in first
    else:
        assert first == f"Steady state: offered {doc['offered_rate']:.2f} req/s, {served}"


@pytest.mark.parametrize("rate, overloaded", [(5.0, True), (0.5, False)])
def test_diffusion_run_says_whether_it_is_overloaded(tmp_path, capsys, rate, overloaded):
    cli.app.run(_cfg(*POOL, f"workload.rate={rate}"), tmp_path)
    doc = _summary(tmp_path)
    assert doc["offered_rate"] == pytest.approx(rate, rel=0.2)
    assert doc["overloaded"] is overloaded and doc["steady"] is (not overloaded)
    assert doc["jobs_overloaded"] is overloaded
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith(
        ("OVERLOADED: offered " if overloaded else "Steady state: offered ")
        + f"{doc['offered_rate']:.2f} jobs/s")
    assert re.search(r"^Offered rate \(jobs/s\)\s+\d", out, re.M)


def test_closed_loop_offered_rate_is_what_the_clients_sent(tmp_path, capsys):
    cfg = _cfg(*QUEUE, "workload=closed_loop", "workload.concurrency=4",
               "workload.input_tokens=100", "workload.output_tokens=5")
    cli.app.run(cfg, tmp_path)
    doc = _summary(tmp_path)
    assert doc["closed_loop"] is True and doc["overloaded"] is False
    # 4 clients, one request each at a time, 5 steps of 20 ms a request, about 10 req/s
    assert doc["offered_rate"] == pytest.approx(doc["request_throughput"], rel=0.1)
    out = capsys.readouterr().out
    assert "closed loop" in out.splitlines()[0] and "4 clients" in out.splitlines()[0]
    assert re.search(r"^Offered rate \(req/s, closed loop\)\s+\d", out, re.M)


def test_rejections_are_counted_by_reason_in_the_table(tmp_path, capsys):
    cfg = _cfg(*TINY, "scheduler.max_model_len=512", "workload.input.dist=uniform",
               "workload.input.low=100", "workload.input.high=1000",
               "workload.output_tokens=10")
    doc = cli.app.run(cfg, tmp_path)
    n = doc["rejected_reasons"]["exceeds_max_model_len"]
    assert 0 < n < 20
    out = capsys.readouterr().out
    assert re.search(rf"^  rejected: exceeds_max_model_len\s+{n}$", out, re.M)


def test_a_run_where_nothing_completed_exits_1_with_the_reasons(tmp_path, capsys):
    code = _main(*TINY, "scheduler.max_model_len=512", "workload.input_tokens=600",
                 f"hydra.run.dir={tmp_path}")
    captured = capsys.readouterr()
    assert code == 1
    assert "nan" not in captured.out.lower()
    lines = [ln for ln in captured.err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "no request completed" in lines[0]
    assert "20 rejected (exceeds_max_model_len: 20)" in lines[0]
    assert _summary(tmp_path)["completed"] == 0


# ---- B. never lose or mix a result ---------------------------------------------------------


def test_ctrl_c_while_plotting_keeps_the_metrics(tmp_path, monkeypatch, capsys):
    def interrupted(records, outdir):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.app, "write_plots", interrupted)
    code = _main("workload.num_requests=20", "progress=false", f"hydra.run.dir={tmp_path}")
    assert code == 130
    doc = _summary(tmp_path)
    assert doc["partial"] is False and doc["completed"] == 20 and doc["mean_ttft_ms"] > 0
    assert doc["pending_outputs"] == ["plots"] and not run_is_complete(tmp_path)
    assert (tmp_path / "requests.parquet").is_file()
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("interrupted")]
    assert len(err) == 1 and "plots" in err[0] and f"{tmp_path}/summary.json" in err[0]


def test_a_second_run_into_the_same_dir_is_refused(tmp_path, capsys):
    assert _main(*TINY, "seed=1", f"hydra.run.dir={tmp_path}") == 0
    before = {p: (tmp_path / p).read_bytes() for p in ("summary.json", ".hydra/config.yaml")}
    capsys.readouterr()
    assert _main(*TINY, "seed=2", f"hydra.run.dir={tmp_path}") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(tmp_path) in err[0] and "hydra.run.dir=" in err[0]
    assert {p: (tmp_path / p).read_bytes() for p in before} == before


def test_a_run_refused_for_bad_input_gives_its_dir_back(tmp_path, capsys):
    """The config composes but fails validation in the app (the model does not fit one
    GPU): the folder is left as it was, so the corrected command runs there."""
    run_dir = tmp_path / "run"
    assert _main(*TINY, "model=llama3_405b", f"hydra.run.dir={run_dir}") == 2
    assert not run_dir.exists()
    assert _main(*TINY, f"hydra.run.dir={run_dir}") == 0
    assert _summary(run_dir)["completed"] == 20
    own = tmp_path / "own"
    own.mkdir()
    (own / "notes.txt").write_text("mine")
    assert _main(*TINY, "model=llama3_405b", f"hydra.run.dir={own}") == 2
    assert sorted(p.name for p in own.iterdir()) == ["notes.txt"]


def test_resume_rerun_leaves_no_file_of_the_earlier_run(tmp_path):
    assert _main("workload.num_requests=20", "progress=false", f"hydra.run.dir={tmp_path}") == 0
    assert (tmp_path / "timeline.png").is_file()
    assert _main(*TINY, "seed=3", "resume=true", f"hydra.run.dir={tmp_path}") == 0
    assert not list(tmp_path.glob("*.png"))
    doc = _summary(tmp_path)
    assert doc["seed"] == 3 and OmegaConf.load(tmp_path / ".hydra/config.yaml").seed == 3
    assert run_is_complete(tmp_path)


def test_two_concurrent_runs_into_one_dir_never_mix(tmp_path):
    outdir = tmp_path / "run"
    procs = [subprocess.Popen([sys.executable, "-m", "sim", *TINY, f"seed={seed}",
                               f"hydra.run.dir={outdir}"], env=_env(), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for seed in (1, 2)]
    results = [(p.wait(timeout=120), *p.communicate()) for p in procs]
    assert sorted(code for code, _, _ in results) == [0, 2], results
    seed = _summary(outdir)["seed"]
    assert OmegaConf.load(outdir / ".hydra/config.yaml").seed == seed


@pytest.mark.parametrize("stage", ["tables", "plots"])
def test_a_full_disk_is_one_line_and_leaves_the_folder_consistent(tmp_path, monkeypatch,
                                                                   capsys, stage):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    if stage == "tables":
        monkeypatch.setattr(pd.DataFrame, "to_parquet", full)
    else:
        monkeypatch.setattr("matplotlib.figure.Figure.savefig", full)
    code = _main("workload.num_requests=20", "progress=false", f"hydra.run.dir={tmp_path}")
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "No space left" in err[0]
    assert "Traceback" not in err[0] and str(tmp_path) in err[0]
    assert _no_temp_files(tmp_path) and not run_is_complete(tmp_path)
    if stage == "tables":
        assert not (tmp_path / "summary.json").exists()
    else:  # the metrics were written before the plots
        doc = _summary(tmp_path)
        assert doc["completed"] == 20 and doc["pending_outputs"] == ["plots"]


def test_an_output_dir_that_cannot_be_made_is_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("not a folder")
    code = _main(*TINY, f"hydra.run.dir={tmp_path / 'file' / 'run'}")
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: hydra.run.dir=") and "file/run" in err[0]
    assert "is a file" in err[0]


def test_a_sweep_into_a_used_sweep_dir_is_refused(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    assert _main("-m", "seed=0", *TINY, f"hydra.sweep.dir={sweep}") == 0
    summary = (sweep / "0" / "summary.json").read_bytes()
    capsys.readouterr()
    assert _main("-m", "seed=4,5", *TINY, f"hydra.sweep.dir={sweep}") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(sweep) in err[0] and "hydra.sweep.dir=" in err[0]
    assert (sweep / "0" / "summary.json").read_bytes() == summary


def test_a_resumed_sweep_never_counts_old_jobs(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    assert _main("-m", "seed=0,1,2", *TINY, f"hydra.sweep.dir={sweep}") == 0
    capsys.readouterr()
    assert _main("-m", "seed=5,6", *TINY, "resume=true", f"hydra.sweep.dir={sweep}") == 0
    assert "sweep: 2 jobs, 0 failed" in capsys.readouterr().out
    table = pd.read_parquet(sweep / "sweep_summary.parquet")
    assert table["seed"].tolist() == [5, 6]  # job 2 (seed=2) is the earlier sweep's
    assert collect_sweep(sweep)["seed"].tolist() == [5, 6]


def test_report_embeds_only_the_plots_of_its_run(tmp_path):
    from analysis.report_md import write_report

    for name in ("latency_ecdf.png", "timeline.png"):  # timeline.png: an earlier run's
        (tmp_path / name).write_bytes(b"\x89PNG\r\n\x1a\n")
    (tmp_path / "summary.json").write_text(json.dumps(
        {"completed": 5, "rejected": 0, "partial": False,
         "outputs": ["requests.parquet", "latency_ecdf.png"],
         "load_verdict": "OVERLOADED: offered 5.00 req/s, served 1.90 req/s"}))
    text = write_report(tmp_path).read_text()
    assert "![latency_ecdf.png](latency_ecdf.png)" in text
    assert "timeline.png" not in text
    assert "**OVERLOADED: offered 5.00 req/s, served 1.90 req/s**" in text


def _holders(path: Path) -> dict[int, int]:
    """pid → parent pid of every process with ``path`` open."""
    out = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) == str(path) for fd in (proc / "fd").iterdir()):
                stat = (proc / "stat").read_text()
                out[int(proc.name)] = int(stat.rsplit(")", 1)[1].split()[1])
        except OSError:  # gone, or not ours to read
            continue
    return out


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs Linux /proc")
def test_a_killed_joblib_job_fails_alone(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    sweep = tmp_path / "sweep"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sim", "-m", "workload.num_requests=150000,20",
         "plots=false", "progress=false", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
         f"hydra.sweep.dir={sweep}"], cwd=tmp_path, env=_env(), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    log = sweep / "0" / "app.log"
    deadline = time.monotonic() + 90
    try:  # job 0 has logged its memory plan: it is simulating
        while not (log.is_file() and "num_gpu_blocks" in log.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        holders = _holders(log)
        # the process that runs the job: the one holding its log whose children do not
        job = [pid for pid in holders if pid not in holders.values()]
        assert len(job) == 1, holders
        os.kill(job[0], signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, out[-2000:] + err[-3000:]
    failed = json.loads((sweep / "0" / "failed.json").read_text())
    assert failed["error_type"] == "JobKilled" and "SIGKILL" in failed["message"]
    assert failed["overrides"][0] == "workload.num_requests=150000"
    table = pd.read_parquet(sweep / "sweep_summary.parquet")
    assert table["status"].tolist() == ["failed", "ok"]
    assert (sweep / "1" / "summary.json").is_file() and "sweep: 2 jobs, 1 failed" in out
    assert any(ln.startswith("error: job 0 (") and "JobKilled" in ln for ln in err.splitlines())
