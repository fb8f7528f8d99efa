"""The efficiency forms of ``sim.cost.operators``: smooth tables, file round trips, regimes."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from calibration.fitting import TableBasis, TableSpec
from sim.cost.operators import (
    CommEfficiency,
    Eta,
    GemmEfficiency,
    Term,
    comm_time,
    gemm_time,
    wave_quantization,
)


def test_term_interpolates_in_log_space_and_clamps():
    t = Term(("m",), (np.array([0.0, 4.0]),), np.log(np.array([0.25, 1.0])))
    assert np.exp(t({"m": 4.0})) == pytest.approx(0.5)  # halfway in log2 m and in log factor
    assert np.exp(t({"m": 0.5})) == pytest.approx(0.25) and np.exp(t({"m": 1e6})) == 1.0
    two = Term(("a", "b"), (np.array([0.0, 2.0]), np.array([0.0, 2.0])),
               np.log(np.array([[1.0, 2.0], [4.0, 8.0]])))
    assert np.exp(two({"a": 2.0, "b": 2.0})) == pytest.approx(np.sqrt(8.0))


def test_eta_round_trips_through_the_file_form():
    e = Eta(0.8, (Term(("m", "n"), (np.arange(3.0), np.arange(2.0)),
                       np.log(np.array([[1.0, 0.5], [0.9, 0.7], [1.2, 1.1]]))),))
    back = Eta.from_dict(e.to_dict())
    m, n = np.array([1.0, 3.0, 7.0]), np.array([1.0, 1.5, 2.0])
    assert back(m=m, n=n) == pytest.approx(e(m=m, n=n), rel=1e-4)
    assert Eta.from_dict(0.7)(m=m) == 0.7
    with pytest.raises(ValueError, match="positive factor table"):
        Term.from_dict({"axes": ["m"], "log2_knots": [[0, 1]], "factor": [1.0, -1.0]})


def test_fitting_basis_is_the_simulators_interpolation():
    spec = TableSpec(("m", "k"), ((0.0, 2.0, 4.0, 6.0), (1.0, 3.0, 5.0)))
    basis = TableBasis([spec])
    rng = np.random.default_rng(0)
    p = rng.normal(size=basis.size)
    x = {"m": 2.0 ** rng.uniform(-1, 7, 50), "k": 2.0 ** rng.uniform(0, 6, 50)}
    eta = basis.eta(p)
    assert np.log(eta(**x)) == pytest.approx(basis.matrix(x) @ p, rel=1e-9)
    assert sp.issparse(basis.penalty()) and basis.penalty().shape[1] == basis.size


def test_gemm_unaligned_m_and_wave_quantization():
    e = GemmEfficiency(Eta(0.8), Eta(0.8), 0.0, unaligned_compute=0.5)
    peak, bw = 1e15, 3e12
    aligned = gemm_time(e, 4096, 4096, 4096, peak, bw, 2.0)[0]
    odd = gemm_time(e, 4097, 4096, 4096, peak, bw, 2.0)[0]
    assert odd / aligned == pytest.approx(2.0, rel=1e-3)  # compute-bound, η halved
    assert wave_quantization(128, 128 * 133, 128, 128, 132) == pytest.approx(264 / 133)
    assert wave_quantization(1, 256, 128, 128, 132) == pytest.approx(128.0)  # padding only
    tiled = GemmEfficiency(Eta(0.8), Eta(0.8), 0.0, tile_m=128, tile_n=128)
    ratio = (gemm_time(tiled, 2048, 128 * 67, 4096, peak, bw, 2.0, num_sms=132)[0]
             / gemm_time(e, 2048, 128 * 67, 4096, peak, bw, 2.0)[0])
    assert ratio == pytest.approx(9 / (16 * 67 / 132))  # 1072 tiles: 9 waves for 8.1 of work


def test_allreduce_takes_the_faster_algorithm():
    e = CommEfficiency(Eta(0.8), 10e-6, eta_small=0.5, latency_small_s=3e-6)
    link = 450e9
    small = float(comm_time(e, "allreduce", 4096, 8, link))
    assert small == pytest.approx(3e-6 + 7 * 4096 / (link * 0.5))  # one-shot
    big = float(comm_time(e, "allreduce", 1 << 30, 8, link))
    assert big == pytest.approx(10e-6 + 1.75 * (1 << 30) / (link * 0.8))  # ring
    assert float(comm_time(e, "allreduce", 1 << 30, 1, link)) == 0.0
    assert float(comm_time(e, "p2p", 1 << 20, 2, link)) == pytest.approx(
        10e-6 + (1 << 20) / (link * 0.8))
