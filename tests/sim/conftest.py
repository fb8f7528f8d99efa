"""Helpers of the simulator tests: request tables (compose_cfg is in tests/conftest.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from scenarios import requests_for_seed


def _requests_for(cfg, seed: int = 0) -> pd.DataFrame:
    return requests_for_seed(cfg.workload, seed)


def _open_loop(arrivals, inputs, outputs) -> pd.DataFrame:
    n = len(arrivals)
    return pd.DataFrame({"arrival_time_s": np.asarray(arrivals, float),
                         "input_tokens": np.asarray(inputs, np.int64),
                         "output_tokens": np.asarray(outputs, np.int64),
                         "client": np.full(n, -1, np.int64), "think_time_s": np.zeros(n)})


@pytest.fixture
def requests_for():
    """The request table of ``cfg.workload`` under a seed (same streams as the CLI)."""
    return _requests_for


@pytest.fixture
def open_loop():
    """A hand-made open-loop request table from arrival times and lengths."""
    return _open_loop
