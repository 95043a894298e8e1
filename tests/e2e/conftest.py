"""End-to-end fixtures: the session's control plane (from tests/conftest.py) plus ONE
emulated-node agent process for the whole e2e session, serving

* 2 x ``fragmented-8numa`` (8 NUMA nodes of 4 CPUs: room a scheduler sees that
  single-numa-node cannot use),
* 2 x ``dual-16core`` (2 NUMA nodes of 16 CPUs, same total),
* 1 x ``seed-figure1`` (8 CPUs, a GPU and a NIC per NUMA node).

Every node carries ``numalign.io/e2e-pool=<run>``; the fragmented and dual nodes also
``numalign.io/e2e-role=redeploy``. Pods select those labels, so the real scheduler
places them only here, never on nodes other tests create.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e_helpers import POOL_LABEL, ROLE_LABEL, AgentProcess, node_topology, wait_for

MACHINE_MIX = [("fragmented-8numa", 2), ("dual-16core", 2), ("seed-figure1", 1)]


@pytest.fixture(scope="session")
def e2e_agent(kubeconfig: Path, k8s_client: Any,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    log = tmp_path_factory.mktemp("e2e-agent") / "agent.log"
    start = 700 + uuid.uuid4().int % 200
    agent = AgentProcess(kubeconfig, MACHINE_MIX, start, log).start()
    core: Any = client.CoreV1Api(k8s_client)
    agent.pool = f"run-{start}"
    try:
        def ready() -> bool:
            if not agent.alive():
                raise AssertionError(f"the agent exited:\n{agent.text()[-4000:]}")
            for name in agent.nodes:
                nt = node_topology(k8s_client, name)
                if not nt or not (nt.get("status") or {}).get("zones"):
                    return False
                node = core.read_node(name)
                if not any(c.type == "Ready" and c.status == "True"
                           for c in node.status.conditions or []):
                    return False
            return True

        wait_for(ready, 90, "the emulated nodes Ready with their NodeTopology")
        for name, stem in agent.nodes.items():
            labels = {POOL_LABEL: agent.pool}
            if stem in ("fragmented-8numa", "dual-16core"):
                labels[ROLE_LABEL] = "redeploy"
            core.patch_node(name, {"metadata": {"labels": labels}})
        yield agent
    finally:
        agent.stop()
        for name in agent.nodes:
            with contextlib.suppress(ApiException):
                core.delete_node(name)
            with contextlib.suppress(ApiException):
                client.CustomObjectsApi(k8s_client).delete_cluster_custom_object(
                    "numalign.io", "v1alpha1", "nodetopologies", name)


@pytest.fixture
def core(k8s_client: Any) -> client.CoreV1Api:
    return client.CoreV1Api(k8s_client)


@pytest.fixture
def apps(k8s_client: Any) -> client.AppsV1Api:
    return client.AppsV1Api(k8s_client)
