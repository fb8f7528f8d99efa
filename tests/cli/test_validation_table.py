"""One case per row of ``docs/validation.md``: every check of the validation layer refuses its
bad input with one line that names the field and the value, and says what would be valid.

A case runs one of three ways: ``cli`` through ``python -m sim`` (exit code 2, one ``error:``
line on stderr, no traceback, no outputs), ``compose`` through the CLI's own preflight in this
process (``cli.preflight.compose_or_exit``: the same line and exit code), or ``validate``
through ``cli.validation.validate_config`` on the composed config (one ``ConfigError`` or
``WorkloadError`` of one line). Each error line must contain the row's "message contains"
text from the docs and the case's own field and value.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

import conf.schema  # noqa: F401  (registers the config schemas)
from cli.preflight import compose_or_exit
from cli.validation import validate_config
from scenarios import WorkloadError
from sim.errors import ConfigError
from tests.cli.validation_cases import CASES, DIFFUSION, DISAGG, FILES, ROWS, SMALL, TRACE


def test_every_docs_row_has_a_case_and_every_case_a_row():
    assert len(ROWS) >= 30
    assert sorted(set(ROWS) - set(CASES)) == [], "docs rows without a test case"
    assert sorted(set(CASES) - set(ROWS)) == [], "test cases without a docs row"


def _write_files(root: Path) -> None:
    for name, content in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            (root / name).write_bytes(content)
        else:
            (root / name).write_text(content)


def _check_line(name: str, line: str) -> None:
    assert "\n" not in line.strip(), line
    assert "Traceback" not in line, line
    for text in (ROWS[name], *CASES[name].expect):
        assert text in line, (name, text, line)
    assert "np.float64" not in line, line  # plain numbers, not numpy reprs


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory, sim_cli):
    """Every ``cli`` case, run once, in parallel."""
    cwd = tmp_path_factory.mktemp("validation_cli")
    _write_files(cwd)
    jobs = {name: [*SMALL, *c.overrides] for name, c in CASES.items() if c.via == "cli"}
    return sim_cli.run_many(jobs, cwd)


@pytest.fixture(scope="module")
def case_dir(tmp_path_factory) -> Path:
    """The folder the in-process cases run in, with every file they name."""
    cwd = tmp_path_factory.mktemp("validation")
    _write_files(cwd)
    return cwd


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.via == "cli"])
def test_cli_case(cli_runs, name):
    run = cli_runs[name]
    assert run.returncode == 2, run.describe()
    assert "Traceback" not in run.stdout + run.stderr, run.describe()
    lines = run.stderr.splitlines()
    assert len(lines) == 1, run.describe()
    assert lines[0].startswith("error: "), lines[0]
    _check_line(name, lines[0])
    assert not (run.outdir / "summary.json").exists()
    assert not (run.outdir / "requests.parquet").exists()


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.via == "compose"])
def test_compose_case(case_dir, monkeypatch, capsys, name):
    monkeypatch.chdir(case_dir)
    with pytest.raises(SystemExit) as exit_info:
        compose_or_exit([*SMALL, *CASES[name].overrides])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), lines[0]
    _check_line(name, lines[0])


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.via == "validate"])
def test_validate_case(case_dir, monkeypatch, name):
    monkeypatch.chdir(case_dir)
    with initialize_config_module("conf", version_base=None):
        cfg = compose("config", overrides=[*SMALL, *CASES[name].overrides])
    with pytest.raises((ConfigError, WorkloadError)) as error:
        validate_config(cfg)
    _check_line(name, str(error.value))


def test_the_default_config_and_every_shipped_workload_pass(case_dir, monkeypatch):
    """The checks refuse bad input only: the shipped options validate."""
    monkeypatch.chdir(case_dir)
    with initialize_config_module("conf", version_base=None):
        for extra in ([], ["workload=closed_loop"], ["workload=multi_turn"],
                      ["workload=system_prompt"], ["workload=two_classes"],
                      [*TRACE, "workload.trace_path=ok.csv"], ["experiment=vidur_synthetic"],
                      [*DISAGG], ["model=qwen3_30b_a3b", "cluster.tensor_parallel_size=2",
                                  "cluster.expert_parallel_size=2"],
                      [*DIFFUSION, "model=flux1_dev"], ["workload=mixed", "cluster=mixed"],
                      [*DIFFUSION, "model=hunyuan_video"], [*DIFFUSION, "model=wan21_t2v_14b"],
                      ["workload=diffusion_mix", "cluster=diffusion", "model=flux1_dev"],
                      [*DIFFUSION, "model=flux1_dev", "cluster.elastic=true",
                       "cluster.policy=priority", "cluster.batching.max_images=4"]):
            validate_config(compose("config", overrides=[*SMALL, *extra]))


@pytest.mark.parametrize("backend, size, refused", [
    ("vllm", 256, False), ("vllm", 1, False), ("vllm", 48, True), ("trtllm", 64, False),
    ("trtllm", 48, True), ("sglang", 17, False), ("sglang", 1, False)])
def test_block_size_is_one_the_backend_takes(backend, size, refused):
    """``kv_cache.block_size`` by engine: vLLM's list, TensorRT-LLM's powers of 2, any page
    size for SGLang (``sim.config.kv_cache.check_block_size``)."""
    from sim.config.kv_cache import KVCacheConfig, check_block_size

    if not refused:
        check_block_size(KVCacheConfig(block_size=size), backend)
        return
    with pytest.raises(ConfigError, match=f"kv_cache.block_size={size}: .*backend={backend}"):
        check_block_size(KVCacheConfig(block_size=size), backend)
