"""Same seed, same output; and the one-way data flow of docs/architecture.md."""

from __future__ import annotations

import ast
from pathlib import Path

import pandas as pd

from sim import simulate

REPO = Path(__file__).resolve().parents[2]


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


def is_command_door(path: Path) -> bool:
    """A module that only opens a command of ``cli/`` under an old name (``python -m sim``,
    ``python -m sim.explain``): a docstring, imports, and the ``__main__`` block."""
    body = ast.parse(path.read_text()).body
    return all(isinstance(n, (ast.Import, ast.ImportFrom))
               or (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))
               or (isinstance(n, ast.If) and "__main__" in ast.unparse(n.test))
               for n in body)


def test_simulation_core_imports_neither_scenarios_nor_analysis_nor_the_commands():
    for path in (REPO / "sim").rglob("*.py"):
        if is_command_door(path):
            assert imported_packages(path) <= {"cli", "sim", "sys"}, path
            continue
        assert not imported_packages(path) & {"scenarios", "analysis", "calibration", "cli"}, \
            path


def test_the_command_doors_are_the_two_commands():
    doors = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "sim").rglob("*.py")
                   if is_command_door(p) and "cli" in imported_packages(p))
    assert doors == ["sim/__main__.py", "sim/explain.py"]


HEAD_FIELDS = {"num_attention_heads", "num_key_value_heads", "linear_num_key_heads",
               "linear_num_value_heads"}


def _splits_heads(node: ast.AST) -> bool:
    """Whether ``node`` divides a model's head count (``x // tp``, ``cdiv(x, tp)``)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.FloorDiv, ast.Div)):
        side = node.left
    elif isinstance(node, ast.Call) and node.args and "div" in ast.unparse(node.func):
        side = node.args[0]
    else:
        return False
    return isinstance(side, ast.Attribute) and side.attr in HEAD_FIELDS


def test_per_gpu_heads_are_derived_in_one_place():
    """The cost model and the memory budget read per-GPU head counts from
    sim.model.layout.PerGpu; nothing else in sim/ splits a model's heads over GPUs."""
    found = [f"{path.relative_to(REPO)}:{node.lineno}"
             for path in (REPO / "sim").rglob("*.py") if path.name != "layout.py"
             for node in ast.walk(ast.parse(path.read_text())) if _splits_heads(node)]
    assert found == []
    layout = ast.parse((REPO / "sim" / "model" / "layout.py").read_text())
    assert any(_splits_heads(n) for n in ast.walk(layout))  # the check sees a split


def test_scenarios_never_import_sim():
    for path in (REPO / "scenarios").rglob("*.py"):
        assert not imported_packages(path) & {"sim", "analysis", "calibration"}, path


def _runtime_imports(path: Path, modules: set[str]) -> set[str]:
    """The project modules ``path`` imports when it runs (``if TYPE_CHECKING:`` blocks are
    for type checkers only), at module level or inside functions."""
    tree = ast.parse(path.read_text())
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
            and getattr(node.test, "id", "") == "TYPE_CHECKING" for n in ast.walk(node)}
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out |= {node.module} & modules
            out |= {f"{node.module}.{a.name}" for a in node.names} & modules
    return out


def test_no_module_imports_itself_back():
    paths = {}
    for package in ("sim", "scenarios", "analysis", "calibration", "conf", "cli"):
        for path in (REPO / package).rglob("*.py"):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            paths[name.removesuffix(".__init__")] = path
    # a package's __init__ importing its own submodules is not a cycle
    graph = {m: _runtime_imports(p, set(paths)) - {m} for m, p in paths.items()}
    done, path_stack = set(), []

    def visit(m):
        if m in path_stack:
            raise AssertionError("import cycle: " + " -> ".join(
                path_stack[path_stack.index(m):] + [m]))
        if m in done:
            return
        path_stack.append(m)
        for n in sorted(graph[m]):
            visit(n)
        path_stack.pop()
        done.add(m)

    for m in sorted(graph):
        visit(m)


def test_the_architecture_page_names_every_part_of_the_core():
    """docs/architecture.md's table of ``sim/`` stays the map of ``sim/``: each module and
    subpackage at its top level is named there."""
    page = (REPO / "docs" / "architecture.md").read_text()
    parts = sorted(p.name for p in (REPO / "sim").iterdir()
                   if (p.is_dir() and (p / "__init__.py").exists())
                   or (p.suffix == ".py" and p.stem not in {"__init__", "__main__", "explain"}))
    missing = [name for name in parts
               if f"`{name}`" not in page and f"`{name}/`" not in page]
    assert not missing, f"docs/architecture.md does not name: {missing}"
