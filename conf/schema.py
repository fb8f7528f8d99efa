"""The typed schemas every YAML of ``conf/`` builds on: ``Config``, the root of one
simulation's config (the simulator's groups, the workload and the SLO and metrics the
analysis reads), and each group's ``base_*`` schema, registered with Hydra's ConfigStore on
import. Every command that composes ``conf/`` imports this module first; it sits above
``sim``, ``scenarios`` and ``analysis`` because the root joins all three."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from analysis.config import SLOConfig
from analysis.metrics import MetricsConfig
from scenarios import WorkloadConfig
from sim.config import (
    SCHEMAS,
    BackendConfig,
    ClusterConfig,
    HardwareConfig,
    KVCacheConfig,
    ModelConfig,
    SchedulerConfig,
)


@dataclass
class Config:
    """Root schema of one simulation."""

    defaults: list[Any] = field(default_factory=list)
    model: ModelConfig = MISSING
    hardware: HardwareConfig = MISSING
    backend: BackendConfig = MISSING
    scheduler: SchedulerConfig = MISSING
    kv_cache: KVCacheConfig = MISSING
    cluster: ClusterConfig = MISSING
    workload: WorkloadConfig = MISSING
    slo: SLOConfig = MISSING
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    cost_model: Any = MISSING
    seed: int = 0
    progress: str = "auto"
    plots: bool = True
    keep_itl_samples: bool = False
    engine: str = "auto"
    fast_forward: bool = True
    check_invariants: bool = False
    timeline: bool = True
    resume: bool = False


def register_configs() -> None:
    """Register the typed schemas that every YAML of ``conf/`` builds on."""
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)
    for group, name, node in (
        *SCHEMAS,
        ("workload", "base_workload", WorkloadConfig), ("slo", "base_slo", SLOConfig),
    ):
        cs.store(group=group, name=name, node=node)


register_configs()
