"""Reading back what a numalign-managed real node did (tests/e2e/test_realnode_nri_e2e.py):
the containers containerd runs for a pod, each one's cgroup cpuset and its process's
``Cpus_allowed_list``, numalign's decision for it (``numalign.io/allocation`` and
``NodeTopology`` status), and the agent's ``/metrics``."""

from __future__ import annotations

import json
import re
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from numalign.api.allocation import Allocation, parse_allocation
from numalign.api.names import ANN_ALLOCATION
from numalign.topology.quantity import parse_cpulist

KIND = "io.cri-containerd.kind"  # containerd's CRI label: sandbox or container
POD_UID = "io.kubernetes.pod.uid"
POD_NAMESPACE = "io.kubernetes.pod.namespace"
CONTAINER_NAME = "io.kubernetes.container.name"


def cpus(text: str) -> set[int]:
    return set(parse_cpulist(text.strip()))


@dataclass(frozen=True)
class Running:
    """One application container containerd runs on the real node."""

    id: str
    pod_uid: str
    namespace: str
    name: str  # the container's name in its pod
    pid: int
    cgroup_cpus: set[int]
    cgroup_mems: set[int]
    status_cpus: set[int]  # its process's Cpus_allowed_list


def app_containers(node: Any, **labels: str) -> list[str]:
    """Ids of the application containers (not sandboxes) containerd holds, with
    ``labels`` (``pod_uid=...`` or ``namespace=...``), running or not."""
    return containers(node, "container", **labels)


def containers(node: Any, kind: str | None = None, **labels: str) -> list[str]:
    """Ids of the containers containerd holds for the CRI, of ``kind`` (``sandbox`` or
    ``container``; None: both), with ``labels`` (``pod_uid=...`` or ``namespace=...``)."""
    keys = {"pod_uid": POD_UID, "namespace": POD_NAMESPACE}
    sel = ",".join([*([f'labels."{KIND}"=={kind}'] if kind else []),
                    *(f'labels."{keys[k]}"=={v}' for k, v in labels.items())])
    proc = node.ctr("containers", "list", "--quiet", sel, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def _tasks(node: Any) -> dict[str, tuple[int, str]]:
    """containerd's tasks: container id -> (pid, status)."""
    proc = node.ctr("tasks", "list", timeout=30)
    assert proc.returncode == 0, proc.stderr
    out = {}
    for line in proc.stdout.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 3 and fields[1].isdigit():
            out[fields[0]] = (int(fields[1]), fields[2])
    return out


def _cgroup_cpuset(pid: int) -> tuple[set[int], set[int]]:
    """(cpuset.cpus, cpuset.mems) of the cpuset cgroup ``pid`` is in (cgroup v1 or v2)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpuset" in controllers.split(","):
            d = Path("/sys/fs/cgroup/cpuset") / path.lstrip("/")
            return cpus((d / "cpuset.cpus").read_text()), cpus((d / "cpuset.mems").read_text())
        if controllers == "" and Path("/sys/fs/cgroup/cgroup.controllers").is_file():
            d = Path("/sys/fs/cgroup") / path.lstrip("/")
            if (d / "cpuset.cpus.effective").is_file():
                return (cpus((d / "cpuset.cpus.effective").read_text()),
                        cpus((d / "cpuset.mems.effective").read_text()))
    raise AssertionError(f"no cpuset cgroup for pid {pid}")


def _status_cpus(pid: int) -> set[int]:
    m = re.search(r"^Cpus_allowed_list:\s*(\S+)", Path(f"/proc/{pid}/status").read_text(), re.M)
    assert m, f"no Cpus_allowed_list for pid {pid}"
    return cpus(m.group(1))


def running(node: Any, **labels: str) -> dict[str, Running]:
    """The running application containers with ``labels``, by container id."""
    tasks = _tasks(node)
    out = {}
    for cid in app_containers(node, **labels):
        pid, status = tasks.get(cid, (0, ""))
        if status != "RUNNING":
            continue
        proc = node.ctr("containers", "info", cid, timeout=30)
        if proc.returncode != 0 and not Path(f"/proc/{pid}").exists():
            continue  # it stopped since the task list was read
        assert proc.returncode == 0, proc.stderr
        info_labels = json.loads(proc.stdout).get("Labels") or {}
        try:
            c_cpus, c_mems = _cgroup_cpuset(pid)
            status_cpus = _status_cpus(pid)
        except FileNotFoundError:
            continue  # the process exited since the task list was read: not running
        out[cid] = Running(cid, info_labels.get(POD_UID, ""), info_labels.get(POD_NAMESPACE, ""),
                           info_labels.get(CONTAINER_NAME, ""), pid, c_cpus, c_mems,
                           status_cpus)
    return out


def container_id(pod: Any, name: str) -> str:
    for st in pod.status.container_statuses or []:
        if st.name == name and st.container_id:
            return str(st.container_id).split("://", 1)[-1]
    raise AssertionError(f"pod {pod.metadata.name} has no container {name} running")


def allocation(pod: Any) -> Allocation | None:
    text = (pod.metadata.annotations or {}).get(ANN_ALLOCATION)
    return parse_allocation(text) if text else None


def kernel_memory_nodes() -> set[int]:
    """The NUMA nodes with memory this machine's kernel has."""
    base = Path("/sys/devices/system/node")
    for name in ("has_memory", "online"):
        if (base / name).is_file() and (base / name).read_text().strip():
            return cpus((base / name).read_text())
    return {0}


def expected_mems(alloc: Allocation | None, name: str) -> set[int]:
    """The memory nodes numalign's decision gives container ``name``: those its
    allocation holds memory on (else its NUMA nodes) that the kernel has; all of the
    kernel's where it holds none of them (the node's NUMA nodes are a view over fewer
    real memory nodes) or where the container is not pinned."""
    kernel = kernel_memory_nodes()
    held = alloc.containers.get(name) if alloc is not None else None
    if held is None or not held.cpus:
        return kernel
    zones = {int(z) for z, b in held.memory.items() if b and z.isdigit()} or \
        set(held.numa_nodes or [])
    return (zones & kernel) or kernel


def exclusive(alloc: Allocation | None, name: str) -> set[int]:
    held = alloc.containers.get(name) if alloc is not None else None
    return set(held.cpus) if held is not None else set()


def admitted(api: Any, node: str = "localhost") -> dict[tuple[str, str], dict[str, Any]]:
    """``NodeTopology`` status ``admitted``: (namespace, pod) -> entry."""
    nt = client.CustomObjectsApi(api).get_cluster_custom_object(
        "numalign.io", "v1alpha1", "nodetopologies", node)
    return {(e["namespace"], e["pod"]): e
            for e in (nt.get("status") or {}).get("admitted") or []}


def admitted_container_cpus(entry: dict[str, Any], name: str) -> set[int]:
    for c in entry.get("containers") or []:
        if c.get("name") == name:
            return cpus(c.get("cpus") or "")
    return set()


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    """The samples a ``/metrics`` endpoint serves: (name, labels) -> value."""
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def sample(got: Samples, name: str, **labels: str) -> float:
    """One sample's value; 0 when it is not served (a counter not started yet)."""
    return got.get((name, frozenset(labels.items())), 0.0)


def on_node(core: client.CoreV1Api, node: str = "localhost") -> list[Any]:
    """Every pod bound to ``node``, in every namespace, not finished."""
    return [p for p in core.list_pod_for_all_namespaces(
        field_selector=f"spec.nodeName={node}").items
        if p.status.phase not in ("Failed", "Succeeded")]


def held_exclusively(core: client.CoreV1Api, node: str = "localhost") -> set[int]:
    """The CPUs numalign gave exclusively to the pods bound to ``node`` that have not
    finished (their ``numalign.io/allocation``)."""
    out: set[int] = set()
    for p in on_node(core, node):
        alloc = allocation(p)
        for name in (alloc.containers if alloc is not None else {}):
            out |= exclusive(alloc, name)
    return out


def no_cpu_twice(node: Any, core: client.CoreV1Api, namespace: str) -> dict[str, Running]:
    """Every running container of ``namespace`` has the cpuset numalign decided (its
    exclusive CPUs, else the shared pool: the machine's CPUs no container holds
    exclusively), in its cgroup and for its process, and no CPU is exclusive to two
    containers or shared with one that holds it exclusively. Returns them by id."""
    pods = {p.metadata.uid: p for p in on_node(core)}
    held: dict[int, str] = {}  # CPU -> the one container it is exclusive to
    for pod in pods.values():
        alloc = allocation(pod)
        for c in (alloc.containers if alloc is not None else {}):
            here = f"{pod.metadata.namespace}/{pod.metadata.name}/{c}"
            for cpu in exclusive(alloc, c):
                assert cpu not in held, f"CPU {cpu} given to {held[cpu]} and to {here}"
                held[cpu] = here
    pool = set(node.machine().cpus) - set(held)
    assert pool, "the shared pool is empty"
    got = running(node, namespace=namespace)
    for r in got.values():
        pod = pods[r.pod_uid]
        alloc = allocation(pod)
        want = exclusive(alloc, r.name) or pool
        assert r.cgroup_cpus == want, (pod.metadata.name, r.name, r.cgroup_cpus, want, held)
        assert r.status_cpus == want, (pod.metadata.name, r.name, r.status_cpus, want)
        assert r.cgroup_mems == expected_mems(alloc, r.name), (pod.metadata.name, r)
    return got
