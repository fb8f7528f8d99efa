"""What each batching policy and router declares about itself, and that everything that
needs a policy fact reads the declaration: the registries, the config checks, the invariant
checker's step limits, capacity's chunk search and the compiled loop's allow-list."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest

from analysis.capacity import _chunk_overrides
from sim.compiled.core import scheduler_not_compiled
from sim.config import ModelConfig, SchedulerConfig, check_scheduler
from sim.engine.invariants import step_limits
from sim.errors import ConfigError
from sim.registry import by_name
from sim.routers import ROUTERS
from sim.schedulers import SCHEDULERS

FIELDS = {f.name for f in fields(SchedulerConfig)}
MODEL = ModelConfig(name="m", num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, intermediate_size=128,
                    vocab_size=1000, max_position_embeddings=4096)


@pytest.mark.parametrize("registry", [SCHEDULERS, ROUTERS], ids=["schedulers", "routers"])
def test_registries_are_keyed_by_the_names_the_classes_declare(registry):
    assert all(cls.name == name for name, cls in registry.items())


def test_a_registry_refuses_a_class_without_a_name_or_with_a_taken_one():
    class Nameless:
        name = ""

    class Twin:
        name = "vllm"

    with pytest.raises(TypeError, match="declares no name"):
        by_name(Nameless)
    with pytest.raises(TypeError, match="both declare 'vllm'"):
        by_name(SCHEDULERS["vllm"], Twin)


@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_declared_settings_and_chunk_fields_are_scheduler_fields(name):
    cls = SCHEDULERS[name]
    assert cls.settings <= FIELDS
    assert cls.chunk_fields and set(cls.chunk_fields) <= cls.settings


@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_every_setting_is_handled_on_the_fast_path_or_forces_the_reference_engine(name):
    # a policy the compiled loop runs lists every setting it reads, with the values it
    # handles; a new setting left out of the list fails here, not silently on the fast path
    cls = SCHEDULERS[name]
    if cls.fast_path is not None:
        assert set(cls.fast_path) == cls.settings
        assert scheduler_not_compiled(SchedulerConfig(name=name)) == ""
    else:
        assert scheduler_not_compiled(SchedulerConfig(name=name)).startswith(
            f"scheduler={name} (compiled: ")


def test_a_value_the_fast_path_does_not_handle_names_the_setting():
    # every policy value shipped today is compiled; one added to the schema but not to the
    # fast path's values runs on the SimPy engine, and the reason names it
    why = scheduler_not_compiled(SchedulerConfig(name="vllm", policy="lifo"))
    assert why == "scheduler.policy=lifo (compiled: fcfs, priority)"


@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_step_limits_and_chunk_overrides_come_from_the_declarations(name):
    s = SchedulerConfig(name=name, max_num_seqs=64, max_num_batched_tokens=8192,
                        chunk_size=512)
    cls = SCHEDULERS[name]
    assert step_limits(s) == (64, cls.step_token_limit(s))
    expected = {"sarathi": 512, "sglang": 8192}.get(name, 8192)
    assert cls.step_token_limit(s) == expected
    assert _chunk_overrides(name, 256) == [f"scheduler.{f}=256" for f in cls.chunk_fields]


@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_whole_prompt_policies_need_a_budget_of_max_model_len(name):
    small = SchedulerConfig(name=name, max_num_seqs=64, max_num_batched_tokens=2048,
                            chunk_size=512)
    if SCHEDULERS[name].whole_prompt:
        with pytest.raises(ConfigError, match="prefills whole prompts"):
            check_scheduler(small, MODEL, SCHEDULERS)
    else:  # it chunks prompts (unless told not to, where it reads enable_chunked_prefill)
        check_scheduler(small, MODEL, SCHEDULERS)
        if "enable_chunked_prefill" in SCHEDULERS[name].settings:
            with pytest.raises(ConfigError, match="enable_chunked_prefill is false"):
                check_scheduler(replace(small, enable_chunked_prefill=False), MODEL,
                                SCHEDULERS)


@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_only_a_policy_that_reads_policy_accepts_priority(name):
    s = SchedulerConfig(name=name, max_num_batched_tokens=4096, policy="priority")
    if "policy" in SCHEDULERS[name].settings:
        check_scheduler(s, MODEL, SCHEDULERS)
    else:
        with pytest.raises(ConfigError, match="only scheduler=vllm reads it"):
            check_scheduler(s, MODEL, SCHEDULERS)


def test_the_prefill_chunk_the_memory_rules_read_is_the_first_chunk_field():
    s = SchedulerConfig(max_num_batched_tokens=16384, chunk_size=4096)
    assert SCHEDULERS["sglang"].prefill_chunk(s) == 4096  # SGLang's chunked_prefill_size
    assert SCHEDULERS["vllm"].prefill_chunk(s) == 16384
    assert all(cls.prefill_chunk(s) == getattr(s, cls.chunk_fields[0])
               for cls in SCHEDULERS.values())

