"""Shared fixtures of the scenarios tests: repo root on sys.path, the shared data folder."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
if str(REPO) not in sys.path:  # run without installing the package
    sys.path.insert(0, str(REPO))


@pytest.fixture
def shared_traces() -> Path:
    """The folder of real public traces next to the repo; skip the test when it is absent."""
    traces = SHARED / "traces"
    if not traces.is_dir():
        pytest.skip(f"shared data not found at {traces} (expected ../shared next to the repo)")
    return traces
