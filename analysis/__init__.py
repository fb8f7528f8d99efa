"""Turns simulation records into what people read: metrics, goodput, plots, files."""
