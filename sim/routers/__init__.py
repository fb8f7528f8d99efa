"""Routing policies of a pool of replicas, selected by ``cluster.router``: one file each, its
class in ``ROUTERS`` (built from the names the classes declare)."""

from sim.registry import by_name
from sim.routers.base import PoolView, Router
from sim.routers.jsq_tokens import JsqTokensRouter
from sim.routers.kv_aware import KvAwareRouter
from sim.routers.least_outstanding import LeastOutstandingRouter
from sim.routers.power_of_two import PowerOfTwoRouter
from sim.routers.prefix_affinity import PrefixAffinityRouter
from sim.routers.round_robin import RoundRobinRouter
from sim.routers.uniform_random import RandomRouter

ROUTERS: dict[str, type[Router]] = by_name(
    RoundRobinRouter, RandomRouter, LeastOutstandingRouter, JsqTokensRouter, KvAwareRouter,
    PrefixAffinityRouter, PowerOfTwoRouter)

__all__ = ["ROUTERS", "PoolView", "Router"]
