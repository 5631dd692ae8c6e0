"""Benchmarks: `xpuspec bench` (xpuspec beside its peers, with a report and plots). One-off measurements
live in research/bench, outside the package."""
