"""Smoke runs of the benchmarks (tiny inputs, no thresholds)."""
