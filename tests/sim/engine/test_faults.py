"""Simulated faults: stragglers, a degraded KV link, retry limits and lost replicas; every
request ends completed, rejected or failed with a reason, and the summary counts them."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import simpy
from scipy.optimize import brentq

from analysis.metrics import summarize
from sim import simulate
from sim.engine.cluster import Cluster
from sim.engine.faults import Episodes, LinkSchedule
from sim.errors import ConfigError
from sim.kv.budget import kv_bytes_per_token
from sim.records import LogHistogram
from sim.state import FAILED, FINISHED, RequestTable

STEP_S = 0.010
CONSTANT = ["cost_model=constant", f"cost_model.step_time_ms={STEP_S * 1e3}"]


def check_accounted(rec) -> dict:
    """Every request ended completed, rejected or failed, each non-completed one with a
    reason, and the summary's counts agree with the request frame."""
    req = rec.requests
    assert set(req["status"]) <= {"completed", "rejected", "failed"}
    assert ((req["status"] == "rejected") == (req["reject_reason"] != "")).all()
    assert ((req["status"] == "failed") == (req["fail_reason"] != "")).all()
    assert req["completion_s"].notna().all()
    s = summarize(rec)
    assert s["completed"] + s["rejected"] + s["failed"] == len(req)
    assert s["failed_reasons"] == req.loc[req["status"] == "failed",
                                          "fail_reason"].value_counts().to_dict()
    return s


# ---- stragglers ---------------------------------------------------------------------------
def test_a_straggler_all_run_long_steps_every_step_by_its_factor(compose_cfg, open_loop):
    """One request (100 prompt tokens, 10 output tokens) on a replica 3× slow: 10 steps of
    30 ms instead of 10 ms."""
    cfg = compose_cfg(*CONSTANT, "cluster.straggler.replicas=[0]", "cluster.straggler.factor=3")
    rec = simulate(cfg, open_loop([0.0], [100], [10]))
    r = rec.requests.iloc[0]
    assert r["first_token_s"] == pytest.approx(3 * STEP_S)
    assert r["completion_s"] == pytest.approx(30 * STEP_S)
    assert rec.timeline["step_time_s"].to_numpy() == pytest.approx(np.full(10, 3 * STEP_S))
    assert rec.timeline["host_s"].to_numpy() == pytest.approx(np.full(10, 3 * STEP_S))
    s = summarize(rec)
    assert s["num_straggler_episodes"] == 1 and s["faults"]["straggler"]["replicas"] == [0]


def straggler_cfg(compose_cfg, *extra):
    return compose_cfg(*extra, "workload.num_requests=40", "workload.rate=20",
                       "cluster.straggler.replicas=[0]", "cluster.straggler.factor=4",
                       "cluster.straggler.mtbs_s=0.05", "cluster.straggler.duration_s=0.03")


def test_a_step_is_slow_exactly_when_it_starts_inside_an_episode(compose_cfg, requests_for):
    cfg = straggler_cfg(compose_cfg, *CONSTANT)
    rec = simulate(cfg, requests_for(cfg))
    episodes = rec.meta["straggler_episodes"]
    assert len(episodes) == rec.meta["num_straggler_episodes"] > 3
    start = rec.timeline["time_s"].to_numpy()
    inside = np.zeros(len(start), bool)
    for e in episodes:
        inside |= (start >= e["start_s"]) & (start < e["end_s"])
    assert inside.any() and not inside.all()
    np.testing.assert_allclose(rec.timeline["step_time_s"],
                               STEP_S * np.where(inside, 4.0, 1.0), rtol=1e-12)
    check_accounted(rec)


@pytest.mark.parametrize("cost", [CONSTANT, []], ids=["constant", "roofline"])
def test_decode_windows_stay_exact_across_straggler_episodes(compose_cfg, requests_for, cost):
    """Fast-forwarded decode windows end where an episode starts or ends: the same records
    as stepping one by one."""
    cfg = straggler_cfg(compose_cfg, *cost)
    req = requests_for(cfg)
    fast = simulate(cfg, req, keep_itl_samples=True)
    cfg.fast_forward = False
    stepped = simulate(cfg, req, keep_itl_samples=True)
    pd.testing.assert_frame_equal(fast.requests, stepped.requests, rtol=1e-12, atol=1e-12)
    pd.testing.assert_frame_equal(fast.timeline, stepped.timeline, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(np.sort(fast.itl.samples()), np.sort(stepped.itl.samples()),
                               rtol=1e-9, atol=1e-12)
    assert fast.meta["num_straggler_episodes"] > 3


def test_stragglers_are_drawn_from_their_own_stream(compose_cfg, requests_for):
    """ceil(fraction × replicas) stragglers, the same for a seed; turning them on leaves the
    failure times (another stream) and the requests unchanged."""
    base = [*CONSTANT, "workload.num_requests=40", "workload.rate=20", "cluster.replicas=8",
            "cluster.failure.mtbf_s=2", "cluster.failure.mttr_s=0.5"]
    chosen = {}
    for seed in range(3):
        cfg = compose_cfg(*base, "cluster.straggler.fraction=0.3", f"seed={seed}")
        rec = simulate(cfg, requests_for(cfg, seed))
        chosen[seed] = rec.meta["faults"]["straggler"]["replicas"]
        assert len(chosen[seed]) == math.ceil(0.3 * 8)
        plain = compose_cfg(*base, f"seed={seed}")
        other = simulate(plain, requests_for(plain, seed))
        end = min(rec.meta["sim_time_s"], other.meta["sim_time_s"])
        assert [(f["replica"], f["down_s"]) for f in rec.meta["failures"] if f["down_s"] < end] \
            == [(f["replica"], f["down_s"]) for f in other.meta["failures"] if f["down_s"] < end]
        pd.testing.assert_series_equal(rec.requests["input_tokens"],
                                       other.requests["input_tokens"])
        check_accounted(rec)
    again = compose_cfg(*base, "cluster.straggler.fraction=0.3", "seed=0")
    assert simulate(again, requests_for(again, 0)).meta["faults"]["straggler"]["replicas"] == \
        chosen[0]
    assert len({tuple(v) for v in chosen.values()}) > 1


# ---- link degradation ---------------------------------------------------------------------
def fixed_episodes(starts, ends) -> Episodes:
    """Episodes at the given times (then, practically, none)."""
    ep = Episodes(np.random.default_rng(0), 1e9, 1.0)
    ep.starts, ep.ends = list(starts), list(ends)
    return ep


def test_a_transfer_is_priced_piecewise_over_the_episodes():
    link = LinkSchedule(0.25, 50e-6, fixed_episodes([1.0, 3.0], [2.0, 4.0]))
    # starts before the episode: 0.1 s latency, 0.4 s of data by 1.0, the rest at 1/4 speed
    assert link.transfer_time(0.5, 0.1, 0.6) == pytest.approx(0.5 + 0.2 * 4)
    # starts inside: added latency, data at 1/4 speed until 2.0, then the rest at full speed
    slow = (2.0 - 1.6 - 50e-6) * 0.25
    assert link.transfer_time(1.5, 0.1, 0.6) == pytest.approx(0.5 + (0.6 - slow), rel=1e-12)
    # spans both episodes: 0.9 + 0.25 + 1.0 + 0.25 of data by 4.0, the rest at full speed
    assert link.transfer_time(0.0, 0.1, 10.0) == pytest.approx(4.0 + 10.0 - 2.4)
    # wholly outside any episode: exactly latency + data
    assert link.transfer_time(2.0, 1e-5, 0.5) == 1e-5 + 0.5


def test_episodes_do_not_depend_on_when_they_are_asked():
    a = Episodes(np.random.default_rng(7), 0.3, 0.1)
    b = Episodes(np.random.default_rng(7), 0.3, 0.1)
    for t in np.linspace(0, 50, 5000):
        a.active(t)
    assert b.next_change(50.0) > 50.0
    assert a.started(50.0) == b.started(50.0) and len(a.started(50.0)) > 50
    t = a.started(50.0)[3][0]
    assert a.active(t) and not a.active(a.started(50.0)[3][1])
    assert a.next_change(t) == a.started(50.0)[3][1]


def test_degraded_link_transfers_match_an_independent_calculation(compose_cfg, requests_for):
    """Each KV transfer lasts what solving "data moved = prompt's KV" over the recorded
    episodes gives; some are slowed, some not."""
    cfg = compose_cfg("cluster=disagg", *CONSTANT, "cluster.decode_replicas=2",
                      "workload.num_requests=80", "workload.rate=40",
                      "cluster.kv_transfer_bandwidth=2e10", "cluster.kv_transfer_latency_us=20",
                      "cluster.link_degradation.mtbd_s=0.2",
                      "cluster.link_degradation.duration_s=0.1",
                      "cluster.link_degradation.bandwidth_factor=0.05",
                      "cluster.link_degradation.added_latency_us=300")
    rec = simulate(cfg, requests_for(cfg))
    check_accounted(rec)
    episodes = [(e["start_s"], e["end_s"]) for e in rec.meta["link_degradation_episodes"]]
    assert len(episodes) == summarize(rec)["num_link_degradation_episodes"] > 2

    def inside(a, b):  # time of [a, b] inside an episode
        return sum(max(0.0, min(b, e) - max(a, s)) for s, e in episodes)

    req = rec.requests
    per_token = kv_bytes_per_token(cfg.model, cfg.kv_cache, 1) / 2e10
    slowed = 0
    for start, end, prompt in zip(req["kv_transfer_start_s"], req["kv_transfer_end_s"],
                                  req["input_tokens"], strict=True):
        latency = 20e-6 + (300e-6 if any(s <= start < e for s, e in episodes) else 0.0)
        data, t0 = prompt * per_token, start + latency
        done = brentq(lambda t, t0=t0, data=data: (t - t0) - 0.95 * inside(t0, t) - data,
                      t0, t0 + data / 0.05 + 1, xtol=1e-15, rtol=1e-15)
        assert end - start == pytest.approx(done - start, rel=1e-9, abs=1e-12)
        slowed += end - start > 20e-6 + data * (1 + 1e-9)
    assert 0 < slowed < len(req)


# ---- accounting: retry limits and lost replicas -------------------------------------------
def test_retries_exhausted_requests_fail_with_their_reason(compose_cfg, requests_for):
    cfg = compose_cfg(*CONSTANT, "workload.num_requests=200", "workload.rate=10",
                      "cluster.replicas=3", "cluster.failure.mtbf_s=2",
                      "cluster.failure.mttr_s=0.5", "cluster.failure.max_retries=0")
    rec = simulate(cfg, requests_for(cfg))
    s = check_accounted(rec)
    req = rec.requests
    failed = req[req["status"] == "failed"]
    assert s["failed"] == len(failed) > 0
    assert s["failed_reasons"] == {"retries_exhausted": len(failed)}
    assert (failed["num_retries"] == 1).all()
    assert (req.loc[req["status"] == "completed", "num_retries"] == 0).all()
    # each failed at the moment a replica holding it went down
    downs = {f["down_s"] for f in rec.meta["failures"]}
    assert set(failed["completion_s"]) <= downs
    assert s["faults"]["failure"] == {"mtbf_s": 2.0, "mttr_s": 0.5, "max_retries": 0}


def test_requests_fail_when_every_replica_is_lost_for_good(compose_cfg, requests_for):
    cfg = compose_cfg(*CONSTANT, "workload.num_requests=150", "workload.rate=10",
                      "cluster.replicas=2", "cluster.failure.mtbf_s=4",
                      "cluster.failure.mttr_s=null", "check_invariants=true")
    rec = simulate(cfg, requests_for(cfg))
    s = check_accounted(rec)
    req = rec.requests
    last = max(f["down_s"] for f in rec.meta["failures"])
    assert len(rec.meta["failures"]) == 2
    assert all(f["up_s"] is None for f in rec.meta["failures"])
    assert s["failed_reasons"] == {"no_replica_left": s["failed"]} and s["failed"] > 0
    after = req[req["arrival_s"] > last]
    assert len(after) and (after["status"] == "failed").all()
    assert (after["completion_s"] == after["arrival_s"]).all()  # at once, on arrival
    assert (req.loc[req["status"] == "completed", "completion_s"] <= last).all()
    assert s["availability"] < 1


def disagg_cluster(compose_cfg, n: int):
    cfg = compose_cfg("cluster=disagg", *CONSTANT)
    table = RequestTable(np.full(n, np.nan), np.full(n, 100), np.full(n, 10))
    env = simpy.Environment()
    cluster = Cluster(env, cfg, table, LogHistogram(), check_invariants=True)
    ended = []
    cluster.on_done = lambda ids, now: ended.extend(ids.tolist())
    return env, cluster, table, ended


def test_losing_the_decode_pool_fails_what_it_held_and_what_comes_later(compose_cfg):
    """Requests 0–4 decode on the only decode replica when it is lost at 25 ms (after their
    first token); requests 5–9, prefilled after that, fail when they would be sent to it."""
    env, cluster, table, ended = disagg_cluster(compose_cfg, 10)
    prefill, decode = cluster.pools

    def script():
        for rid in range(5):
            table.arrival[rid] = env.now
            cluster.submit(rid)
        yield env.timeout(0.025)
        cluster.lose(decode, 0)
        yield env.timeout(0.025)
        for rid in range(5, 10):
            table.arrival[rid] = env.now
            cluster.submit(rid)

    env.process(script())
    env.run(until=1.0)
    assert sorted(ended) == list(range(10))
    assert (table.status == FAILED).all() and (table.fail_reason_names() ==
                                               "no_replica_left").all()
    np.testing.assert_allclose(table.completion[:5], 0.025)
    np.testing.assert_allclose(table.completion[5:], 0.05 + STEP_S)  # at the end of prefill
    assert (cluster.prefill_table.status == FINISHED).all()
    assert (table.generated[:5] == 1).all() and (table.generated[5:] == 0).all()
    assert not cluster.disagg.in_flight and not cluster.disagg.parked


def test_prefilled_requests_parked_for_a_decode_replica_fail_when_it_is_lost(compose_cfg):
    env, cluster, table, ended = disagg_cluster(compose_cfg, 4)
    prefill, decode = cluster.pools

    def script():
        for rid in range(4):
            table.arrival[rid] = env.now
            cluster.submit(rid)
        yield env.timeout(0.005)
        cluster.fail(decode, 0)  # down for now: the prefilled requests wait for it
        yield env.timeout(0.015)
        assert sorted(cluster.disagg.parked) == [0, 1, 2, 3]
        cluster.lose(decode, 0)

    env.process(script())
    env.run(until=1.0)
    assert sorted(ended) == [0, 1, 2, 3]
    assert (table.fail_reason_names() == "no_replica_left").all()
    np.testing.assert_allclose(table.completion, 0.020)


# ---- settings -----------------------------------------------------------------------------
@pytest.mark.parametrize("override, field", [
    ("cluster.straggler.factor=0.5", "cluster.straggler.factor"),
    ("cluster.straggler.fraction=1.5", "cluster.straggler.fraction"),
    ("cluster.straggler.replicas=[1]", "cluster.straggler.replicas"),
    ("cluster.straggler.mtbs_s=0", "cluster.straggler.mtbs_s"),
    ("cluster.straggler.duration_s=-1", "cluster.straggler.duration_s"),
    ("cluster.link_degradation.mtbd_s=-2", "cluster.link_degradation.mtbd_s"),
    ("cluster.link_degradation.bandwidth_factor=0", "cluster.link_degradation.bandwidth_factor"),
    ("cluster.link_degradation.bandwidth_factor=2", "cluster.link_degradation.bandwidth_factor"),
    ("cluster.link_degradation.added_latency_us=-1", "cluster.link_degradation.added_latency_us"),
    ("cluster.failure.max_retries=-1", "cluster.failure.max_retries"),
    ("cluster.failure.mttr_s=0", "cluster.failure.mttr_s"),
])
def test_bad_fault_settings_name_their_field(compose_cfg, open_loop, override, field):
    cfg = compose_cfg(*CONSTANT, override)
    with pytest.raises(ConfigError) as e:
        simulate(cfg, open_loop([0.0], [10], [2]))
    assert e.value.field == field and "\n" not in str(e.value)


def test_no_faults_by_default(compose_cfg, requests_for):
    cfg = compose_cfg(*CONSTANT, "workload.num_requests=30")
    s = check_accounted(simulate(cfg, requests_for(cfg)))
    assert (s["failed"], s["failed_reasons"], s["num_failures"]) == (0, {}, 0)
    assert (s["num_straggler_episodes"], s["num_link_degradation_episodes"]) == (0, 0)
    assert s["faults"]["straggler"]["replicas"] == []
