"""Python messages of the Node Resource Interface (NRI) and of its ttrpc transport,
generated from their published protos.

- :mod:`numalign.nriapi.v1alpha1`: NRI's ``nri.pkg.api.v1alpha1`` messages (``api_pb2``): the
  ``Runtime`` service a plugin calls (``RegisterPlugin``, ``UpdateContainers``) and the
  ``Plugin`` service it serves (``Configure``, ``Synchronize``, ``CreateContainer``, ...).
- :mod:`numalign.nriapi.ttrpc`: ttrpc's ``Request`` and ``Response`` envelopes (``request_pb2``)
  and the status they carry (``status_pb2``).

Regenerate with ``python -m numalign.nriapi.generate`` (see that module); never edit them.
"""
