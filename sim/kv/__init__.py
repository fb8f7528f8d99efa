"""Parts of the KV-cache manager beyond block counting: prefix-block hashing and the pool of
cached blocks (``prefix``)."""

from sim.kv.prefix import PrefixPool, block_hashes

__all__ = ["PrefixPool", "block_hashes"]
