"""``capacity.config_search``: the candidate configurations it composes, and its choice of the
cheapest one (GPU-hours per request) on replicas whose maximum rate is known in closed form."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_module

from analysis.capacity import candidates, config_search
from analysis.capacity_config import register
from conf.schema import register_configs
from sim.errors import ConfigError

register_configs()
register()

# a request is one 10 ms step (max_num_seqs requests share a step): M/D/1 for one sequence
CONSTANT = ["cost_model=constant", "cost_model.step_time_ms=10", "workload=poisson",
            "workload.num_requests=3000", "workload.input_tokens=100",
            "workload.output_tokens=1", "capacity.slo.p99_ttft_ms=null",
            "capacity.slo.p99_tpot_ms=null", "capacity.slo.mean_wait_ms=5",
            "capacity.search.rel_tol=0.05", "capacity.search.rate_start=40"]


def _compose(*overrides: str):
    with initialize_config_module("conf", version_base=None):
        return compose("capacity", overrides=list(overrides))


def _candidates(*overrides: str):
    with initialize_config_module("conf", version_base=None):
        cfg = compose("capacity", overrides=list(overrides))
        return candidates(cfg, list(overrides))


def test_every_combination_is_composed_with_the_searched_fields_replaced():
    out = _candidates("scheduler.max_num_seqs=7", "cluster.tensor_parallel_size=4",
                      "capacity.config_search.max_num_seqs=[16,32]",
                      "capacity.config_search.tensor_parallel_size=[1,2]")
    got = {(c.scheduler.max_num_seqs, c.cluster.tensor_parallel_size) for _, c in out}
    assert got == {(16, 1), (16, 2), (32, 1), (32, 2)}  # the command line's 7 and 4 replaced
    assert ["cluster.tensor_parallel_size=1", "scheduler.max_num_seqs=16"] in [
        sorted(over) for over, _ in out]


@pytest.mark.parametrize("scheduler, fields", [
    ("vllm", {"max_num_batched_tokens": 1024}),
    ("sarathi", {"chunk_size": 1024, "max_num_batched_tokens": 1024}),
    ("sglang", {"chunk_size": 1024}),
])
def test_the_chunk_axis_sets_each_schedulers_own_field(scheduler, fields):
    (over, cfg), = _candidates(f"scheduler={scheduler}", "capacity.config_search.chunk=[1024]")
    for name, value in fields.items():
        assert cfg.scheduler[name] == value and f"scheduler.{name}={value}" in over


def test_a_candidate_that_does_not_compose_names_the_search():
    with pytest.raises(ConfigError, match="capacity.config_search"):
        _candidates("capacity.config_search.backend=[no_such_backend]")


def test_the_cheapest_configuration_per_request_is_chosen():
    # two sequences per step serve twice the rate on the same GPU: the cheaper of the two;
    # tensor parallel 2 buys nothing under a constant step time but doubles the GPUs
    over = [*CONSTANT, "capacity.config_search.max_num_seqs=[1,2]",
            "capacity.config_search.tensor_parallel_size=[1,2]"]
    with initialize_config_module("conf", version_base=None):
        cfg = compose("capacity", overrides=over)
        best, ev, search, table = config_search(cfg, over)
    assert len(table) == 4 and sum(row["chosen"] for row in table) == 1
    rate = {(r["overrides"][0], r["overrides"][1]): r["max_rate_per_replica"] for r in table}
    one, two = (rate[("cluster.tensor_parallel_size=1", f"scheduler.max_num_seqs={s}")]
                for s in (1, 2))
    assert 1.5 < two / one < 3.0  # two requests share each 10 ms step: about twice the rate
    chosen, = (r for r in table if r["chosen"])
    assert chosen["overrides"] == ["cluster.tensor_parallel_size=1", "scheduler.max_num_seqs=2"]
    assert best.scheduler.max_num_seqs == 2 and best.cluster.tensor_parallel_size == 1
    assert search.rate == pytest.approx(two) and ev is not None
    costs = sorted(r["gpu_hours_per_million_requests"] for r in table)
    assert chosen["gpu_hours_per_million_requests"] == costs[0]
