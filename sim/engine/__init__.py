"""The event loop and what runs in it: ``run`` (``simulate``: the replicas, the SimPy loop or
the compiled one, the records), ``replica`` (one serving instance as a SimPy process),
``cluster`` and ``cluster_outputs`` (pools, routing, failures, what the replicas hand over),
``frontend`` (each replica's API server), ``disagg`` (prefill/decode hand-over), ``faults``
(slow replicas, a degraded KV link) and ``invariants`` (the checks after every step).

Nothing is imported here, so that the policies these modules drive can import
``sim.engine.*`` without importing the loop."""
