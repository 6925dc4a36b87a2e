"""Benchmarks: gpu-alloc against the bare Engine (python -m tests.bench)."""
