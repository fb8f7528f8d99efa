"""Scheduler YAMLs compose and validate; bad scheduler input gets one clear line."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from sim.builders import check_config
from sim.config import ModelConfig, SchedulerConfig, check_scheduler
from sim.errors import ConfigError
from sim.schedulers import SCHEDULERS

REPO = Path(__file__).resolve().parents[3]
MODEL = ModelConfig(name="m", num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, intermediate_size=128,
                    vocab_size=1000, max_position_embeddings=4096)


def test_every_policy_has_a_class_and_a_yaml():
    assert {p.stem for p in (REPO / "conf" / "scheduler").glob("*.yaml")} >= set(SCHEDULERS)


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_yaml_composes_and_passes_the_checks(compose_cfg, name):
    cfg = compose_cfg(f"scheduler={name}")
    assert cfg.scheduler.name == name
    check_config(cfg)
    assert isinstance(OmegaConf.to_object(cfg.scheduler), SchedulerConfig)


# overrides of a valid config → (field, value) the one-line error must name
BAD = {
    "unknown_name": ({"name": "fifo"}, "scheduler.name", "fifo"),
    "unknown_policy": ({"policy": "lifo"}, "scheduler.policy", "lifo"),
    "priority_not_vllm": ({"name": "orca", "max_num_batched_tokens": 4096,
                           "policy": "priority"}, "scheduler.policy", "priority"),
    "negative_delay": ({"name": "dynamic", "max_num_batched_tokens": 4096,
                        "max_queue_delay_ms": -1.0}, "scheduler.max_queue_delay_ms", -1.0),
    "chunk_over_budget": ({"name": "sarathi", "chunk_size": 1024, "max_num_seqs": 128,
                           "max_num_batched_tokens": 512}, "scheduler.chunk_size", 1024),
    "chunk_zero": ({"name": "sarathi", "chunk_size": 0}, "scheduler.chunk_size", 0),
    "unknown_capacity": ({"name": "trtllm", "capacity_scheduler_policy": "NEVER"},
                         "scheduler.capacity_scheduler_policy", "NEVER"),
    "whole_prompts_small_budget": ({"name": "orca", "max_num_batched_tokens": 2048},
                                   "scheduler.max_num_batched_tokens", 2048),
    "budget_below_seqs": ({"max_num_seqs": 64, "max_num_batched_tokens": 32},
                          "scheduler.max_num_batched_tokens", 32),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_scheduler_input_names_the_field(case):
    fields, field, value = BAD[case]
    with pytest.raises(ConfigError) as e:
        check_scheduler(replace(SchedulerConfig(), **fields), MODEL, SCHEDULERS)
    assert (e.value.field, e.value.value) == (field, value)
    assert str(e.value).startswith(f"{field}={value!r}: ")
    assert "\n" not in str(e.value)


def test_whole_prompt_policies_accept_a_budget_of_max_model_len():
    for name in ("static", "dynamic", "orca"):
        check_scheduler(SchedulerConfig(name=name, max_num_batched_tokens=4096), MODEL,
                        SCHEDULERS)
