"""Same seed, same output; and the one-way data flow of DESIGN.md."""

from __future__ import annotations

import ast
from pathlib import Path

import pandas as pd

from sim import simulate

REPO = Path(__file__).resolve().parents[2]
# entry points wire everything
SHELLS = {"app.py", "__main__.py", "preflight.py", "explain.py", "validation.py",
          "unused_settings.py", "run_dir.py", "run_summary.py"}


def test_same_seed_same_records(compose_cfg, requests_for):
    cfg = compose_cfg("workload.num_requests=300", "seed=7")
    a = simulate(cfg, requests_for(cfg, 7))
    b = simulate(cfg, requests_for(cfg, 7))
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.timeline, b.timeline)
    c = simulate(cfg, requests_for(cfg, 8))
    assert not a.requests["input_tokens"].equals(c.requests["input_tokens"])


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_simulation_core_imports_neither_scenarios_nor_analysis():
    for path in (REPO / "sim").rglob("*.py"):
        if path.name in SHELLS:
            continue
        assert not imported_packages(path) & {"scenarios", "analysis", "calibration"}, path


def test_scenarios_never_import_sim():
    for path in (REPO / "scenarios").rglob("*.py"):
        assert not imported_packages(path) & {"sim", "analysis", "calibration"}, path
