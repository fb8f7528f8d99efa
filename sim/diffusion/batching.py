"""Batching of same-shape image jobs in the node pool (``cluster.batching``).

Jobs of one key (model, size, frames, steps, guidance, priority; images only) form one unit
of at most ``max_images`` images. With ``max_wait_s`` > 0 an arriving job joins the open
batch of its key, which queues when full or ``max_wait_s`` after its first job arrived;
either way a fresh unit leaving the queue takes queued units of its key along (``merge``),
as long as a plan of its gang runs the larger batch.
"""

from __future__ import annotations

from dataclasses import replace

from sim.diffusion.records import QUEUED
from sim.diffusion.unit import Unit


class Batcher:
    """Open batches and the fresh queued units of each key, for one ``NodePool``."""

    def __init__(self, pool, max_images: int, max_wait_s: float) -> None:
        self.pool = pool
        self.max_images, self.max_wait_s = int(max_images), float(max_wait_s)
        self.forming: dict[tuple, Unit] = {}
        self.by_key: dict[tuple, list[Unit]] = {}  # fresh queued batchable units per key

    def batchable(self, unit: Unit) -> bool:
        """Whether ``unit`` may take more images: batching is on, an image, not full."""
        return (self.max_images > 1 and unit.shape.frames == 1
                and unit.shape.images < self.max_images)

    def waits(self, unit: Unit) -> bool:
        """Whether an arriving ``unit`` joins an open batch rather than queueing now."""
        return self.max_wait_s > 0 and self.batchable(unit)

    def form(self, unit: Unit) -> None:
        """Add a batchable job to the open batch of its key (sealed when full, or
        ``max_wait_s`` after its first job arrived)."""
        p = self.pool
        open_ = self.forming.get(unit.key)
        if open_ is not None and open_.shape.images + unit.shape.images > self.max_images:
            self.seal(open_.uid, open_.key)
            open_ = None
        if open_ is None:
            self.forming[unit.key] = unit
            p.table.status[unit.ids] = QUEUED
            timer = p.env.timeout(self.max_wait_s)
            timer.callbacks.append(lambda _e, u=unit.uid, k=unit.key: self.seal(u, k))
            return
        self.absorb(open_, unit)
        if open_.shape.images >= self.max_images:
            self.seal(open_.uid, open_.key)

    def absorb(self, into: Unit, other: Unit) -> None:
        """``other``'s jobs join ``into``."""
        into.ids = into.ids + other.ids
        into.shape = replace(into.shape, images=into.shape.images + other.shape.images)
        into.sid = self.pool.shape_id(into.shape)
        self.pool.table.status[other.ids] = QUEUED

    def seal(self, uid: int, key: tuple) -> None:
        """The open batch ``uid`` of ``key`` queues (nothing if it has already)."""
        unit = self.forming.get(key)
        if unit is None or unit.uid != uid:
            return  # sealed already
        del self.forming[key]
        self.pool.enqueue(unit)
        self.pool.check("after a batch was sealed")

    def queued(self, unit: Unit) -> None:
        """``unit`` was queued: remember it as a batch to join while it is fresh."""
        if unit.fresh and self.batchable(unit):
            self.by_key.setdefault(unit.key, []).append(unit)

    def merge(self, unit: Unit) -> Unit:
        """A fresh batchable unit leaving the queue takes queued jobs of its key along, up
        to ``max_images`` images (a batch no plan of its gang runs is not formed)."""
        peers = self.by_key.get(unit.key)
        if not peers:
            return unit
        p = self.pool
        keep = []
        for v in peers:
            if v is unit or v not in p.queue:
                continue
            if unit.shape.images + v.shape.images <= self.max_images and \
                    p.timing(replace(unit.shape, images=unit.shape.images
                                     + v.shape.images), unit.gpus) is not None:
                p.queue.remove(v)
                self.absorb(unit, v)
            else:
                keep.append(v)
        self.by_key[unit.key] = keep
        return unit

    def drop_open(self) -> list[Unit]:
        """Close every open batch without queueing it; the units they held."""
        units = list(self.forming.values())
        self.forming.clear()
        return units
