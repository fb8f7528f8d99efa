"""What every policy must do the same way, without SimPy."""

from __future__ import annotations

import numpy as np
import pytest

from sim.schedulers import SCHEDULERS


@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_a_request_whose_prompt_kv_arrived_only_computes_its_last_token(make, step, name):
    # a decode replica of a disaggregated cluster gets the prompt's KV over the link and
    # recomputes only the last prompt token (vLLM's P/D connector: computed = prompt − 1)
    s, t, kv = make(name, [40, 40], [3, 3], add=False)
    t.computed[0] = 39
    s.add_request(0)
    b, _ = step(s, 0.0)
    assert list(b.ids) == [0] and list(b.new_tokens) == [1] and list(b.context_tokens) == [39]
    assert t.generated[0] == 1 and kv.held[0] >= kv.blocks_for(40)


@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_every_request_completes_and_frees_its_blocks(make, step, name):
    rng = np.random.default_rng(0)
    s, t, kv = make(name, rng.integers(1, 60, 12), rng.integers(1, 30, 12), num_blocks=40,
                    block_size=4, max_num_seqs=4, max_num_batched_tokens=64, chunk_size=32)
    for i in range(2000):
        if not s.has_work():
            break
        b, _ = step(s, float(i))
        assert b is not None and kv.free_blocks >= 0
    assert (t.generated == t.max_output).all() and kv.free_blocks == kv.num_blocks
