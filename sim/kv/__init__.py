"""The KV cache of one replica: its budget (``budget``, sized by each engine's start-up rule in
``rules``), its paged block manager (``manager``), prefix-block hashing and the pool of
cached blocks (``prefix``)."""

from sim.kv.prefix import PrefixPool, block_hashes

__all__ = ["PrefixPool", "block_hashes"]
