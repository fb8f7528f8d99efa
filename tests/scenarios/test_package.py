"""Package hygiene: public API, no backwards imports, docstrings on public functions."""

import ast
import inspect
from pathlib import Path

import scenarios

SRC = Path(scenarios.__file__).parent
FORBIDDEN = {"sim", "analysis", "calibration"}


def test_public_api():
    for name in ("build_requests", "WorkloadConfig", "LengthConfig", "check_workload"):
        assert name in scenarios.__all__ and hasattr(scenarios, name)


def test_never_imports_sim_analysis_or_calibration():
    for path in SRC.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                roots = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                roots = {(node.module or "").split(".")[0]}
            else:
                continue
            assert not roots & FORBIDDEN, f"{path.name} imports {roots & FORBIDDEN}"


def test_public_functions_and_classes_have_docstrings():
    for path in SRC.glob("*.py"):
        tree = ast.parse(path.read_text())
        assert ast.get_docstring(tree), f"{path.name} has no module docstring"
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef) and not node.name.startswith("_"):
                assert ast.get_docstring(node), f"{path.name}:{node.name} has no docstring"
    assert inspect.getdoc(scenarios.build_requests)
