"""A compiled event loop for the single-replica vLLM configuration (``sim.compiled.core``)."""
