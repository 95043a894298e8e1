"""Oracles the engine is checked against, for tests and benchmarks.

``reference_merge`` (the kubelet Topology Manager's cross-product merge) and
``gpu_bruteforce`` (exhaustive GPU group allocation) are slow, obviously-correct
references written straight from the algorithm they check; ``kubelet_oracle`` runs the
kubelet's own admission code (a Go program linking Kubernetes' packages, built by
``numalign.devcluster.oracle_build``). They import only ``topology``.
"""
