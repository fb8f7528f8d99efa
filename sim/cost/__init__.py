"""Cost models: how long one engine step takes for a given batch shape."""

from sim.cost.base import CostModel, OperatorCost, StepCost
from sim.cost.constant import ConstantCostModel
from sim.cost.roofline import RooflineCostModel

__all__ = ["CostModel", "ConstantCostModel", "OperatorCost", "RooflineCostModel", "StepCost"]
