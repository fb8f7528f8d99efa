"""Settings that the chosen scheduler, arrival process or cluster mode does not read are
named in a warning; the shipped option YAMLs set none."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml

from cli.unused_settings import unused_settings
from cli.validation import validate_config
from sim.schedulers import SCHEDULERS

CONF = Path(__file__).resolve().parents[2] / "conf"


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_each_scheduler_yaml_lists_exactly_the_fields_it_reads(name):
    doc = yaml.safe_load((CONF / "scheduler" / f"{name}.yaml").read_text())
    assert set(doc) - {"defaults"} == set(SCHEDULERS[name].settings)


OPTIONS = [f"{group}={p.stem}" for group in ("scheduler", "workload", "cluster", "experiment")
           for p in sorted((CONF / group).glob("*.yaml"))]


@pytest.mark.parametrize("option", OPTIONS)
def test_shipped_options_set_nothing_they_do_not_read(compose_cfg, option):
    assert unused_settings(compose_cfg(option)) == []


@pytest.mark.parametrize("overrides, expected", [
    (["scheduler.chunk_size=256"], "scheduler.chunk_size=256 is ignored: scheduler=vllm"),
    (["scheduler=sarathi", "scheduler.enable_chunked_prefill=false"],
     "scheduler.enable_chunked_prefill=False is ignored: scheduler=sarathi"),
    (["scheduler=static", "scheduler.max_queue_delay_ms=50"],
     "scheduler.max_queue_delay_ms=50.0 is ignored: scheduler=static"),
    (["workload.cv=3"], "workload.cv=3.0 is ignored: workload.arrival=poisson"),
    (["workload.concurrency=4"], "only closed_loop arrivals do"),
    (["workload=closed_loop", "workload.rate=9"], "workload.rate=9.0 is ignored"),
    (["workload=trace", "workload.num_requests=50"], "workload.num_requests=50 is ignored"),
    (["workload.time_scale=0.5"], "workload.time_scale=0.5 is ignored"),
    (["workload.peak_rate=3"], "workload.peak_rate=3.0 is ignored"),
    (["cluster.autoscaler.max_replicas=4"], "cluster.autoscaler.max_replicas=4 is ignored: "
                                            "cluster.autoscaler.policy=none"),
    (["cluster.autoscaler.policy=queue", "cluster.autoscaler.slo_ttft_ms=300"],
     "cluster.autoscaler.slo_ttft_ms=300.0 is ignored"),
    (["cluster.autoscaler.policy=slo", "cluster.autoscaler.slo_ttft_ms=300",
      "cluster.autoscaler.target=3"], "cluster.autoscaler.target=3.0 is ignored"),
    (["cluster=diffusion", "workload=diffusion", "model=flux1_dev",
      "cluster.autoscaler.policy=slo", "cluster.autoscaler.slo_latency_ms=9000",
      "cluster.autoscaler.slo_ttft_ms=300"],
     "cluster.autoscaler.slo_ttft_ms=300.0 is ignored: diffusion jobs have no tokens"),
    (["cluster.prefill_replicas=3"], "cluster.prefill_replicas=3 is ignored: the cluster is "
                                     "not disaggregated"),
    (["cluster=disagg", "cluster.replicas=4"], "cluster.replicas=4 is ignored: the cluster is "
                                                "disaggregated"),
    (["workload=random", "workload.input.value=2000"],
     "workload.input.value=2000 is ignored: workload.random draws the lengths (set "
     "workload.random.input_len)"),
    (["workload=sharegpt", "workload.output.value=50"],
     "workload.output.value=50 is ignored: workload.sharegpt draws the lengths (set "
     "workload.sharegpt.output_mean)"),
    (["backend.eager_launch_us=20"], "backend.eager_launch_us=20.0 is ignored: "
                                     "backend.enforce_eager=false"),
    (["backend.enforce_eager=true", "backend.cuda_graph_batch_sizes=[1,2]"],
     "backend.cuda_graph_batch_sizes=[1, 2] is ignored: backend.enforce_eager=true"),
])
def test_a_setting_the_run_does_not_read_is_named(compose_cfg, overrides, expected):
    lines = unused_settings(compose_cfg(*overrides))
    assert len(lines) == 1 and expected in lines[0], lines


def test_the_launch_time_prices_trtllm_steps_without_a_graph(compose_cfg):
    """TensorRT-LLM's uncaptured steps run eager: the launch time is read without
    enforce_eager."""
    assert not unused_settings(compose_cfg("backend=trtllm", "scheduler=trtllm",
                                           "backend.eager_launch_us=20"))


def test_validation_logs_them_as_warnings_and_the_run_goes_on(compose_cfg, caplog):
    with caplog.at_level(logging.WARNING, logger="sim"):
        validate_config(compose_cfg("workload.cv=3", "scheduler.chunk_size=256"))
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum("is ignored" in m for m in warned) == 2
