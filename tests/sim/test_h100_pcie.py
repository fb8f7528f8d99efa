"""The H100 PCIe card (conf/hardware/h100_pcie.yaml): the H100 SXM fit on its own datasheet
roofs, so compute-bound steps slow by the tensor peaks' ratio and memory-bound ones by at most
the bandwidths'."""

from __future__ import annotations

import numpy as np
import pytest

from sim.builders import build_cost_model, check_config, plain

SXM, PCIE = (989.4e12, 3.35e12), (756e12, 2.0e12)  # bf16 dense FLOP/s, HBM bytes/s (datasheets)


def steps(compose_cfg, hardware: str):
    """A compute-bound prefill of 8,192 tokens and a memory-bound decode of 8 sequences at
    2,000 tokens of context, Llama-3.1-8B on one GPU."""
    cfg = compose_cfg(f"hardware={hardware}")
    check_config(cfg)
    model = build_cost_model(plain(cfg))
    return (model.step_cost(np.array([8192]), np.array([0])),
            model.step_cost(np.full(8, 1), np.full(8, 2000)))


def test_h100_pcie_prices_steps_on_its_datasheet_roofs(compose_cfg):
    sxm_prefill, sxm_decode = steps(compose_cfg, "h100_sxm")
    pcie_prefill, pcie_decode = steps(compose_cfg, "h100_pcie")
    assert pcie_prefill.compute_s / sxm_prefill.compute_s == pytest.approx(
        SXM[0] / PCIE[0], rel=0.01)
    # bytes over bandwidth, plus per-kernel latencies that do not depend on the card
    ratio = pcie_decode.memory_s / sxm_decode.memory_s
    assert 1.5 < ratio <= SXM[1] / PCIE[1]
    assert sxm_decode.compute_s == pcie_decode.compute_s == 0.0  # decode stays memory bound
