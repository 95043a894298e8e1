"""The agent's NRI plugin: numalign sets containers' cpusets through the container runtime.

- :mod:`.mux`: NRI's multiplexing of connections over the one unix socket.
- :mod:`.ttrpc`: the ttrpc protocol (unary calls) on one such connection.
- :mod:`.plugin`: the plugin itself (registration, events, adjustments, updates).
- :mod:`.placer`: the engine's decisions as cpusets (exclusive CPUs, the shared pool).
"""
