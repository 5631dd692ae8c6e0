"""Benchmarks: `xpuspec bench` (xpuspec beside its peers, with a report and plots) and overlap.py."""
