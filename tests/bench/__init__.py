"""Benchmarks: gpu-alloc against the bare Engine (python -m tests.bench)."""

# The simulated driver's CUDA version: a real driver always says one, so on a real host
# every GPU create checks its image's CUDA, and the benchmarks' creates do too.
CUDA = "12.4"
