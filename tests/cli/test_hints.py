"""What a user of vLLM or Hydra meant: did-you-mean for unknown keys and options, the override
behind a ``vllm`` flag, and a Hugging Face repo id given as ``model=`` (``cli.hints``, asked by
the preflight check). Each is one ``error:`` line and exit code 2."""

from __future__ import annotations

import pytest

from cli.hints import did_you_mean, flag_hint, repo_id_hint, shipped_models
from cli.preflight import check_overrides


def _error_line(capsys, overrides: list[str]) -> str:
    with pytest.raises(SystemExit) as e:
        check_overrides(list(overrides))
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.mark.parametrize("override, suggestion", [
    ("workload.rat=3", "did you mean 'rate'?"),
    ("sheduler=vllm", "did you mean 'scheduler'?"),
    ("scheduler.max_num_seq=8", "did you mean 'max_num_seqs'?"),
    ("kv_cache.block_sise=16", "did you mean 'block_size'?"),
    ("model=llama3_8bb", "did you mean 'llama3_8b'"),
    ("scheduler=vlm", "did you mean 'vllm'"),
])
def test_unknown_keys_and_options_get_a_did_you_mean(capsys, override, suggestion):
    line = _error_line(capsys, [override])
    assert suggestion in line, line
    assert override.split("=")[0].rsplit(".", 1)[-1] in line


def test_no_suggestion_when_nothing_is_close(capsys):
    line = _error_line(capsys, ["workload.zzzzqqq=3"])
    assert "did you mean" not in line and "zzzzqqq" in line


@pytest.mark.parametrize("argv, override", [
    (["--model", "llama3_8b"], "write model=llama3_8b"),
    (["--max-num-seqs=64"], "write scheduler.max_num_seqs=64"),
    (["--tensor-parallel-size", "2"], "write cluster.tensor_parallel_size=2"),
    (["-tp", "2"], "write cluster.tensor_parallel_size=2"),
    (["--request-rate", "3"], "write workload.rate=3"),
    (["--num-prompts", "100"], "write workload.num_requests=100"),
    (["--gpu-memory-utilization", "0.8"], "write kv_cache.gpu_memory_utilization=0.8"),
    (["workload.rate=2", "--enable-prefix-caching"], "write kv_cache.prefix_caching=..."),
    (["--dataset-name", "random"], "write workload=random"),
    (["--dataset-name", "sharegpt"], "write workload=sharegpt"),
    (["--sharegpt-output-len", "128"], "write workload.output_tokens=128"),
    (["--random-input-len", "2048"], "write workload.random.input_len=2048"),
    (["--random-range-ratio=0.5"], "write workload.random.range_ratio=0.5"),
    (["--random-prefix-len", "512"], "write workload.random.prefix_len=512"),
    # Gamma gaps of shape b have CV 1/sqrt(b)
    (["--burstiness", "4"], "write workload.arrival=gamma workload.cv=0.5"),
])
def test_vllm_flags_name_their_override(capsys, argv, override):
    line = _error_line(capsys, argv)
    assert "not flags" in line and override in line, line


def test_a_flag_with_no_counterpart_points_at_the_keys(capsys):
    line = _error_line(capsys, ["--frobnicate"])
    assert "--frobnicate" in line and "--cfg job" in line


def test_hydra_flags_are_left_to_hydra():
    check_overrides(["--cfg", "job", "workload.rate=2"])  # no exit: Hydra prints the config


@pytest.mark.parametrize("repo_id, option", [
    ("meta-llama/Llama-3.1-8B-Instruct", "model=llama3_8b"),
    ("meta-llama/Llama-3.1-8B", "model=llama3_8b"),  # the base model of a shipped -Instruct
    ("Qwen/Qwen3-8B", "model=qwen3_8b"),
    ("qwen/qwen3-8b", "model=qwen3_8b"),
])
def test_a_repo_id_of_a_shipped_model_names_its_option(capsys, repo_id, option):
    line = _error_line(capsys, [f"model={repo_id}"])
    assert "Hugging Face repo id" in line and option in line, line
    assert f"huggingface-cli download {repo_id} config.json" in line


def test_a_repo_id_of_another_model_says_how_to_pass_it(capsys):
    line = _error_line(capsys, ["model=acme/foo-7b"])
    assert "nothing is downloaded" in line and "model=foo-7b" in line
    assert "shipped option" not in line


def test_a_local_path_that_is_missing_gets_no_repo_hint(tmp_path):
    assert repo_id_hint(str(tmp_path / "none" / "config.json")) == ""
    assert repo_id_hint("./models/config.json") == ""


def test_hint_helpers():
    assert did_you_mean("rat", ["rate", "cv"]) == "; did you mean 'rate'?"
    assert did_you_mean("q", ["rate"]) == ""
    keys = ["scheduler.max_num_seqs", "cluster.tensor_parallel_size", "seed"]
    assert flag_hint("--seed", "3", keys).endswith("write seed=3")
    assert flag_hint("--max-num-seq", None, keys).endswith("write scheduler.max_num_seqs=...")
    shipped = shipped_models()
    assert shipped["meta-llama/Llama-3.1-8B-Instruct"] == "llama3_8b"
    assert all("/transformer" not in k for k in shipped)  # top-level ids only


def test_a_replayed_config_json_option_name_says_to_pass_the_path(capsys):
    """A run's ``.hydra/overrides.yaml`` holds ``model=<name>@<digest>`` for a config.json
    read by path; replayed in a new process, that name is not an option."""
    line = _error_line(capsys, ["model=Llama-3.1-8B@1a2b3c4d"])
    assert "pass model=<the path of that config.json>" in line and "available" not in line
