"""Synthetic shared prefixes: system prompts and multi-turn sessions as ``hash_ids``."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from scenarios import (
    LengthConfig,
    MultiTurnConfig,
    SystemPromptConfig,
    WorkloadConfig,
    WorkloadError,
    build_requests,
    check_workload,
    requests_for_seed,
)
from scenarios.prefixes import BlockNamer

REPO = Path(__file__).resolve().parents[2]


def system(count=1, tokens=1024, **kw) -> WorkloadConfig:
    w = WorkloadConfig(name="sp", num_requests=kw.pop("num_requests", 300),
                       input=LengthConfig(dist="uniform", low=1, high=300),
                       output=LengthConfig(dist="fixed", value=8), **kw)
    w.system_prompt = SystemPromptConfig(count=count, tokens=tokens)
    return w


def multi(turns=None, **kw) -> WorkloadConfig:
    turns = LengthConfig(dist="uniform", low=1, high=6) if turns is None else turns
    mt = MultiTurnConfig(enabled=True, turns=turns,
                         think_time_s=kw.pop("turn_think_s", 3.0),
                         max_input_tokens=kw.pop("max_input_tokens", None))
    return WorkloadConfig(name="mt", num_requests=kw.pop("num_requests", 400),
                          input=LengthConfig(dist="uniform", low=1, high=700),
                          output=LengthConfig(dist="uniform", low=1, high=700),
                          multi_turn=mt, **kw)


def sessions(df: pd.DataFrame):
    """Rows grouped into sessions: a session starts at every row with an arrival time."""
    start = df["arrival_time_s"].notna().to_numpy()
    return np.cumsum(start) - 1


def test_block_namer_shares_whole_blocks_of_a_system_prompt_only():
    namer = BlockNamer(num_prompts=2, prompt_tokens=1000, block_tokens=512)
    a = namer.cover(namer.start(1), 1100)
    b = namer.cover(namer.start(1), 1030)
    c = namer.cover(namer.start(0), 600)
    assert a[:1] == b[:1] == [1] and c[:1] == [0]  # one whole 512-block per system prompt
    assert len(a) == len(b) == 3 and len(c) == 2
    assert len(set(a[1:]) | set(b[1:]) | set(c[1:])) == 5  # the rest is fresh everywhere
    assert namer.cover(namer.start(-1), 10) == [7]  # no system prompt: all fresh


def test_system_prompt_lengths_and_ids():
    df = requests_for_seed(system(count=1, tokens=1024), 0)
    base = requests_for_seed(WorkloadConfig(name="x", num_requests=300,
                                            input=LengthConfig(dist="uniform", low=1, high=300),
                                            output=LengthConfig(dist="fixed", value=8)), 0)
    # the system prompt is prepended; arrivals and the request's own lengths are unchanged
    assert (df["input_tokens"] == base["input_tokens"] + 1024).all()
    pd.testing.assert_frame_equal(df.drop(columns=["input_tokens", "hash_ids"]),
                                  base.drop(columns="input_tokens"))
    ids = df["hash_ids"].tolist()
    assert all(h[:2] == (0, 1) for h in ids)  # 1024 tokens = two 512-token blocks, shared
    assert [len(h) for h in ids] == (-(-df["input_tokens"] // 512)).tolist()
    rest = [x for h in ids for x in h[2:]]
    assert len(rest) == len(set(rest)) and min(rest) >= 2  # fresh ids for the questions


@pytest.mark.parametrize("popularity, expected", [
    ("uniform", np.full(4, 0.25)),
    ("zipf", (1 / np.arange(1, 5) ** 1.2) / (1 / np.arange(1, 5) ** 1.2).sum()),
])
def test_system_prompt_popularity(popularity, expected):
    w = system(count=4, tokens=512, num_requests=20_000)
    w.system_prompt.popularity, w.system_prompt.zipf_exponent = popularity, 1.2
    first = np.array([h[0] for h in requests_for_seed(w, 3)["hash_ids"]])
    share = np.bincount(first, minlength=4) / len(first)
    np.testing.assert_allclose(share, expected, atol=0.012)


def test_multi_turn_prompts_repeat_the_conversation():
    w = multi()
    w.system_prompt = SystemPromptConfig(count=3, tokens=1536)
    df = requests_for_seed(w, 1)
    assert len(df) == 400
    sid = sessions(df)
    p, o = df["input_tokens"].to_numpy(), df["output_tokens"].to_numpy()
    same = sid[1:] == sid[:-1]
    # the new message of a follow-up turn: its prompt minus the previous prompt and output
    message = p[1:][same] - p[:-1][same] - o[:-1][same]
    assert message.min() >= 1 and message.max() <= 700
    assert ((p[~np.r_[False, same]] - 1536) >= 1).all()  # first turns: system prompt + message
    ids = df["hash_ids"].tolist()
    for i in np.flatnonzero(same):  # each turn's ids extend the previous turn's
        assert ids[i + 1][:len(ids[i])] == ids[i]
    assert [len(h) for h in ids] == (-(-(p + o) // 512)).tolist()  # prompt and output named
    # sessions share ids only through their system prompt (3 whole blocks of it)
    firsts = df.groupby(sid).head(1)
    assert {h[:3] for h in firsts["hash_ids"]} <= {(0, 1, 2), (3, 4, 5), (6, 7, 8)}


def test_multi_turn_open_loop_release_and_think_times():
    df = requests_for_seed(multi(rate=2.0), 2)
    sid = sessions(df)
    first = df["arrival_time_s"].notna().to_numpy()
    assert (df["client"].to_numpy() == sid).all()  # one client per session, released in turn
    starts = df["arrival_time_s"].to_numpy()[first]
    assert starts[0] > 0 and (np.diff(starts) > 0).all()
    assert (df["think_time_s"][first] == 0).all() and (df["think_time_s"][~first] == 3.0).all()


def test_multi_turn_closed_loop_users_run_sessions_back_to_back():
    w = multi(arrival="closed_loop", concurrency=4, think_time_s=30.0, ramp_up_s=2.0)
    df = build_requests(w, np.random.default_rng(0), np.random.default_rng(1))
    first_rows = df.groupby("client").head(1)
    assert first_rows.index.tolist() == sorted(first_rows.index) and len(first_rows) == 4
    assert first_rows["arrival_time_s"].tolist() == [0.0, 0.5, 1.0, 1.5]
    assert df.drop(index=first_rows.index)["arrival_time_s"].isna().all()
    # a turn that restarts the conversation (no earlier ids) waits the between-session think
    ids = df["hash_ids"].tolist()
    prev = {}
    for i, c in enumerate(df["client"].tolist()):
        if c in prev:
            follow = ids[i][:len(ids[prev[c]])] == ids[prev[c]]
            assert df["think_time_s"][i] == (3.0 if follow else 30.0)
        prev[c] = i


def test_fixed_overrides_set_the_message_and_the_answer():
    w = multi(turns=LengthConfig(dist="fixed", value=3), input_tokens=100, output_tokens=50,
              num_requests=9)
    df = requests_for_seed(w, 0)
    assert df["input_tokens"].tolist() == [100, 250, 400] * 3
    assert (df["output_tokens"] == 50).all()


def test_max_input_tokens_ends_sessions_early_and_keeps_the_count():
    df = requests_for_seed(multi(max_input_tokens=1500, num_requests=300), 4)
    assert len(df) == 300 and df["input_tokens"].max() <= 1500
    with pytest.raises(WorkloadError, match="workload.multi_turn.max_input_tokens"):
        requests_for_seed(multi(max_input_tokens=50, input_tokens=60), 0)


@pytest.mark.parametrize("make", [lambda: system(count=5, tokens=300),
                                  lambda: multi(arrival="gamma", cv=2.0)])
def test_same_seed_same_requests(make):
    a, b, c = (requests_for_seed(make(), s) for s in (7, 7, 8))
    pd.testing.assert_frame_equal(a, b)
    assert a["hash_ids"].tolist() == b["hash_ids"].tolist()
    assert not a.drop(columns="hash_ids").equals(c.drop(columns="hash_ids"))


def test_dictconfig_input_builds_the_same():
    w = multi()
    a = requests_for_seed(w, 0)
    b = requests_for_seed(OmegaConf.structured(w), 0)
    pd.testing.assert_frame_equal(a, b)


@pytest.mark.parametrize("change, field", [
    (lambda w: setattr(w.multi_turn.turns, "value", -1), "workload.multi_turn.turns.value=-1"),
    (lambda w: setattr(w.multi_turn.turns, "dist", "poisson"), "workload.multi_turn.turns.dist"),
    (lambda w: setattr(w.system_prompt, "tokens", 0), "workload.system_prompt.tokens=0"),
    (lambda w: setattr(w.system_prompt, "count", -2), "workload.system_prompt.count=-2"),
    (lambda w: setattr(w.system_prompt, "popularity", "pareto"),
     "workload.system_prompt.popularity"),
    (lambda w: setattr(w.system_prompt, "zipf_exponent", -1.0),
     "workload.system_prompt.zipf_exponent"),
    (lambda w: setattr(w.multi_turn, "think_time_s", -1.0), "workload.multi_turn.think_time_s"),
    (lambda w: setattr(w.multi_turn, "think_time_dist", "normal"),
     "workload.multi_turn.think_time_dist"),
    (lambda w: setattr(w.multi_turn, "max_input_tokens", 1024),
     "workload.multi_turn.max_input_tokens=1024"),  # no room after the system prompt
    (lambda w: setattr(w, "hash_block_tokens", 0), "workload.hash_block_tokens=0"),
    (lambda w: setattr(w, "arrival", "trace") or setattr(w, "trace_path", "x.csv"),
     "workload.system_prompt.count"),
])
def test_bad_values_name_the_field(change, field):
    w = multi(turns=LengthConfig(dist="fixed", value=2))
    w.system_prompt = SystemPromptConfig(count=2, tokens=1024)
    check_workload(w)
    change(w)
    with pytest.raises(WorkloadError) as e:
        check_workload(w)
    assert str(e.value).startswith(field)


def test_bad_turns_at_the_command_line_is_one_line_exit_2(tmp_path):
    run = subprocess.run([sys.executable, "-m", "sim", "workload=multi_turn",
                          "workload.multi_turn.turns.low=-1", "plots=false",
                          f"hydra.run.dir={tmp_path}"],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: workload.multi_turn.turns.low=-1:")
