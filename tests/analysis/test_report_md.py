"""``python -m analysis.report DIR`` on a run and on a sweep (hand-made output folders), and on
folders it cannot report on. Comparisons and capacity plans are reported in their own tests."""

from __future__ import annotations

import json

import yaml

from analysis.report_md import main, md_table, write_report

SUMMARY = {"completed": 200, "rejected": 0, "request_throughput": 4.14,
           "output_throughput": 1934.5, "median_ttft_ms": 67.06, "p99_ttft_ms": 323.2,
           "median_tpot_ms": 13.69, "p99_tpot_ms": 19.72, "model": "llama3_8b",
           "hardware": "h100_sxm", "scheduler": "vllm", "seed": 0}


def _job(root, num: int, overrides: list[str], summary: dict | None = None,
         failed: dict | None = None):
    d = root / str(num)
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    if summary is not None:
        (d / "summary.json").write_text(json.dumps(summary))
    if failed is not None:
        (d / "failed.json").write_text(json.dumps(failed))


def test_run_report(tmp_path):
    outputs = ["requests.parquet", "latency_ecdf.png", "timeline.png"]  # the run's own files
    (tmp_path / "summary.json").write_text(json.dumps({**SUMMARY, "outputs": outputs}))
    (tmp_path / "latency_ecdf.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    text = write_report(tmp_path).read_text()
    assert text.startswith("# Simulation run")
    assert "| p99 TTFT | 323 | ms |" in text and "| p50 TPOT | 13.7 | ms |" in text
    assert "![latency_ecdf.png](latency_ecdf.png)" in text
    assert "timeline.png" not in text  # only plots that exist are linked


def test_sweep_report_lists_every_job_and_the_failures(tmp_path):
    _job(tmp_path, 0, ["scheduler=vllm", "workload.rate=2"], SUMMARY)
    _job(tmp_path, 1, ["scheduler=sarathi", "workload.rate=2"],
         {**SUMMARY, "scheduler": "sarathi", "p99_ttft_ms": 410.0})
    _job(tmp_path, 2, ["scheduler=static", "workload.rate=2"],
         failed={"error_type": "ConfigError", "message": "scheduler.max_num_seqs=0: must be > 0"})
    assert main([str(tmp_path)]) == 0
    text = (tmp_path / "report.md").read_text()
    assert text.startswith("# Sweep") and "3 jobs, 1 failed" in text
    assert "Same in every job: `workload.rate=2`" in text
    assert "| 1 | sarathi | ok |" in text and "410" in text
    assert "job 2: ConfigError: scheduler.max_num_seqs=0: must be > 0" in text


def test_nothing_to_report_is_one_line(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    assert main([str(tmp_path / "missing")]) == 2
    assert main([]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3 and all(ln.startswith("error: DIR=") for ln in lines)


def test_md_table_escapes_pipes():
    assert md_table(["a", "b"], [["x|y", 1.5]]) == "| a | b |\n|---|---|\n| x\\|y | 1.5 |"
