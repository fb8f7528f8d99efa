"""The Hydra shell of ``python -m calibration fit|check``: compose, validate, run, report.

Like ``python -m sim``: ``key=value`` overrides, a run directory under ``outputs/`` (Hydra's
``hydra.run.dir`` overrides it), and bad input as one line on stderr with exit code 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from analysis.inputs import output_dir
from calibration.config import CONF_DIR, check, register
from cli.preflight import one_line
from sim.errors import ConfigError, OutputError, report_error

register()
_ARGS: list[str] = []


def compose_or_exit(overrides: list[str]) -> DictConfig:
    """The composed config; one line and exit code 2 if it does not compose."""
    try:
        with initialize_config_dir(CONF_DIR, version_base=None):
            cfg = compose("calibration", overrides=overrides, return_hydra_config=True)
        output_dir(str(cfg.hydra.run.dir), "hydra.run.dir")
        OmegaConf.set_struct(cfg, False)
        del cfg["hydra"]
        OmegaConf.to_container(cfg, throw_on_missing=True)
        return cfg
    except (HydraException, OmegaConfBaseException) as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        sys.exit(2)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def _command_line(cfg: DictConfig) -> str:
    keep = [a for a in _ARGS if not a.startswith(("hydra.", "command="))]
    return " ".join(["python -m calibration", cfg.command, *keep])


@hydra.main(version_base=None, config_path=CONF_DIR, config_name="calibration")
def _main(cfg: DictConfig) -> None:
    outdir = Path(HydraConfig.get().runtime.output_dir)
    try:
        check(cfg)
        if cfg.command == "fit":
            from calibration.fit import run
            run(cfg, outdir, _command_line(cfg))
        else:
            from calibration.check import run
            run(cfg, outdir)
    except (ConfigError, OutputError) as e:
        sys.exit(report_error(e))


def run_command(command: str, overrides: list[str]) -> int:
    """Run ``fit`` or ``check`` with ``key=value`` overrides; the process exit code."""
    args = [*overrides, f"command={command}"]
    argv = sys.argv
    try:
        compose_or_exit([a for a in args if not a.lstrip("+~").startswith(("hydra.", "hydra/"))
                         or a.lstrip("+~").startswith("hydra.run.dir=")])
        _ARGS[:] = overrides
        sys.argv = [f"{argv[0]} {command}", *args]
        _main()
    except SystemExit as e:
        return int(e.code or 0)
    finally:
        sys.argv = argv
    return 0
