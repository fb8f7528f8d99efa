"""Fixtures every test directory shares."""

from __future__ import annotations

import logging
import os

import pytest
from hydra import compose, initialize_config_module
from hypothesis import settings

import conf.schema  # noqa: F401  (registers the config schemas)

# Property tests draw the same examples on every run (CI and local), so a run's time and
# verdict are reproducible: a random draw once hit a cluster scenario whose replicas fail
# every 0.1 s with unlimited retries, which runs for hours. HYPOTHESIS_PROFILE=explore draws
# fresh examples (with HYPOTHESIS_EXAMPLES=N for a deeper search).
settings.register_profile("deterministic", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))


@pytest.fixture(autouse=True)
def restore_logging():
    """Commands run in-process configure logging the way Hydra does (handlers on the root
    logger bound to the test's captured streams); put every logger's handlers back after each
    test, so a later test does not log into a stream pytest has closed."""
    loggers = [logging.getLogger(), *(logging.getLogger(n) for n in
                                      list(logging.root.manager.loggerDict))]
    saved = {lg: (list(lg.handlers), lg.level, lg.propagate) for lg in loggers
             if isinstance(lg, logging.Logger)}
    yield
    for lg, (handlers, level, propagate) in saved.items():
        lg.handlers[:] = handlers
        lg.setLevel(level)
        lg.propagate = propagate
    for name in list(logging.root.manager.loggerDict):
        lg = logging.getLogger(name)
        if lg not in saved and isinstance(lg, logging.Logger):
            lg.handlers.clear()


@pytest.fixture
def compose_cfg():
    """Compose the project's config with overrides, as ``python -m sim`` would."""

    def _compose(*overrides: str):
        with initialize_config_module("conf", version_base=None):
            return compose("config", overrides=list(overrides))

    return _compose
