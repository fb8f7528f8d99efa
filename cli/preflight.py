"""Compose the config once before Hydra runs, so a bad override is one line, not a page.

Hydra reports an unknown option or key over several lines; this check composes the same
config with Hydra's compose API and, on failure, prints one line naming the field and the
value, then exits with code 2. In a sweep (``-m``) every value of every swept key is
composed once (the other sweeps held at their first value), so ``scheduler=vllm,bogus`` is
refused the same way before any job starts; Hydra's other flags are left to Hydra.

It also reads ``model=<path to a Hugging Face config.json, or its folder>`` (or each path of
a sweep, ``-m model=/a/config.json,/b/config.json``) and registers the fields read from the
file as an option of group ``model`` named after the folder and the path
(``Llama-3.1-8B@1a2b3c4d``), so the override becomes ``model=<that option>``: the resolved
config saved with the run shows every field, a user's own ``model.<field>=`` overrides win as
over any option, and a sweep's launcher carries the options to its jobs (Hydra's ConfigStore
travels with them). A path is taken as it is, whatever characters it holds (``,``, ``=``,
``${``), when it names a file or folder; otherwise the value is read as Hydra's choice sweep.
"""

from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path

from hydra import compose, initialize_config_module
from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException, MissingConfigException
from omegaconf.errors import OmegaConfBaseException

from cli.hints import config_keys, did_you_mean, field_names, flag_hint, repo_id_hint
from sim.errors import ConfigError
from sim.hf_config import config_path, read_hf_config

# Hydra's own command-line flags (``python -m sim --help``); any other flag is a mistake
HYDRA_FLAGS = {"-h", "--help", "--hydra-help", "--version", "-c", "--cfg", "--resolve",
               "-p", "--package", "-m", "--multirun", "-sc", "--shell-completion", "-cp",
               "--config-path", "-cn", "--config-name", "-cd", "--config-dir",
               "--experimental-rerun", "-i", "--info", "--run", "-r"}
BASE_MODEL = "base_model"  # the schema itself, registered as an option of group model
# OmegaConf can neither merge a dict into a structured field that is null nor set a key
# inside it, so such a field is set where it is defined
NULL_FIELD = ("a field that is null in the composed config (or a key inside it) cannot be set "
              "on the command line; choose a config option that sets it (e.g. "
              "experiment=vidur_synthetic sets workload.total_length) or set it in your own "
              "conf/ YAML")


def _cause(e: BaseException) -> BaseException | None:
    """The exception ``e`` was raised from or while handling (Hydra wraps the error of a
    config option that does not merge, e.g. a ``model=<config.json>``'s, without ``from``)."""
    if e.__cause__ is not None or e.__suppress_context__:
        return e.__cause__
    return e.__context__


def one_line(e: BaseException) -> str:
    """A single-line description of a config-composition error."""
    if isinstance(e, MissingConfigException) and e.missing_cfg_file:
        group, _, option = str(e.missing_cfg_file).rpartition("/")
        options = [o for o in (e.options or []) if not o.startswith("base_")]
        if group == "model" and "@" in option:  # replayed from a run's overrides.yaml
            return (f"model={option!r}: the name another run gave the config.json it read; "
                    "pass model=<the path of that config.json> again (that run's "
                    ".hydra/config.yaml lists the fields it read)")
        if group:
            return (f"{group}={option!r}: unknown option{did_you_mean(option, options)}; "
                    f"available: {', '.join(options)}")
    cause = e
    while _cause(cause) is not None and not isinstance(cause, OmegaConfBaseException):
        cause = _cause(cause)
    key = getattr(cause, "full_key", None)
    lines = [ln.strip() for ln in str(cause).splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith(("full_key", "reference_type",
                                                      "object_type", "To append"))]
    msg = "; ".join(lines[:2]) if lines else type(cause).__name__
    unknown = getattr(cause, "key", None)
    if isinstance(unknown, str) and msg.startswith(f"Key '{unknown}' not in"):
        msg += did_you_mean(unknown, field_names(getattr(cause, "object_type", None)))
    return f"{key}: {msg}" if key else msg


def config_error_line(e: ConfigError) -> str:
    """The one line printed for a ``ConfigError`` raised while reading overrides, with a
    hint when a ``model=`` value is a Hugging Face repo id rather than a local path."""
    hint = repo_id_hint(str(e.value)) if e.field == "model" else ""
    return f"error: {e}{hint}"


def is_model_path(value: str) -> bool:
    """Whether a ``model=`` value names a file or folder rather than a ``conf/model`` option."""
    return value.endswith(".json") or "/" in value or "\\" in value


def _model_values(value: str) -> list[str]:
    """The values a ``model=`` override names: the value itself when it is an existing file or
    folder (a path may hold characters Hydra's grammar reads otherwise), else each value of
    Hydra's choice sweep (a plain value: itself)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep

    if is_model_path(value) and Path(value).expanduser().exists():
        return [value]
    try:
        parsed = OverridesParser.create().parse_override(f"model={value}").value()
    except HydraException:
        return [value]  # not Hydra's grammar: a path, for read_hf_config to refuse or read
    if isinstance(parsed, ChoiceSweep):
        return [str(v) for v in parsed.list]
    return [parsed] if isinstance(parsed, str) else [value]


def _literal(v: object) -> object:
    """``v`` with OmegaConf's interpolation syntax escaped in every string (a folder named
    ``my${model}`` is a name, not a reference to another key)."""
    if isinstance(v, str):
        return re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", v)
    if isinstance(v, list):
        return [_literal(x) for x in v]
    return v


def register_model_file(value: str) -> str:
    """Register the fields of the ``config.json`` at ``value`` as an option of group ``model``
    (over ``base_model``, so the schema checks each field at composition); its name: the
    model's name (the folder's, in the override grammar's characters) and a digest of the
    file's path, so two folders of one name stay two options.

    Raises ``ConfigError`` (naming ``model``) when the file is missing, unreadable or of an
    unsupported architecture.
    """
    fields = read_hf_config(value)
    digest = hashlib.sha256(str(config_path(value).resolve()).encode()).hexdigest()[:8]
    name = f"{re.sub(r'[^A-Za-z0-9_.+-]', '_', fields['name'])}@{digest}"
    node = {"defaults": [BASE_MODEL, "_self_"], **{f: _literal(v) for f, v in fields.items()}}
    ConfigStore.instance().store(group="model", name=name, node=node)
    return name


def expand_model_path(overrides: list[str]) -> list[str]:
    """``overrides`` with each ``config.json`` path of a ``model=`` override (one, or the
    values of a sweep) replaced by the option ``register_model_file`` makes of it."""
    out: list[str] = []
    for arg in overrides:
        key, sep, value = arg.partition("=")
        values = _model_values(value) if key == "model" and sep else []
        if not any(is_model_path(v) for v in values):
            out.append(arg)
            continue
        names = [register_model_file(v) if is_model_path(v) else v for v in values]
        out.append(f"model={','.join(names)}")
    return out


def compose_or_exit(overrides: list[str]):
    """The composed config of ``overrides``; one line and exit code 2 if it does not compose."""
    import conf.schema  # noqa: F401  (registers the config schemas)

    try:
        overrides = expand_model_path(overrides)
    except ConfigError as e:
        print(config_error_line(e), file=sys.stderr)
        sys.exit(2)
    return compose_each_or_exit([overrides])[0]


def compose_each_or_exit(variants: list[list[str]]) -> list:
    """The composed config of each override list, in one Hydra context; one line naming the
    first that does not compose, and exit code 2."""
    import conf.schema  # noqa: F401  (registers the config schemas)

    try:
        with initialize_config_module("conf", version_base=None):
            return [compose("config", overrides=v) for v in variants]
    except (HydraException, OmegaConfBaseException) as e:
        from scenarios.diffusion_config import entry_key_error

        print(f"error: {entry_key_error(e, variants[0]) or one_line(e)}", file=sys.stderr)
        sys.exit(2)
    except AssertionError as e:  # OmegaConf, when a key is set inside a field that is null
        dotted = [v.split("=", 1)[0] for v in variants[0] if "=" in v and "." in v]
        print(f"error: {e} while setting one of {dotted}: {NULL_FIELD}", file=sys.stderr)
        sys.exit(2)
    except AttributeError as e:  # OmegaConf, when a whole field that is null is set to a dict
        key = re.search(r"full_key: (\S+)", str(e))
        if key is None:
            raise
        print(f"error: {key.group(1)}={{...}}: {NULL_FIELD}", file=sys.stderr)
        sys.exit(2)


def check_overrides(argv: list[str]) -> None:
    """Exit with one line and code 2 if ``argv``'s overrides do not compose.

    A ``model=<config.json>`` override is expanded in place, in ``sys.argv`` too when
    ``argv`` is ``sys.argv[1:]`` (what ``python -m sim`` passes), so Hydra's main sees it.
    """
    refuse_unknown_flags(argv)
    try:
        expanded = expand_model_path(argv)
    except ConfigError as e:
        print(config_error_line(e), file=sys.stderr)
        sys.exit(2)
    if expanded != argv:
        if sys.argv[1:] == argv:
            sys.argv[1:] = expanded
        argv[:] = expanded
    flags = [a for a in argv if a.startswith("-")]
    own = [a for a in argv if not a.startswith("-")
           and not a.lstrip("+~").startswith(("hydra.", "hydra/"))]
    if not flags:
        compose_or_exit(own)
    elif set(flags) <= {"-m", "--multirun"}:
        compose_each_or_exit(sweep_variants(own))
    # --help, --cfg, ...: Hydra handles these itself


def refuse_unknown_flags(argv: list[str]) -> None:
    """Exit with one line and code 2 at the first flag that is not Hydra's (``--model X``,
    ``--max-num-seqs 64``: ``vllm`` habits), naming the override it stands for."""
    for i, arg in enumerate(argv):
        if arg.startswith("-") and arg.partition("=")[0] not in HYDRA_FLAGS:
            import conf.schema  # noqa: F401  (registers the config schemas)

            with initialize_config_module("conf", version_base=None):
                keys = config_keys(compose("config"))
            after = argv[i + 1] if i + 1 < len(argv) and "=" not in argv[i + 1] else None
            print(f"error: {flag_hint(arg, after, keys)}", file=sys.stderr)
            sys.exit(2)


def sweep_variants(overrides: list[str]) -> list[list[str]]:
    """Override lists that together try every value of every choice sweep in ``overrides``
    once: each sweep at its first value, then one list per other value of one sweep. A range
    sweep is tried at its first value only (its values differ by number, not by kind);
    interval and glob sweeps, and overrides Hydra cannot parse, leave the check to Hydra."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep, RangeSweep

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException:
        return []  # Hydra prints its own parse error
    values: list[list[str]] = []
    for text, o in zip(overrides, parsed, strict=True):
        if not o.is_sweep_override():
            values.append([text])
            continue
        if not isinstance(o.value(), (ChoiceSweep, RangeSweep)):
            return []
        vals = list(o.sweep_string_iterator()) if isinstance(o.value(), ChoiceSweep) \
            else [next(iter(o.sweep_string_iterator()))]
        prefix = {"ADD": "+", "DEL": "~", "FORCE_ADD": "++"}.get(o.type.name, "")
        values.append([f"{prefix}{o.key_or_group}={v}" for v in vals] or [text])
    base = [v[0] for v in values]
    out = [base]
    for i, vals in enumerate(values):
        out += [base[:i] + [v] + base[i + 1:] for v in vals[1:]]
    return out
