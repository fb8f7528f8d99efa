"""What the user probably meant: did-you-mean suggestions for unknown keys and options, the
override a ``vllm serve`` / ``vllm bench serve`` flag corresponds to, and what to do with a
Hugging Face repo id (this simulator reads local files only; it downloads nothing).

Each function returns a short clause to append to an error line ("" when it has nothing to
say); the preflight check (``cli.preflight``) decides when to ask.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from pathlib import Path

# vLLM flags whose override key is not simply the flag's name with ``_`` for ``-``
VLLM_FLAGS = {
    "model": "model",
    "request-rate": "workload.rate",
    "num-prompts": "workload.num_requests",
    "max-concurrency": "workload.concurrency",
    "enable-prefix-caching": "kv_cache.prefix_caching",
    "no-enable-prefix-caching": "kv_cache.prefix_caching",
    "enable-chunked-prefill": "scheduler.enable_chunked_prefill",
    "tp": "cluster.tensor_parallel_size",
    "pp": "cluster.pipeline_parallel_size",
    "dp": "cluster.data_parallel_size",
    "kv-cache-dtype": "kv_cache.dtype",
    "dataset-name": "workload",
    "dataset-path": "workload.trace_path",
    "random-input-len": "workload.random.input_len",
    "random-output-len": "workload.random.output_len",
    "random-range-ratio": "workload.random.range_ratio",
    "random-prefix-len": "workload.random.prefix_len",
    "sharegpt-output-len": "workload.output_tokens",
    "goodput": "slo",
    "metric-percentiles": "metrics.percentiles",
    "disable-hybrid-kv-cache-manager": "kv_cache.sliding_window_paging",
    "disable-hybrid-swa-memory": "kv_cache.sliding_window_paging",
}
HF_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
MODEL_DIR = Path(__file__).resolve().parent.parent / "conf" / "model"


def did_you_mean(word: str, candidates) -> str:
    """``"; did you mean 'x'?"`` for the candidates closest to ``word`` (up to three)."""
    # (a suggestion ends in "?", so a caller appending more text starts it with "; ")
    close = difflib.get_close_matches(word, sorted(set(candidates)), n=3, cutoff=0.6)
    if not close:
        return ""
    return "; did you mean " + " or ".join(repr(c) for c in close) + "?"


def field_names(schema) -> list[str]:
    """The field names of a config dataclass (empty for anything else)."""
    if isinstance(schema, type) and dataclasses.is_dataclass(schema):
        return [f.name for f in dataclasses.fields(schema)]
    return []


def _leaf_keys(node, prefix: str = "") -> list[str]:
    out = []
    for key, value in node.items():
        out.append(prefix + key)
        if isinstance(value, dict):
            out += _leaf_keys(value, f"{prefix}{key}.")
    return out


def flag_hint(flag: str, value: str | None, config_keys: list[str]) -> str:
    """The override a command-line flag (``--model``, ``--max-num-seqs=64``, ``-tp 2``) most
    likely stands for, as a sentence; ``value``: the argument after the flag, if any;
    ``config_keys``: every dotted key of the composed config (groups included)."""
    name, eq, inline = flag.lstrip("-").partition("=")
    value = inline if eq else (value or "...")
    if name == "burstiness":  # Gamma gaps of shape b: the CV is 1/sqrt(b)
        return (f"{flag}: python -m sim takes Hydra overrides (key=value), not flags; write "
                f"workload.arrival=gamma workload.cv={_cv_of_burstiness(value)}")
    key = VLLM_FLAGS.get(name)
    if key is None:
        underscored = name.replace("-", "_")
        exact = [k for k in config_keys if k.rsplit(".", 1)[-1] == underscored]
        if exact:
            key = min(exact, key=len)
        else:
            close = difflib.get_close_matches(
                underscored, [k.rsplit(".", 1)[-1] for k in config_keys], n=1, cutoff=0.75)
            key = next((k for k in config_keys if close and k.endswith(close[0])), None)
    if key is None:
        return (f"{flag}: python -m sim takes Hydra overrides (key=value), not flags; "
                "see the README or python -m sim --cfg job for the keys")
    return (f"{flag}: python -m sim takes Hydra overrides (key=value), not flags; "
            f"write {key}={value}")


def _cv_of_burstiness(value: str) -> str:
    """The ``workload.cv`` of ``vllm bench serve --burstiness value`` (``1/sqrt(b)``)."""
    try:
        b = float(value)
    except ValueError:
        return "1/sqrt(burstiness)"
    return f"{b ** -0.5:.4g}" if b > 0 and b != float("inf") else "1/sqrt(burstiness)"


def config_keys(cfg) -> list[str]:
    """Every dotted key of a composed config (``cfg``: an OmegaConf node)."""
    from omegaconf import OmegaConf

    return _leaf_keys(OmegaConf.to_container(cfg, resolve=False))


def shipped_models() -> dict[str, str]:
    """``hf_id`` → option name of every ``conf/model`` option that names its repo."""
    out = {}
    for path in sorted(MODEL_DIR.glob("*.yaml")):
        top_level = re.search(r"^hf_id:\s*(\S+)", path.read_text(), re.MULTILINE)
        if top_level:
            out[top_level.group(1)] = path.stem
    return out


def repo_id_hint(value: str) -> str:
    """For a ``model=`` value that is not a local path but looks like ``org/name`` on the
    Hugging Face Hub: the shipped option of that model if there is one, and how to pass any
    other model's config.json (the simulator downloads nothing)."""
    if not HF_REPO_ID.match(value) or Path(value).expanduser().exists():
        return ""
    shipped = shipped_models()
    by_lower = {k.lower(): v for k, v in shipped.items()}
    match = by_lower.get(value.lower())
    if match is None:  # Llama-3.1-8B for the shipped Llama-3.1-8B-Instruct
        variants = [k for k in by_lower if k.startswith(value.lower() + "-")]
        match = by_lower[min(variants, key=len)] if variants else None
    ship = f"a shipped option has its fields, model={match}; or " if match else ""
    folder = value.rsplit("/", 1)[-1]
    return (f"; {value!r} looks like a Hugging Face repo id, and nothing is downloaded: "
            f"{ship}fetch its config.json (huggingface-cli download {value} config.json "
            f"--local-dir {folder}) and pass model={folder}")
