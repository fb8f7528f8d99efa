"""``python -m analysis.compare`` on real sweeps of ``python -m sim -m``: common random numbers
across designs, the files it writes, identical designs, bad input, and the Markdown report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pandas as pd
import pytest

from analysis.compare import main as compare_main

SMALL = ["workload.num_requests=40", "plots=false", "progress=false"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOTS = ("compare_latency_vs_rate.png", "compare_goodput_vs_rate.png", "compare_pareto.png",
         "compare_ecdf.png")


def _env() -> dict[str, str]:
    env = dict(os.environ, CI="1")
    env.pop("HYDRA_FULL_ERROR", None)
    return env


def _run(module: str, args: list[str], cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    """Two sweeps, run at once: two schedulers × two rates × two seeds, and two designs
    that cannot differ (max_num_seqs 256 vs 257 with far fewer requests in flight)."""
    cwd = tmp_path_factory.mktemp("compare")
    jobs = {
        "designs": ["-m", "scheduler=vllm,sarathi", "workload.rate=3,6", "seed=0,1", *SMALL],
        "same": ["-m", "scheduler.max_num_seqs=256,257", "seed=0,1", *SMALL],
    }
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {k: pool.submit(_run, "sim", [*a, f"hydra.sweep.dir={cwd / k}"], cwd)
                   for k, a in jobs.items()}
        procs = {k: f.result() for k, f in futures.items()}
    for k, p in procs.items():
        assert p.returncode == 0, f"sweep {k} failed:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    return {k: cwd / k for k in jobs}


def _jobs(root) -> pd.DataFrame:
    from analysis.collect import collect_sweep

    return collect_sweep(root)


def test_same_seed_gives_every_design_the_same_requests(sweeps):
    """Common random numbers: arrivals and lengths depend on the seed, not on the design."""
    t = _jobs(sweeps["designs"])
    cols = ["arrival_s", "input_tokens", "output_tokens"]
    for (_, _), g in t.groupby(["workload.rate", "seed"]):
        assert set(g["scheduler"]) == {"vllm", "sarathi"}
        frames = [pd.read_parquet(sweeps["designs"] / d / "requests.parquet")[cols]
                  for d in g["dir"]]
        pd.testing.assert_frame_equal(frames[0], frames[1])
    seeds = [pd.read_parquet(sweeps["designs"] / d / "requests.parquet")["arrival_s"]
             for d in t[(t["scheduler"] == "vllm") & (t["workload.rate"] == 3)]["dir"]]
    assert not seeds[0].equals(seeds[1])  # and different seeds differ


def test_compare_writes_verdicts_tables_and_plots(sweeps, capsys):
    root = sweeps["designs"]
    assert compare_main([str(root)]) == 0
    r = json.loads((root / "compare.json").read_text())
    assert r["designs"] == ["vllm", "sarathi"] and r["baseline"] == "vllm"
    assert r["seeds"] == [0, 1] and r["settings"] == ["rate"] and r["failed_jobs"] == 0
    assert len(r["verdicts"]) == 2  # one per rate
    assert all(v.startswith("`sarathi` ") and "req/s" in v for v in r["verdicts"])
    assert capsys.readouterr().out.splitlines()[:2] == r["verdicts"]
    means = pd.DataFrame(r["means"])
    assert len(means) == 2 * 2 * len(r["metrics"]) and (means["n"] == 2).all()
    assert "request_goodput" in r["metrics"]  # slo=chat is the default
    diffs = pd.DataFrame(r["differences"])
    assert len(diffs) == 2 * len(r["metrics"])
    assert (diffs["p_adj"] >= diffs["p"]).all()
    assert r["warmup"]["rule"] == "MSER-5 on TTFT"
    assert len(r["jobs"]) == 8
    md = (root / "compare.md").read_text()
    for text in ("## Verdicts", "MSER-5", "## Paired differences", *PLOTS):
        assert text in md
    for name in PLOTS:
        assert (root / name).read_bytes()[:8] == PNG_MAGIC
    rep = _run("analysis.report", [str(root)], root)
    assert rep.returncode == 0, rep.stderr
    report = (root / "report.md").read_text()
    assert r["verdicts"][0] in report and "compare_pareto.png" in report


def test_identical_designs_show_no_significant_difference(sweeps, capsys):
    root = sweeps["same"]
    assert compare_main([str(root), "factor=scheduler.max_num_seqs", "warmup=0",
                         "plots=false"]) == 0
    r = json.loads((root / "compare.json").read_text())
    assert r["verdicts"] == ["`257` vs `256` at 5 req/s: no significant difference in any metric"]
    assert r["plots"] == []
    diffs = pd.DataFrame(r["differences"])
    assert (diffs["diff"] == 0).all() and not diffs["significant"].any()
    assert r["warmup"]["rule"] == "fixed 0 s"


@pytest.mark.parametrize("args, field", [
    (["metrics=p99_ttft_ms,p42_nope_ms"], "metrics"),
    (["factor=model"], "factor"),
    (["warmup=-3"], "warmup"),
    (["colour=blue"], "colour"),
    (["baseline=orca"], "baseline"),
])
def test_bad_input_is_one_line(sweeps, capsys, args, field):
    assert compare_main([str(sweeps["designs"]), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {field}=") and "\n" not in err


def test_not_a_sweep(tmp_path, capsys):
    assert compare_main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("error: DIR=")


def test_a_single_runs_folder_is_not_a_sweep(tmp_path, capsys):
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("[]\n")
    (run / "summary.json").write_text('{"completed": 1, "partial": false, "outputs": []}')
    assert compare_main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: DIR=") and "single run" in err and "\n" not in err
