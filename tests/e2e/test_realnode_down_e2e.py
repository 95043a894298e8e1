"""``numalign dev down`` (RealNode.down) leaves nothing of a real node that ran a pod:
no process, container, mount, cgroup, network namespace, bridge, Node or NodeTopology."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e_helpers import MACHINES, wait_for
from numalign.devcluster.images import WORKLOAD_IMAGE
from numalign.devcluster.realnode import RealNode, cannot_run_containers
from numalign.devcluster.realnode_config import TAINT

pytestmark = pytest.mark.cluster


def _mounts_under(path: Path) -> list[str]:
    base = str(path.resolve())
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        if point == base or point.startswith(base + "/"):
            points.append(point)
    return points


def _processes_using(path: Path) -> list[str]:
    """Command lines of running processes that mention ``path``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(path) in cmd:
            found.append(f"{pid}: {cmd[:200]}")
    return found


def test_down_removes_everything_the_real_node_made(dev_cluster: Any, namespace: str,
                                                    k8s_client: Any) -> None:
    reason = cannot_run_containers()
    if reason is not None:
        pytest.skip(f"this machine cannot run containers: {reason}")
    core: Any = client.CoreV1Api(k8s_client)
    node = RealNode(dev_cluster, MACHINES / "realnode-2numa.yaml")
    try:
        node.up(timeout=300)
        core.create_namespaced_pod(namespace, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "w"},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": "localhost"},
                     "tolerations": [{"key": TAINT["key"], "operator": "Exists"}],
                     "containers": [{"name": "w", "image": WORKLOAD_IMAGE,
                                     "imagePullPolicy": "Never"}]}})
        wait_for(lambda: core.read_namespaced_pod("w", namespace).status.phase == "Running",
                 180, "the pod Running on the real node")
        netns = node.containerd_dir / "state"
        assert _mounts_under(node.dir), "a running pod has mounts (rootfs, netns)"
        assert Path(f"/sys/class/net/{node.bridge}").exists()
        cgroups = [h / node.cgroup_root.lstrip("/") for h in map(Path, (
            "/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpuset", "/sys/fs/cgroup/memory",
            "/sys/fs/cgroup")) if (h / "cgroup.procs").exists()]
        assert any(c.is_dir() for c in cgroups)
    finally:
        assert node.down() in (True, False)
    assert not node.dir.exists()
    assert _mounts_under(node.dir) == []
    assert not any(p.startswith(str(netns)) for p in _mounts_under(Path("/")))
    assert not Path(f"/sys/class/net/{node.bridge}").exists()
    assert [c for c in cgroups if c.exists()] == []
    assert _processes_using(node.dir) == []
    for read in (lambda: core.read_node("localhost"),
                 lambda: client.CustomObjectsApi(k8s_client).get_cluster_custom_object(
                     "numalign.io", "v1alpha1", "nodetopologies", "localhost")):
        with pytest.raises(ApiException) as err:
            read()
        assert err.value.status == 404
