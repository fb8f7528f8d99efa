"""Host swap space for preemption by swap (vLLM v0's ``--swap-space``, ``preemption_mode=swap``).

A preempted request's KV blocks are copied to pinned host memory over PCIe and copied back
when it resumes, instead of being dropped and recomputed. The host space is bounded: when it
cannot hold the victim's blocks the scheduler falls back to recompute. Copies take
``bytes / pcie_bandwidth`` seconds of the step that makes them (vLLM runs ``swap_out`` /
``swap_in`` of the step's ``SchedulerOutputs`` before the model forward).
"""

from __future__ import annotations


class SwapSpace:
    """Host blocks held by swapped-out requests, and the time a copy of blocks takes."""

    def __init__(self, num_blocks: int, block_bytes: int, pcie_bandwidth: float) -> None:
        """``num_blocks`` host blocks of ``block_bytes`` each; ``pcie_bandwidth`` in bytes/s
        one way."""
        self.num_blocks = int(num_blocks)
        self.free_blocks = self.num_blocks
        self.block_bytes = int(block_bytes)
        self.bandwidth = float(pcie_bandwidth)
        self.held: dict[int, int] = {}  # rid → host blocks
        self.peak_used = 0  # most host blocks ever in use

    def copy_time(self, num_blocks: int) -> float:
        """Seconds to copy ``num_blocks`` blocks between GPU and host."""
        return num_blocks * self.block_bytes / self.bandwidth

    def store(self, rid: int, num_blocks: int) -> bool:
        """Keep ``num_blocks`` blocks of ``rid`` on the host; False if there is no room."""
        if num_blocks > self.free_blocks:
            return False
        self.free_blocks -= num_blocks
        self.held[rid] = num_blocks
        self.peak_used = max(self.peak_used, self.num_blocks - self.free_blocks)
        return True

    def release(self, rid: int) -> int:
        """Drop ``rid``'s host blocks (swapped in, or the request is gone); their count."""
        n = self.held.pop(rid, 0)
        self.free_blocks += n
        return n

    @property
    def used_blocks(self) -> int:
        """Host blocks in use now."""
        return self.num_blocks - self.free_blocks
