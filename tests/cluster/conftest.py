"""The control-plane fixtures (``dev_cluster``, ``kubeconfig``, ``kubectl``, ``k8s_client``,
``namespace``, ``wait``) live in ``tests/conftest.py``, shared with ``tests/e2e`` so that
one test session starts one control plane; ``tests/operator_helpers.py`` runs the
operator as a subprocess for both."""
