"""Synthetic shared prefixes as ``hash_ids``: the representation a Mooncake trace carries.

A request's ``hash_ids`` name its prompt in blocks of ``G = workload.hash_block_tokens``
tokens: id ``i`` names tokens ``[i·G, (i+1)·G)``, and two requests share an id only if they
share everything up to the end of that block (so one id names a whole prefix, as in
Mooncake's trace). The simulator maps them onto KV blocks of ``kv_cache.block_size`` tokens
(``sim.kv.prefix.block_hashes``): a KV block is shared when the id of the ``G``-block holding
its last token, and every id before it, agree.

Ids come from a ``BlockNamer``: the ``⌊L/G⌋`` blocks wholly inside system prompt ``k`` (of
``L`` tokens) get ids every request with that prompt shares; every other block gets a fresh
id, unique to its request or session. So a system prompt shares ``⌊L/G⌋·G`` tokens (choose
``L`` a multiple of ``G``, or a smaller ``G``, to share all of it). A block whose content
only grows (the last, partial block of a conversation that the next turn extends) keeps its
id: the cache only ever holds its full KV blocks, which the longer version repeats.

``add_system_prompts`` puts a drawn system prompt in front of open-loop or closed-loop
requests (one turn each), ``add_shared_prefix`` one prefix in front of all of them (vLLM's
random dataset); multi-turn sessions are built by ``scenarios.sessions``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd


def choose_system_prompts(sp: Any, n: int, rng: np.random.Generator) -> np.ndarray:
    """Which system prompt each of ``n`` requests (or sessions) starts with: ``-1`` for none
    (``count`` 0), else uniform or Zipf (``P(k) ∝ (k + 1)^-zipf_exponent``) over
    ``0..count-1``."""
    count = int(sp.count)
    if count == 0:
        return np.full(n, -1, np.int64)
    if sp.popularity == "uniform":
        return rng.integers(count, size=n, dtype=np.int64)
    weight = np.arange(1, count + 1, dtype=float) ** -float(sp.zipf_exponent)
    return rng.choice(count, size=n, p=weight / weight.sum()).astype(np.int64)


class BlockNamer:
    """Hands out the ids of ``block_tokens``-token blocks: shared ones for the blocks wholly
    inside each system prompt, fresh ones for everything else."""

    def __init__(self, num_prompts: int, prompt_tokens: int, block_tokens: int) -> None:
        self.block_tokens = int(block_tokens)
        self.shared = int(prompt_tokens) // self.block_tokens if num_prompts else 0
        self.next_id = int(num_prompts) * self.shared  # ids below are the system prompts'

    def start(self, prompt: int) -> list[int]:
        """The ids of a new request's or session's leading blocks: those of system prompt
        ``prompt`` (none for ``-1``)."""
        if prompt < 0:
            return []
        first = int(prompt) * self.shared
        return list(range(first, first + self.shared))

    def cover(self, ids: list[int], num_tokens: int) -> list[int]:
        """Extend ``ids`` in place with fresh ids until they name ``num_tokens`` tokens;
        returns ``ids``."""
        need = -(-int(num_tokens) // self.block_tokens) - len(ids)
        if need > 0:
            ids.extend(range(self.next_id, self.next_id + need))
            self.next_id += need
        return ids


def add_system_prompts(rows: pd.DataFrame, w: Any, rng: np.random.Generator) -> pd.DataFrame:
    """Put one of ``w.system_prompt.count`` system prompts in front of each row's prompt:
    ``input_tokens`` grows by ``system_prompt.tokens`` and a ``hash_ids`` column names the
    prompt (the system prompt's blocks shared, the rest fresh)."""
    sp = w.system_prompt
    choice = choose_system_prompts(sp, len(rows), rng)
    return _prepend(rows, choice, int(sp.count), int(sp.tokens), int(w.hash_block_tokens))


def add_shared_prefix(rows: pd.DataFrame, tokens: int, block_tokens: int) -> pd.DataFrame:
    """Put one prefix of ``tokens`` tokens in front of every row's prompt, as vLLM's random
    dataset does with ``--random-prefix-len`` (the same ``hash_ids`` as one system prompt
    drawn by every request)."""
    return _prepend(rows, np.zeros(len(rows), np.int64), 1, int(tokens), int(block_tokens))


def _prepend(rows: pd.DataFrame, choice: np.ndarray, count: int, tokens: int,
             block_tokens: int) -> pd.DataFrame:
    """``rows`` with prompt ``choice[i]`` (of ``count`` prompts of ``tokens`` tokens) in front of
    row ``i``'s prompt and the ``hash_ids`` naming the whole prompt."""
    namer = BlockNamer(count, tokens, block_tokens)
    prompt = rows["input_tokens"].to_numpy(np.int64) + tokens
    ids = np.empty(len(rows), dtype=object)
    for i, (k, p) in enumerate(zip(choice.tolist(), prompt.tolist(), strict=True)):
        ids[i] = tuple(namer.cover(namer.start(k), p))
    out = rows.copy()
    out["input_tokens"] = prompt
    out["hash_ids"] = pd.Series(ids, index=out.index, dtype=object)
    return out
