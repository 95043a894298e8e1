"""Fixtures for tests against a real control plane (tests/cluster and tests/e2e): ONE
DevCluster per test session in a temporary state dir (torn down at the end), the
numalign CRDs installed, a Kubernetes client, ``kubectl`` bound to the cluster, and a
fresh namespace per test. Session fixtures start only when a test asks for them, so the
unit tests never start a control plane.

The binaries come from ``ensure_built()``: cached (instant) once built; CI builds them
before pytest runs. When they cannot be built, the fixture errors loudly: a missing
control plane is a broken setup, not a reason to skip.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from numalign.devcluster import DevCluster, ensure_built
from operator_helpers import wait_for

REPO = Path(__file__).resolve().parents[1]


def _log(message: str) -> None:
    print(f"[devcluster] {message}", file=sys.stderr, flush=True)


@pytest.fixture(scope="session")
def dev_cluster() -> Iterator[DevCluster]:
    """The session's control plane (etcd, kube-apiserver, controller manager, scheduler)
    with the CRDs installed and Established."""
    ensure_built(log=_log)
    # A short folder (not pytest's numbered base): the real node's unix sockets live under
    # it, and a socket path has at most 107 bytes (gRPC's device plugin sockets fewer).
    state = Path(tempfile.mkdtemp(prefix="numalign-dc-"))
    cluster = DevCluster(state, name="pytest", ephemeral=True)
    try:
        cluster.up(log=_log)
        yield cluster
    finally:
        cluster.down(log=_log)
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="session")
def kubeconfig(dev_cluster: DevCluster) -> Path:
    return dev_cluster.kubeconfig


Kubectl = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="session")
def kubectl(kubeconfig: Path) -> Kubectl:
    """``kubectl(*args, input=None, check=True)`` against the session's cluster; the
    client/server version-skew warning is removed from stderr."""
    env = dict(os.environ, KUBECONFIG=str(kubeconfig))

    def run(*args: str, input: str | None = None, check: bool = True,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(["kubectl", *args], input=input, capture_output=True, text=True,
                              env=env, timeout=timeout, check=False)
        proc.stderr = "\n".join(line for line in proc.stderr.splitlines()
                                if "version difference between client" not in line)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}):\n"
                                 f"{proc.stderr}\n{proc.stdout}")
        return proc

    return run


@pytest.fixture(scope="session")
def k8s_client(kubeconfig: Path) -> Iterator[Any]:
    """A ``kubernetes.client.ApiClient`` for the session's cluster (admin)."""
    from kubernetes import config

    api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
    try:
        yield api
    finally:
        api.close()


@pytest.fixture
def namespace(k8s_client: Any, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace (with its default service account) for one test; deleted after
    (without waiting for it to finish terminating)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core: Any = client.CoreV1Api(k8s_client)
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{base or 't'}-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": name, "labels": {"numalign.io/test": "true"}}})

    def has_default_sa() -> bool:
        try:
            core.read_namespaced_service_account("default", name)
            return True
        except ApiException as e:
            if e.status == 404:
                return False
            raise

    wait_for(has_default_sa, 30, f"the default service account in {name}")
    try:
        yield name
    finally:
        try:
            core.delete_namespace(name)
        except ApiException as e:
            if e.status != 404:
                raise


@pytest.fixture(scope="session")
def wait() -> Callable[..., Any]:
    """``wait(predicate, timeout, what)``: poll until truthy (see wait_for)."""
    return wait_for
