"""Multi-turn sessions: conversations whose every turn re-sends the conversation so far.

A session (``workload.multi_turn``) has ``T`` turns, ``T`` drawn from ``multi_turn.turns``.
Turn ``t`` sends a new user message of ``U_t`` tokens (``workload.input``) after everything
before it, and generates ``O_t`` tokens (``workload.output``), so its prompt is

    P_1 = S + U_1,    P_t = P_(t-1) + O_(t-1) + U_t,

with ``S`` the tokens of the session's system prompt (0 without ``system_prompt``). Its
``hash_ids`` (``scenarios.prefixes``) name ``P_t + O_t`` tokens: the turn's prompt and its
output, which the next turn repeats, so every turn's ids extend the previous turn's. Turn
``t + 1`` is sent ``multi_turn.think_time_s`` after turn ``t`` completes (SGLang's
``bench_multiturn``, Mooncake's conversation trace), which is the simulator's closed-loop
release: a row with a NaN arrival follows the previous row of its ``client``.

- Open loop (``poisson``, ``gamma``): sessions start at the arrival process's times
  (``rate`` is sessions per second); ``client`` is the session's index.
- Closed loop: ``concurrency`` users run sessions back to back, session ``s`` on user
  ``s % concurrency``; a user's next session starts ``workload.think_time_s`` after its
  previous session's last turn (``ramp_up_s`` spreads the users' first sessions).

``num_requests`` counts turns (rows): sessions are drawn until there are that many, and the
last one is cut short. With ``max_input_tokens`` a session ends before the first turn whose
prompt would exceed it. Rows are session by session, turns in order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from scenarios.arrivals import gamma_arrivals, poisson_arrivals, think_times
from scenarios.errors import WorkloadError
from scenarios.lengths import sample_lengths
from scenarios.prefixes import BlockNamer, choose_system_prompts


class _Draws:
    """Values drawn ``chunk`` at a time from ``draw(chunk)`` and handed out in order, so a
    stream is consumed the same way however the values are split into sessions."""

    def __init__(self, draw: Callable[[int], np.ndarray], chunk: int) -> None:
        self.draw, self.chunk = draw, max(1, chunk)
        self.values = np.empty(0, np.int64)
        self.pos = 0

    def take(self, k: int) -> np.ndarray:
        while self.pos + k > len(self.values):
            self.values = np.concatenate([self.values[self.pos:], self.draw(self.chunk)])
            self.pos = 0
        out = self.values[self.pos:self.pos + k]
        self.pos += k
        return out


def _length(w: Any, which: str, rng: np.random.Generator) -> Callable[[int], np.ndarray]:
    """A draw of ``which`` (input or output) lengths: the fixed override if set, else the
    distribution."""
    fixed = getattr(w, f"{which}_tokens")
    if fixed is not None:
        return lambda k: np.full(k, int(fixed), np.int64)
    return lambda k: sample_lengths(getattr(w, which), k, rng, f"workload.{which}",
                                    f"{which}_tokens")


def _turns(w: Any, n: int, rng_lengths: np.random.Generator):
    """Per session: its system prompt and per-turn prompts, outputs and hash ids, until
    there are ``n`` turns."""
    mt, sp = w.multi_turn, w.system_prompt
    rng_in, rng_out = rng_lengths.spawn(2)
    rng_turns, rng_prompt = rng_lengths.spawn(2)
    users, outs = _Draws(_length(w, "input", rng_in), n), _Draws(_length(w, "output", rng_out), n)
    turns = _Draws(lambda k: sample_lengths(mt.turns, k, rng_turns, "workload.multi_turn.turns",
                                            "turns"), n)
    prompts = _Draws(lambda k: choose_system_prompts(sp, k, rng_prompt), n)
    namer = BlockNamer(int(sp.count), int(sp.tokens), int(w.hash_block_tokens))
    system = int(sp.tokens) if sp.count else 0
    cap = mt.max_input_tokens
    sessions, total, empty = [], 0, 0
    while total < n:
        count, k = int(turns.take(1)[0]), int(prompts.take(1)[0])
        u, o = users.take(count), outs.take(count)
        p = system + np.cumsum(u) + np.concatenate([[0], np.cumsum(o)[:-1]])
        keep = count if cap is None else int(np.searchsorted(p, int(cap), side="right"))
        keep = min(keep, n - total)
        if keep == 0:
            empty += 1
            if empty > n:
                raise WorkloadError("workload.multi_turn.max_input_tokens", cap,
                                    f"no session's first turn fits in {n} tries (system "
                                    f"prompt {system} tokens + workload.input)")
            continue
        ids = namer.start(k)
        hashes = [tuple(namer.cover(ids, e)) for e in (p[:keep] + o[:keep]).tolist()]
        sessions.append((p[:keep], o[:keep], hashes))
        total += keep
    return sessions


def session_rows(w: Any, rng_arrivals: np.random.Generator,
                 rng_lengths: np.random.Generator) -> pd.DataFrame:
    """The request table of multi-turn sessions (module docstring), with ``hash_ids``."""
    n = int(w.num_requests)
    sessions = _turns(w, n, rng_lengths)
    sizes = np.array([len(s[0]) for s in sessions], np.int64)
    session = np.repeat(np.arange(len(sizes)), sizes)
    first = np.zeros(n, bool)
    first[np.concatenate([[0], np.cumsum(sizes)[:-1]])] = True
    mt = w.multi_turn
    think = think_times(float(mt.think_time_s), str(mt.think_time_dist), n, rng_arrivals)
    if w.arrival == "closed_loop":
        users = int(w.concurrency)
        client = session % users
        between = think_times(float(w.think_time_s), str(w.think_time_dist), n, rng_arrivals)
        think = np.where(first, between, think)
        opening = first & (session < users)  # each user's first session
        think[opening] = 0.0
        arrival = np.where(opening, client * (float(w.ramp_up_s) / users), np.nan)
    else:
        if w.arrival == "poisson":
            start = poisson_arrivals(float(w.rate), len(sizes), rng_arrivals)
        else:
            start = gamma_arrivals(float(w.rate), float(w.cv), len(sizes), rng_arrivals)
        client = session
        think[first] = 0.0
        arrival = np.where(first, start[session], np.nan)
    hash_ids = np.empty(n, dtype=object)
    for i, h in enumerate(h for s in sessions for h in s[2]):
        hash_ids[i] = h  # one by one: numpy would read equal-length tuples as a 2-D array
    return pd.DataFrame({
        "arrival_time_s": arrival,
        "input_tokens": np.concatenate([s[0] for s in sessions]).astype(np.int64),
        "output_tokens": np.concatenate([s[1] for s in sessions]).astype(np.int64),
        "client": client.astype(np.int64),
        "think_time_s": think,
        "hash_ids": pd.Series(hash_ids, dtype=object),
    })
