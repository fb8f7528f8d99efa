"""``experiment=vidur_synthetic`` (Vidur's synthetic workload) and the total-length option.

The experiment composes to Llama-2-7B on one A100-80G with Vidur's scheduler limits; its
requests have total lengths uniform in [256, 2048] split 3:1 and Poisson arrivals; a small run
completes through ``python -m sim``; bad values of ``workload.total_length`` or
``workload.prefill_fraction`` give one error line naming the field.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_module
from scipy import stats

import conf.schema  # noqa: F401  (registers the config schemas)
from scenarios import WorkloadConfig, WorkloadError, check_workload, requests_for_seed
from scenarios.config import LengthConfig
from scenarios.lengths import split_total_lengths
from sim.builders import plain
from sim.model.weights import parameter_count

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cfg():
    with initialize_config_module("conf", version_base=None):
        return compose("config", overrides=["experiment=vidur_synthetic"])


def test_experiment_sets_vidur_model_hardware_and_limits(cfg):
    m = cfg.model
    assert (m.name, m.hf_id) == ("llama2_7b", "meta-llama/Llama-2-7b-hf")
    assert (m.num_hidden_layers, m.hidden_size, m.num_attention_heads,
            m.num_key_value_heads, m.intermediate_size, m.vocab_size,
            m.max_position_embeddings) == (32, 4096, 32, 32, 11008, 32000, 4096)
    assert parameter_count(plain(cfg).model) == pytest.approx(6.74e9, rel=0.01)
    assert cfg.hardware.name == "a100_80g_sxm"
    assert (cfg.cluster.tensor_parallel_size, cfg.cluster.pipeline_parallel_size,
            cfg.cluster.replicas) == (1, 1, 1)
    assert cfg.scheduler.name == "vllm"
    assert (cfg.scheduler.max_num_seqs, cfg.scheduler.max_num_batched_tokens) == (128, 4096)
    assert cfg.kv_cache.block_size == 16
    w = cfg.workload
    assert (w.arrival, w.rate, w.num_requests) == ("poisson", 4.0, 100_000)
    assert (w.total_length.dist, w.total_length.low, w.total_length.high) == ("uniform", 256, 2048)
    assert w.prefill_fraction == 0.75
    assert cfg.plots is True  # the experiment does not switch plots off


def test_requests_are_poisson_with_uniform_totals_split_3_to_1(cfg):
    w = cfg.workload.copy()
    w.num_requests = 20_000
    check_workload(w)
    df = requests_for_seed(w, 0)
    total = (df.input_tokens + df.output_tokens).to_numpy()
    assert total.min() >= 256 and total.max() <= 2048
    # all integers in [256, 2048] equally likely: chi-square over 8 equal-width bins
    counts = np.histogram(total, bins=np.linspace(256, 2049, 9))[0]
    assert stats.chisquare(counts).pvalue > 1e-3
    np.testing.assert_array_equal(df.input_tokens, np.rint(0.75 * total).astype(int))
    assert (np.abs(df.input_tokens - 3 * df.output_tokens) <= 3).all()
    gaps = np.diff(np.concatenate([[0.0], df.arrival_time_s.to_numpy()]))
    assert gaps.mean() == pytest.approx(1 / 4.0, rel=0.03)
    assert stats.kstest(gaps, stats.expon(scale=1 / 4.0).cdf).pvalue > 1e-3


def test_split_keeps_both_parts_at_least_one_token():
    rng = np.random.default_rng(0)
    inputs, outputs = split_total_lengths(LengthConfig(dist="fixed", value=2), 0.99, 5, rng, "t")
    assert (inputs == 1).all() and (outputs == 1).all()
    inputs, outputs = split_total_lengths(LengthConfig(dist="fixed", value=3), 0.01, 5, rng, "t")
    assert (inputs == 1).all() and (outputs == 2).all()


def _workload(**changes) -> WorkloadConfig:
    total = LengthConfig(dist="uniform", low=256, high=2048)
    return replace(WorkloadConfig(name="t", total_length=total), **changes)


@pytest.mark.parametrize(("changes", "field"), [
    ({"prefill_fraction": 1.0}, "workload.prefill_fraction=1.0"),
    ({"prefill_fraction": 0}, "workload.prefill_fraction=0"),
    ({"total_length": LengthConfig(dist="uniform", low=1, high=10)}, "workload.total_length.low=1"),
    ({"total_length": LengthConfig(dist="uniform", low=20, high=10)},
     "workload.total_length.high=10"),
    ({"total_length": LengthConfig(dist="fixed", value=1)}, "workload.total_length.value=1"),
    ({"total_length": LengthConfig(dist="zipf")}, "workload.total_length.dist='zipf'"),
])
def test_bad_total_length_names_the_field(changes, field):
    with pytest.raises(WorkloadError) as e:
        check_workload(_workload(**changes))
    assert str(e.value).startswith(field) and "\n" not in str(e.value)


def _cli(args: list[str], outdir: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, CI="1")
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, "-m", "sim", *args, f"hydra.run.dir={outdir}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=180)


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory):
    """A 200-request run and a bad-value run, in parallel (each is mostly imports)."""
    tmp = tmp_path_factory.mktemp("vidur")
    jobs = {"ok": ["experiment=vidur_synthetic", "workload.num_requests=200", "plots=false"],
            "bad": ["experiment=vidur_synthetic", "workload.num_requests=200",
                    "workload.prefill_fraction=1.5"]}
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {k: pool.submit(_cli, v, tmp / k) for k, v in jobs.items()}
        return {k: (f.result(), tmp / k) for k, f in futures.items()}


def test_small_run_completes(cli_runs):
    proc, outdir = cli_runs["ok"]
    assert proc.returncode == 0, proc.stderr
    req = pd.read_parquet(outdir / "requests.parquet")
    assert len(req) == 200
    total = req.input_tokens + req.output_tokens
    assert total.between(256, 2048).all()
    assert np.isfinite(req.completion_s).all() and (req.status == "completed").all()


def test_bad_value_at_the_cli_is_one_line(cli_runs):
    proc, outdir = cli_runs["bad"]
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "workload.prefill_fraction=1.5" in lines[0], proc.stderr
    assert not (outdir / "requests.parquet").exists()
