"""Which measured data a command reads: format detection, the reader call, and provenance
(the files used, their versions, and a sha256 over their bytes)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from calibration.readers import aiconfigurator, vidur
from sim.errors import ConfigError


@dataclass
class Measured:
    """Rows per family, and where they came from."""

    format: str
    frames: dict[str, pd.DataFrame]
    tables: dict[str, dict] = field(default_factory=dict)  # family → file, version, reuse
    files: list[Path] = field(default_factory=list)
    root: Path = Path(".")

    def sha256(self) -> str:
        """sha256 over the bytes of every file read, in sorted relative-path order."""
        h = hashlib.sha256()
        for f in sorted(set(self.files), key=lambda p: str(p.relative_to(self.root))):
            h.update(str(f.relative_to(self.root)).encode())
            h.update(f.read_bytes())
        return h.hexdigest()


def detect(root: Path) -> str:
    """``aiconfigurator`` (op folders such as gemm/, attention/) or ``vidur`` (profiling/)."""
    if any((root / op).is_dir() for op in ("gemm", "attention", "comm", "moe")):
        return "aiconfigurator"
    if any((p / "compute").is_dir() for p in (root / "data" / "profiling", root / "profiling")):
        return "vidur"
    raise ConfigError("data_dir", str(root), "neither an aiconfigurator <system> folder "
                      "(gemm/, attention/, …) nor a Vidur data folder (data/profiling/)")


def read(cfg) -> Measured:
    """The measured rows ``cfg`` (data_dir, format, backend, version, hardware) selects."""
    root = Path(cfg.data_dir).resolve()
    fmt = detect(root) if cfg.format == "auto" else cfg.format
    if fmt == "aiconfigurator":
        frames, used = aiconfigurator.read(root, cfg.backend, cfg.version, cfg.nccl_version,
                                           dict(getattr(cfg, "gemm_dtype_versions", None) or {}))
        if not frames:
            raise ConfigError("data_dir", cfg.data_dir, f"no {cfg.backend} tables under it")
        tables = {fam: {"file": str(c.path.relative_to(root)), "version": c.version,
                        **({"reused_from": c.reused_from} if c.reused_from else {})}
                  for fam, c in used.items()}
        return Measured(fmt, frames, tables, [c.path for c in used.values()], root)
    frames, files = vidur.read(root, cfg.hardware)
    if not frames:
        raise ConfigError("data_dir", cfg.data_dir, f"no Vidur profiles for {cfg.hardware}")
    tables = {kind: [str(p.relative_to(root)) for p in paths] for kind, paths in files.items()}
    return Measured(fmt, frames, tables, [p for ps in files.values() for p in ps], root)
