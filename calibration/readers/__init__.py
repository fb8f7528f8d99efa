"""Readers of measured kernel timings into one row format per operator family (``rows``)."""
