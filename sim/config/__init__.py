"""Typed schemas of the simulator's config groups, one module per group.

Each YAML under ``conf/<group>/`` starts from one of these dataclasses (registered in
``conf.schema``), so a wrong type or an unknown key fails when Hydra composes the config.
Range and cross-field checks that a type cannot express live in each module's ``check_*``.
"""

from sim.config import backend, cluster, cost, hardware, kv_cache, model, scheduler
from sim.config.backend import BackendConfig, check_backend
from sim.config.cluster import (
    ClusterConfig,
    FailureConfig,
    LinkDegradationConfig,
    StragglerConfig,
    check_cluster,
)
from sim.config.common import DTYPE_BYTES, positive
from sim.config.cost import ConstantCostConfig, RooflineCostConfig, check_cost_model
from sim.config.hardware import HardwareConfig, check_hardware
from sim.config.kv_cache import KVCacheConfig, check_kv_cache
from sim.config.model import ModelConfig, check_model
from sim.config.parallel import check_parallelism
from sim.config.scheduler import SchedulerConfig, check_scheduler

# every (group, schema name, dataclass) that conf/ YAMLs build on
SCHEMAS = [s for m in (model, hardware, backend, scheduler, kv_cache, cluster, cost)
           for s in m.SCHEMAS]

__all__ = [
    "SCHEMAS",
    "DTYPE_BYTES", "BackendConfig", "ClusterConfig", "ConstantCostConfig", "FailureConfig",
    "LinkDegradationConfig", "StragglerConfig",
    "HardwareConfig", "KVCacheConfig", "ModelConfig", "RooflineCostConfig", "SchedulerConfig",
    "check_backend", "check_cluster", "check_cost_model", "check_hardware", "check_kv_cache",
    "check_model", "check_parallelism", "check_scheduler", "positive",
]
