"""The invariant checker (``check_invariants=true``) catches each kind of corrupted state,
naming the invariant, the replica, the time and the requests; with the flag off it is not
there at all."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

import sim.engine.invariants
from sim import simulate
from sim.engine.cluster import Cluster
from sim.errors import InvariantError
from sim.records import LogHistogram
from sim.schedulers.base import Batch, TokenBudgetScheduler
from sim.state import FINISHED, RUNNING, WAITING, RequestTable

STEP_S = 0.010
CONSTANT = ["cost_model=constant", f"cost_model.step_time_ms={STEP_S * 1e3}"]


def running_cluster(compose_cfg, *overrides, n: int = 6, until: float = 0.035):
    """A cluster with invariant checks on, ``n`` requests (100 prompt tokens, 20 output
    tokens) submitted at 0 and simulated until ``until``: some running, some waiting."""
    cfg = compose_cfg(*CONSTANT, "scheduler.max_num_seqs=4", *overrides)
    table = RequestTable(np.zeros(n), np.full(n, 100), np.full(n, 20))
    env = simpy.Environment()
    cluster = Cluster(env, cfg, table, LogHistogram(), check_invariants=True)
    for rid in range(n):
        cluster.submit(rid)
    env.run(until=until)
    return cluster


def raises(cluster, invariant: str, ids=None, replica: int = 0) -> InvariantError:
    with pytest.raises(InvariantError) as e:
        cluster.checker.check_all(replica)
    err = e.value
    assert err.invariant == invariant and err.replica == replica
    assert err.time_s == pytest.approx(cluster.env.now)
    if ids is not None:
        assert set(ids) <= set(err.request_ids)
    text = str(err)
    assert invariant in text and f"replica {replica}" in text and "\n" not in text
    return err


@pytest.fixture
def cluster(compose_cfg):
    c = running_cluster(compose_cfg)
    sched = c.pools[0].replicas[0].scheduler
    assert len(sched.running) == 4 and len(sched.waiting) == 2
    c.checker.check_all(0)  # a sound state passes
    return c


def parts(cluster):
    rep = cluster.pools[0].replicas[0]
    return rep, rep.scheduler, rep.scheduler.kv, cluster.table


def test_kv_blocks_in_use_must_match_what_requests_hold(cluster):
    _, sched, kv, _ = parts(cluster)
    kv.free_blocks -= 1  # a leaked block
    err = raises(cluster, "kv_accounting", sched.running.tolist())
    assert "account for" in str(err)


def test_free_blocks_stay_within_capacity(cluster):
    _, _, kv, _ = parts(cluster)
    kv.free_blocks = kv.num_blocks + 1
    raises(cluster, "kv_accounting")


def test_a_request_outside_every_queue_holds_no_blocks(cluster):
    _, sched, kv, t = parts(cluster)
    done = 5  # waiting, holds nothing yet
    assert t.status[done] == WAITING
    kv.held[done] = 2
    sched.waiting.remove(done)
    t.status[done] = FINISHED  # completed, yet still holding blocks
    t.completion[done] = cluster.env.now
    t.generated[done] = t.max_output[done]
    t.num_tokens[done] = t.prompt[done] + t.generated[done]
    t.first_scheduled[done] = t.first_token[done] = t.last_token[done] = cluster.env.now
    raises(cluster, "kv_accounting", [done])


def test_swapped_blocks_must_add_up(compose_cfg):
    c = running_cluster(compose_cfg, "kv_cache.preemption=swap")
    _, sched, kv, _ = parts(c)
    rid = int(sched.running[0])
    kv.swap.held[rid] = 3  # "swapped" but running and counted nowhere in the host space
    raises(c, "kv_accounting", [rid])


def test_a_step_within_the_batch_limits(cluster):
    rep, sched, _, _ = parts(cluster)
    ids = np.arange(6)
    with pytest.raises(InvariantError, match="batch_limits") as e:
        cluster.checker.after_step(rep, Batch(ids, np.ones(6, np.int64), np.full(6, 100), 0))
    assert e.value.request_ids == ids.tolist()
    budget = cluster.cfg.scheduler.max_num_batched_tokens
    with pytest.raises(InvariantError, match="batch_limits"):
        cluster.checker.after_step(rep, Batch(ids[:1], np.array([budget + 1]), np.zeros(1,
                                                                                  np.int64), 0))
    with pytest.raises(InvariantError, match="scheduled twice"):
        cluster.checker.after_step(rep, Batch(np.array([0, 0]), np.ones(2, np.int64),
                                              np.full(2, 100), 0))


def test_a_replica_runs_at_most_max_num_seqs(cluster):
    _, sched, _, t = parts(cluster)
    extra = sched.waiting.popleft()
    t.status[extra] = RUNNING
    sched.running = np.append(sched.running, extra)
    raises(cluster, "batch_limits", [extra])


def test_a_decode_windows_kv_usage_never_shrinks(cluster):
    rep, sched, _, _ = parts(cluster)
    batch = Batch(sched.running, np.ones(4, np.int64), np.full(4, 100), 0)
    with pytest.raises(InvariantError, match="kv_accounting"):
        cluster.checker.after_window(rep, batch, np.array([30, 31, 29]))


def test_queued_requests_have_the_status_of_their_queue(cluster):
    _, sched, _, t = parts(cluster)
    rid = sched.waiting[0]
    t.status[rid] = RUNNING
    raises(cluster, "queue_status", [rid])


def test_queued_requests_are_assigned_to_their_replica(cluster):
    _, sched, _, t = parts(cluster)
    rid = int(sched.running[1])
    t.replica[rid] = 7
    raises(cluster, "queue_status", [rid])


@pytest.mark.parametrize("column, value, what", [
    ("first_token", -1.0, "arrival after first_token"),
    ("first_scheduled", np.nan, "first_token set without first_scheduled"),
    ("last_token", 99.0, "in the future"),
])
def test_timestamps_are_ordered_per_request(cluster, column, value, what):
    _, sched, _, t = parts(cluster)
    rid = int(sched.running[0])
    assert t.first_token[rid] > 0
    getattr(t, column)[rid] = value
    err = raises(cluster, "timestamps", [rid])
    assert what in str(err)


@pytest.mark.parametrize("column, delta, what", [
    ("generated", 30, "generated more than max output"),
    ("num_tokens", 1, "tokens known != prompt + generated"),
    ("computed", 500, "computed tokens outside"),
])
def test_token_counts_stay_consistent(cluster, column, delta, what):
    _, sched, _, t = parts(cluster)
    rid = int(sched.running[2])
    getattr(t, column)[rid] += delta
    err = raises(cluster, "tokens", [rid])
    assert what in str(err)


def test_a_released_request_is_never_lost(cluster):
    _, sched, _, _ = parts(cluster)
    rid = sched.waiting.pop()
    err = raises(cluster, "conservation", [rid])
    assert "released but nowhere" in str(err)


def test_a_request_is_in_one_place_only(cluster):
    _, sched, _, _ = parts(cluster)
    rid = int(sched.running[0])
    cluster.pools[0].parked.append(rid)
    err = raises(cluster, "conservation", [rid])
    assert "more than one place" in str(err)


def test_no_request_is_in_the_system_before_its_release(cluster):
    _, sched, _, _ = parts(cluster)
    rid = int(sched.running[3])
    cluster.submitted[rid] = False
    err = raises(cluster, "conservation", [rid])
    assert "before its release" in str(err)


def test_a_parked_request_is_pending(cluster):
    _, sched, _, _ = parts(cluster)
    rid = sched.waiting.pop()
    cluster.pools[0].parked.append(rid)  # moved, but its status still says waiting
    raises(cluster, "queue_status", [rid])


def test_a_simulation_stops_at_the_first_violation(compose_cfg, requests_for, monkeypatch):
    """A scheduler that forgets to stamp ``first_scheduled``: with checks on, the run stops
    at the step that shows it; with checks off it runs to the end unchecked."""
    def forgetful(self, rid, now, cached=0):
        self.table.status[rid] = RUNNING

    monkeypatch.setattr(TokenBudgetScheduler, "_admit", forgetful)
    cfg = compose_cfg(*CONSTANT, "workload.num_requests=20")
    req = requests_for(cfg)
    rec = simulate(cfg, req)
    assert rec.requests["first_scheduled_s"].isna().all()
    cfg.check_invariants = True
    with pytest.raises(InvariantError, match="first_token set without first_scheduled") as e:
        simulate(cfg, req)
    assert e.value.invariant == "timestamps" and e.value.replica == 0
    assert e.value.time_s == pytest.approx(req["arrival_time_s"].min() + STEP_S)


def test_the_checker_runs_after_steps_and_windows_only_when_on(compose_cfg, requests_for,
                                                               monkeypatch):
    calls = {"after_step": 0, "after_window": 0}
    for name in calls:
        original = getattr(sim.engine.invariants.InvariantChecker, name)

        def counting(self, *args, _name=name, _original=original):
            calls[_name] += 1
            return _original(self, *args)

        monkeypatch.setattr(sim.engine.invariants.InvariantChecker, name, counting)
    cfg = compose_cfg(*CONSTANT, "workload.num_requests=30")
    req = requests_for(cfg)
    simulate(cfg, req)
    assert calls == {"after_step": 0, "after_window": 0}
    cfg.check_invariants = True
    rec = simulate(cfg, req)
    assert calls["after_step"] > 0 and calls["after_window"] > 0
    assert (rec.requests["status"] == "completed").all()
    env = simpy.Environment()
    off = Cluster(env, cfg, RequestTable(np.zeros(1), np.ones(1, np.int64), np.ones(1, np.int64)),
                  LogHistogram())
    assert off.checker is None and off.pools[0].replicas[0].check is None


def test_whole_cluster_checks_thin_out_with_the_run_size(compose_cfg, requests_for,
                                                         monkeypatch):
    """Every step checks what it touched; the whole-cluster scan runs every
    ⌈requests / FULL_CHECK_REQUESTS⌉-th step and at the end, so it still catches a request
    that no step touches (here: corrupted by the last completion) at the end of the run."""
    monkeypatch.setattr(sim.engine.invariants, "FULL_CHECK_REQUESTS", 10)
    cfg = compose_cfg(*CONSTANT, "workload.num_requests=60", "check_invariants=true")
    req = requests_for(cfg)
    rec = simulate(cfg, req)
    checks = rec.meta["invariant_checks"]
    assert checks["steps_checked"] >= len(rec.timeline)  # a window counts all its steps
    hooks = checks["steps_checked"]  # at least one hook per checked step or window
    assert 1 < checks["full_checks"] < hooks
    original = TokenBudgetScheduler._finish

    def overcounting(self, done, now):
        done = original(self, done, now)
        if len(done) and (self.table.status == FINISHED).all():
            others = np.setdiff1d(np.flatnonzero(self.table.status == FINISHED), done)
            self.table.generated[others[0]] += 1  # not in the last step: no step sees it
        return done

    monkeypatch.setattr(TokenBudgetScheduler, "_finish", overcounting)
    # whole-cluster scans only at the first step and the end: the last step's own check
    # looks at its batch only
    monkeypatch.setattr(sim.engine.invariants, "FULL_CHECK_REQUESTS", 1e-3)
    with pytest.raises(InvariantError, match="at the end of the run"):
        simulate(cfg, req)


def test_an_error_in_the_step_that_ends_the_run_is_not_lost(compose_cfg, requests_for,
                                                           monkeypatch):
    """The last completion ends the run; an error the replica raises right after it (here,
    from a check that runs after ``on_complete``) still reaches the caller."""
    def broken(self, replica, batch, *used):
        if (self.cluster.table.status == FINISHED).all():
            raise RuntimeError("broken after the last step")

    monkeypatch.setattr(sim.engine.invariants.InvariantChecker, "after_step", broken)
    monkeypatch.setattr(sim.engine.invariants.InvariantChecker, "after_window", broken)
    cfg = compose_cfg(*CONSTANT, "workload.num_requests=10", "check_invariants=true")
    with pytest.raises(RuntimeError, match="broken after the last step"):
        simulate(cfg, requests_for(cfg))
