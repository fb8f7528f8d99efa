"""Grounds the cost model in measured GPU timings: table readers, fits, error reports."""
