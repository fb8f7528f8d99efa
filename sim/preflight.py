"""Compose the config once before Hydra runs, so a bad override is one line, not a page.

Hydra reports an unknown option or key over several lines; this check composes the same
config with Hydra's compose API and, on failure, prints one line naming the field and the
value, then exits with code 2. Sweeps (``-m``) and Hydra's own flags are left to Hydra.
"""

from __future__ import annotations

import sys

from hydra import compose, initialize_config_module
from hydra.errors import HydraException, MissingConfigException
from omegaconf.errors import OmegaConfBaseException


def one_line(e: BaseException) -> str:
    """A single-line description of a config-composition error."""
    if isinstance(e, MissingConfigException) and e.missing_cfg_file:
        group, _, option = str(e.missing_cfg_file).rpartition("/")
        options = [o for o in (e.options or []) if not o.startswith("base_")]
        if group:
            return f"{group}={option!r}: unknown option; available: {', '.join(options)}"
    cause = e
    while cause.__cause__ is not None and not isinstance(cause, OmegaConfBaseException):
        cause = cause.__cause__
    key = getattr(cause, "full_key", None)
    lines = [ln.strip() for ln in str(cause).splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith(("full_key", "reference_type",
                                                      "object_type", "To append"))]
    msg = "; ".join(lines[:2]) if lines else type(cause).__name__
    return f"{key}: {msg}" if key else msg


def compose_or_exit(overrides: list[str]):
    """The composed config of ``overrides``; one line and exit code 2 if it does not compose."""
    import sim.app  # noqa: F401  (registers the schemas)

    try:
        with initialize_config_module("conf", version_base=None):
            return compose("config", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        sys.exit(2)


def check_overrides(argv: list[str]) -> None:
    """Exit with one line and code 2 if ``argv``'s overrides do not compose."""
    if any(a.startswith("-") for a in argv):
        return  # -m, --help, --cfg, ...: Hydra handles these itself
    compose_or_exit([a for a in argv if not a.lstrip("+~").startswith(("hydra.", "hydra/"))])
