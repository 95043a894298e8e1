"""The agent's NRI plugin: numalign sets containers' cpusets through the container runtime.

- :mod:`.mux`: NRI's multiplexing of connections over the one unix socket.
- :mod:`.ttrpc`: the ttrpc protocol (unary calls) on one such connection.
- :mod:`.plugin`: the plugin itself (registration, events, adjustments, updates).
- :mod:`.placer`: the engine's decisions as cpusets (exclusive CPUs, the shared pool).
- :mod:`.pods`: the node's pods as the placer needs them (resolved policy, recorded allocation).
- :mod:`.devices`: the devices the kubelet assigned, as fixed hints for the engine.
- :mod:`.managed`: the numalign-managed node (label, refusal, records, rejection), started by
  the real-node agent given ``--nri-socket``.
"""
