"""Python clients and servicers for the kubelet's gRPC APIs, generated from their protos.

- :mod:`numalign.kubeletapi.podresources_v1`: the PodResources API (``v1.PodResourcesLister``:
  ``List``, ``GetAllocatableResources``, ``Get``), served on the kubelet's pod-resources socket.
- :mod:`numalign.kubeletapi.deviceplugin_v1beta1`: the device plugin API (``v1beta1.Registration``
  served by the kubelet, ``v1beta1.DevicePlugin`` served by a plugin).
- :mod:`numalign.kubeletapi.runtime_v1`: the Container Runtime Interface (``runtime.v1``:
  ``RuntimeService``, ``ImageService``) that the kubelet calls on the container runtime.

Each is a package with ``api_pb2`` (messages) and ``api_pb2_grpc`` (stubs, servicers).
Regenerate with ``python -m numalign.kubeletapi.generate`` (see that module); never edit them.
"""
