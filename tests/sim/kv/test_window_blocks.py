"""A request's sliding-window blocks (``sim.kv.manager``): they grow with its length up to the
window, come and go with its KV blocks, and the accounting stays exact."""

from __future__ import annotations

import numpy as np

from sim.kv.manager import PagedKVCache, state_blocks_for


def cache(window, prompts, outputs, num_blocks=201, fixed=0):
    kv = PagedKVCache(num_blocks, 16, len(prompts), state_blocks=fixed, window=window)
    kv.set_lengths(np.array(prompts), np.array(outputs))
    return kv


def test_window_blocks_grow_with_the_request_up_to_the_window():
    # gpt-oss: 12 sliding layers per block of 12 full ones, at most cdiv(127, 16) + 1 blocks
    assert state_blocks_for(100, 16, 0, (12, 12, 9)) == 7
    assert state_blocks_for(1000, 16, 0, (12, 12, 9)) == 9
    assert state_blocks_for(np.array([16, 17, 144]), 16, 2, (12, 12, 9)).tolist() == [3, 4, 11]
    # six padded groups of 10 sliding layers per block of 10 full ones (Gemma-3-27B)
    assert state_blocks_for(100, 16, 0, (60, 10, 65)) == 42
    # 10 sliding layers per block of 30: a third of a block per block of tokens, rounded up
    assert state_blocks_for(1000, 16, 0, (10, 30, 9)) == 3
    assert state_blocks_for(40, 16, 0, (10, 30, 9)) == 1
    assert state_blocks_for(40, 16, 5, None) == 5


def test_window_blocks_are_taken_and_returned_with_the_kv():
    kv = cache((12, 12, 9), prompts=[100, 1000, 40], outputs=[0, 24, 8])
    assert kv.holds_state and kv.state_of(np.arange(3)).tolist() == [7, 9, 3]
    assert kv.allocate(0, 0, 100) == 7 + 7
    assert kv.allocate(1, 0, 512) == 32 + 9
    assert kv.allocate(1, 512, 512) == 32  # the window's blocks were taken once
    assert kv.free_blocks == 200 - 14 - 41 - 32
    assert kv.audit(np.array([0, 1])) == ""
    # 113 free: 111 blocks and its 3 of window do not fit, 110 would
    assert not kv.allocate_all(np.array([2]), np.array([0]), np.array([111 * 16]))
    assert kv.allocate_all(np.array([2]), np.array([0]), np.array([40]))
    assert kv.free_blocks == 200 - 14 - 41 - 32 - (3 + 3)
    assert kv.audit(np.array([0, 1, 2])) == ""
    kv.free(np.array([0, 2]))
    kv.free(1)
    assert kv.free_blocks == 200 and kv.audit(np.array([], np.int64)) == ""


def test_a_request_must_fit_with_its_window():
    kv = cache((12, 12, 9), prompts=[10], outputs=[0], num_blocks=11)  # 10 usable
    assert kv.fits_alone(np.array([16, 80, 96])).tolist() == [True, True, False]
    assert kv.allocate(0, 0, 10) == 2 and kv.free_blocks == 8
