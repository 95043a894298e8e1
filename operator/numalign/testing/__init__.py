"""Oracles the engine is checked against, for tests and benchmarks.

Each is a slow, obviously-correct reference written straight from the algorithm it
checks: ``reference_merge`` (the kubelet Topology Manager's cross-product merge) and
``gpu_bruteforce`` (exhaustive GPU group allocation). They import only ``topology``.
"""
