"""CUDA-graph capture sizes and padded steps (``sim.cost.cuda_graphs``)."""

from __future__ import annotations

import numpy as np
import pytest

from sim.builders import build_cost_model, plain
from sim.cost.cuda_graphs import capture_sizes


def test_vllm_capture_list_and_padding():
    g = capture_sizes("vllm", max_num_seqs=1024, max_num_batched_tokens=8192, tp=1)
    assert g.sizes[:5] == (1, 2, 4, 8, 16) and g.sizes[-1] == 512 and len(g.sizes) == 67
    assert g.padded(9, decode_step=False) == 16  # any step, prefill or mixed too
    assert g.padded(512, True) == 512 and g.padded(513, True) == 513  # above: unpadded
    assert capture_sizes("vllm", 128, 8192, 1).sizes[-1] == 256  # 2 · max_num_seqs
    assert capture_sizes("vllm", 1024, 100, 1).sizes[-1] == 96  # not above the budget
    assert not capture_sizes("vllm", 1024, 8192, 1, enforce_eager=True).sizes


def test_sglang_pads_decode_steps_only():
    g = capture_sizes("sglang", 1024, 8192, tp=1)
    assert g.sizes[:6] == (1, 2, 4, 8, 12, 16) and g.sizes[-1] == 256
    assert g.padded(13, decode_step=True) == 16 and g.padded(13, decode_step=False) == 13
    assert capture_sizes("sglang", 1024, 8192, tp=4).sizes[-1] == 512
    assert capture_sizes("sglang", 1024, 8192, tp=1, cuda_graph_max_bs=8).sizes == (1, 2, 4, 8)


def test_trtllm_replays_a_graph_only_at_a_captured_decode_size():
    """CudaGraphConfig's default list, enable_padding off: a decode batch of another size (or
    any step with a prompt in it) runs the model's eager code, unpadded."""
    g = capture_sizes("trtllm", 1024, 8192, tp=1)
    assert g.sizes == (*range(1, 32), 32, 64, 128)
    assert g.graph_size(33, decode_step=True) is None and g.padded(33, True) == 33
    assert g.graph_size(64, True) == 64 and g.graph_size(64, False) is None
    assert g.dispatches(33, True) and not g.dispatches(64, True) and g.dispatches(64, False)
    assert g.dispatches(129, True)
    assert capture_sizes("trtllm", 1024, 8192, 1, batch_sizes=[4, 2, 1, 2]).sizes == (1, 2, 4)


def test_which_steps_dispatch_their_kernels():
    sglang = capture_sizes("sglang", 1024, 8192, tp=1)
    assert sglang.dispatches(100, False) and not sglang.dispatches(100, True)
    assert sglang.dispatches(300, True)  # above cuda_graph_max_bs (256)
    vllm = capture_sizes("vllm", 1024, 8192, tp=1)
    assert not vllm.dispatches(9, False) and not vllm.dispatches(4096, False)  # compiled code
    assert capture_sizes("vllm", 1024, 8192, 1, enforce_eager=True).dispatches(8, True)
    assert capture_sizes("vllm", 1024, 8192, 1, batch_sizes=[3]).sizes == (3,)


@pytest.mark.parametrize("sizes", [[], [0, 8], [1.5]])
def test_a_capture_list_must_be_positive_integers(sizes):
    from sim.config.backend import BackendConfig, check_backend
    from sim.errors import ConfigError
    with pytest.raises(ConfigError, match="backend.cuda_graph_batch_sizes"):
        check_backend(BackendConfig(cuda_graph_batch_sizes=sizes))


def test_a_padded_step_costs_its_captured_size(compose_cfg):
    """Nine decodes run the 16-token graph: their token operators cost what 16 tokens cost;
    with enforce_eager they cost nine tokens' worth."""
    graphs = build_cost_model(plain(compose_cfg()))
    eager = build_cost_model(plain(compose_cfg("backend.enforce_eager=true")))
    ctx = np.full(9, 500)
    assert graphs.graphs.padded(9, True) == 16
    padded = graphs._stage_token_parts(9, 9, True)[0]
    assert padded == pytest.approx(eager._stage_token_parts(16, 9, True)[0])
    assert graphs.step_cost(np.ones(9, int), ctx).time_s > eager.step_cost(
        np.ones(9, int), ctx).time_s
