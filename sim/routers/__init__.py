"""Routing policies of a pool of replicas, selected by ``cluster.router``; one file each."""

from sim.routers.base import PoolView, Router
from sim.routers.jsq_tokens import JsqTokensRouter
from sim.routers.kv_aware import KvAwareRouter
from sim.routers.least_outstanding import LeastOutstandingRouter
from sim.routers.power_of_two import PowerOfTwoRouter
from sim.routers.prefix_affinity import PrefixAffinityRouter
from sim.routers.round_robin import RoundRobinRouter
from sim.routers.uniform_random import RandomRouter

ROUTERS: dict[str, type[Router]] = {
    "round_robin": RoundRobinRouter,
    "random": RandomRouter,
    "least_outstanding": LeastOutstandingRouter,
    "jsq_tokens": JsqTokensRouter,
    "kv_aware": KvAwareRouter,
    "prefix_affinity": PrefixAffinityRouter,
    "power_of_two": PowerOfTwoRouter,
}

__all__ = ["ROUTERS", "PoolView", "Router"]
