"""The kubelet's resource managers as hint providers behind one interface
(:class:`~numalign.topology.managers.base.HintProvider`): CPUs, memory, devices (with
the GPU groups' override)."""
