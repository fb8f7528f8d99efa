"""Schema of ``python -m calibration`` (``conf/calibration/calibration.yaml``) and its checks."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException
from omegaconf import MISSING, OmegaConf
from omegaconf.errors import OmegaConfBaseException

import conf
from analysis.inputs import output_dir, output_file
from cli.preflight import one_line
from sim.config.backend import BACKENDS
from sim.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
CONF_DIR = str(Path(conf.__file__).resolve().parent / "calibration")  # its own search path:
# the sim's groups (hardware/, backend/) would otherwise capture ``hardware=``/``backend=``
FAMILIES = ("gemm", "attention", "comm", "moe", "elementwise", "encoder_attention")


@dataclass
class CalibrationConfig:
    """Keys of the ``fit`` and ``check`` commands (see the YAML for their meaning)."""

    defaults: list[Any] = field(default_factory=list)
    command: str = "fit"
    data_dir: str = MISSING
    hardware: str = "h100_sxm"
    backend: str = "vllm"
    format: str = "auto"
    version: str | None = None
    nccl_version: str | None = None
    gemm_dtype_versions: dict[str, str] = field(default_factory=dict)
    families: list[str] | None = None
    held_out_fraction: float = 0.2
    seed: int = 0
    max_train_rows: int = 12000
    smoothing: float = 0.1
    gemm_tile: list[int] | None = None
    out: str | None = None
    carry_from: str | None = "h100_sxm"
    calibration: str | None = None
    notes: list[str] = field(default_factory=list)
    keep_rest: bool = False  # fit: refit only `families` into the existing file, keep the rest


def register() -> None:
    """Register the schema the YAML builds on."""
    ConfigStore.instance().store(name="base_calibration", node=CalibrationConfig)


def hardware_config(name: str):
    """``conf/hardware/<name>.yaml`` as a DictConfig (peaks, SM count, calibration name)."""
    path = REPO / "conf" / "hardware" / f"{name}.yaml"
    if not path.is_file():
        have = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise ConfigError("hardware", name, f"no conf/hardware/{name}.yaml; have {have}")
    hw = OmegaConf.load(path)
    hw.setdefault("num_sms", 132)
    hw.setdefault("fp8_flops", None)
    return hw


def check(cfg) -> None:
    """Every key in range, with one clear message naming the first bad one."""
    if not Path(cfg.data_dir).is_dir():
        raise ConfigError("data_dir", cfg.data_dir, "not a directory")
    if cfg.backend not in BACKENDS:
        raise ConfigError("backend", cfg.backend, f"one of {list(BACKENDS)}")
    if cfg.format not in ("auto", "aiconfigurator", "vidur"):
        raise ConfigError("format", cfg.format, "one of ['auto', 'aiconfigurator', 'vidur']")
    if not 0.0 <= cfg.held_out_fraction < 1.0:
        raise ConfigError("held_out_fraction", cfg.held_out_fraction, "must be in [0, 1)")
    if cfg.max_train_rows < 100:
        raise ConfigError("max_train_rows", cfg.max_train_rows, "must be >= 100")
    if cfg.smoothing < 0:
        raise ConfigError("smoothing", cfg.smoothing, "must be >= 0")
    if cfg.seed < 0:
        raise ConfigError("seed", cfg.seed, "an integer >= 0")
    if cfg.out is not None:
        output_file(cfg.out, "out")
    for f in cfg.families or []:
        if f not in FAMILIES:
            raise ConfigError("families", f, f"each one of {list(FAMILIES)}")
    if cfg.gemm_tile is not None and (len(cfg.gemm_tile) != 2 or min(cfg.gemm_tile) < 1):
        raise ConfigError("gemm_tile", list(cfg.gemm_tile), "[tile_m, tile_n], both >= 1")


def compose_command(name: str, schema, overrides: list[str]):
    """The composed config of command ``name`` (``conf/calibration/<name>.yaml`` on
    ``schema``) and its run directory (``hydra.run.dir`` may be overridden)."""
    # The simulator's schemas in the ConfigStore make ``hardware``/``backend`` config groups,
    # which would turn ``hardware=NAME`` into a group override; hide them while composing.
    repo = ConfigStore.instance().repo
    hidden = {k: repo.pop(k) for k in [f.name for f in fields(schema)] if k in repo}
    try:
        with initialize_config_dir(CONF_DIR, version_base=None):
            cfg = compose(name, overrides=overrides, return_hydra_config=True)
    finally:
        repo.update(hidden)
    outdir = output_dir(str(cfg.hydra.run.dir), "hydra.run.dir")
    OmegaConf.set_struct(cfg, False)
    del cfg["hydra"]
    OmegaConf.to_container(cfg, throw_on_missing=True)
    return cfg, outdir


def command_main(overrides: list[str] | None, compose_config, body) -> int:
    """Compose (``compose_config(overrides)``), then ``body(cfg, outdir)``; 0, or 2 with one
    line on stderr for bad input."""
    overrides = sys.argv[1:] if overrides is None else list(overrides)
    try:
        cfg, outdir = compose_config(overrides)
        body(cfg, outdir)
    except (HydraException, OmegaConfBaseException) as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


class SimConfigContext:
    """A Hydra context on the simulator's own config tree (``conf/``), for commands that
    compose and simulate many runs (``with`` it, then ``hydra.compose("config", ...)``)."""

    def __enter__(self):
        self._hydra = initialize_config_dir(str(Path(conf.__file__).parent), version_base=None)
        self._hydra.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hydra.__exit__(*exc)
