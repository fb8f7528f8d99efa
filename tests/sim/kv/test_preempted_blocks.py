"""A request preempted by recompute finds its own cached blocks again (prefix caching on a
workload whose prompts share nothing), as vLLM's freed blocks stay hashed until evicted."""

from __future__ import annotations

from scenarios import requests_for_seed
from sim import simulate


def test_preempted_requests_recompute_less_with_prefix_caching(compose_cfg):
    """A burst that overfills a small cache: vLLM preempts by recompute either way, and with
    prefix caching the restarted requests skip their blocks still cached, so the run computes
    fewer prefill tokens and ends sooner; every request completes."""
    runs = {}
    for caching in ("false", "true"):
        cfg = compose_cfg("workload=random", "workload.num_requests=60",
                          "workload.random.input_len=600", "workload.random.output_len=200",
                          "kv_cache.num_gpu_blocks=400", f"kv_cache.prefix_caching={caching}")
        runs[caching] = simulate(cfg, requests_for_seed(cfg.workload, 0))
    off, on = runs["false"], runs["true"]
    for rec in (off, on):
        assert (rec.requests["status"] == "completed").all()
        assert rec.requests["num_preemptions"].sum() > 0
    assert on.timeline["prefill_tokens"].sum() < off.timeline["prefill_tokens"].sum()
    assert on.meta["sim_time_s"] < off.meta["sim_time_s"]
