"""Benchmarks: `python -m bench` runs the CPU ones (see docs/benchmarks.md)."""
