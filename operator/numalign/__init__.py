"""numalign: NUMA- and device-topology alignment for Kubernetes."""

__version__ = "0.1.0"
