"""What a kubelet writes, built as plain API objects (pure: no I/O).

Node objects with capacity from a machine file, node leases, the status of a pod the
kubelet started (Running with its conditions and container statuses) or rejected at
admission (Failed, with the kubelet's reason and message), and the Warning event the
kubelet records on rejection.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from numalign.api.names import LABEL_EMULATED, LABEL_MACHINE, REJECTED_PREFIX
from numalign.topology.machine import Machine
from numalign.topology.resourcefit import DEFAULT_EPHEMERAL_STORAGE, DEFAULT_MAX_PODS

JSON = dict[str, Any]

KUBELET_VERSION = "v1.37.2"


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _quantity(n: int) -> str:
    """Bytes as the API server would print them: the largest exact binary suffix."""
    for suffix, size in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if n and n % size == 0:
            return f"{n // size}{suffix}"
    return str(n)


def machine_resources(machine: Machine, max_pods: int = DEFAULT_MAX_PODS) -> dict[str, str]:
    """Capacity (= allocatable: an emulated node reserves nothing) from a machine file;
    the engine's resource-fit check (``topology.resourcefit.allocatable``) counts the same."""
    res: dict[str, str] = {
        "cpu": str(len(machine.cpus)),
        "memory": _quantity(sum(n.memory for n in machine.numa_nodes)),
        "pods": str(max_pods),
        "ephemeral-storage": _quantity(DEFAULT_EPHEMERAL_STORAGE),
    }
    for size in machine.hugepage_sizes:
        total = sum(n.hugepages.get(size, 0) for n in machine.numa_nodes)
        res[f"hugepages-{size}"] = _quantity(total)
    for r in machine.device_resources:
        res[r] = str(len(machine.devices_of(r)))
    return res


def node_addresses(index: int) -> tuple[str, str]:
    """(InternalIP, pod IP prefix "a.b.c.") for the emulated node number ``index``."""
    hi, lo = (index >> 8) & 0xFF, index & 0xFF
    return f"172.{16 + (hi & 0x0F)}.{lo}.{1 + (hi >> 4)}", f"10.{128 + (hi & 0x7F)}.{lo}."


def _ids(name: str) -> str:
    return hashlib.sha1(name.encode()).hexdigest()[:32]


def node_status(name: str, machine: Machine, index: int, *,
                max_pods: int = DEFAULT_MAX_PODS, since: str | None = None) -> JSON:
    t = now_iso()
    since = since or t
    res = machine_resources(machine, max_pods)
    ip, _ = node_addresses(index)

    def cond(type_: str, status: str, reason: str, message: str) -> JSON:
        return {"type": type_, "status": status, "reason": reason, "message": message,
                "lastHeartbeatTime": t, "lastTransitionTime": since}

    return {
        "capacity": res,
        "allocatable": dict(res),
        "conditions": [
            cond("MemoryPressure", "False", "KubeletHasSufficientMemory",
                 "kubelet has sufficient memory available"),
            cond("DiskPressure", "False", "KubeletHasNoDiskPressure",
                 "kubelet has no disk pressure"),
            cond("PIDPressure", "False", "KubeletHasSufficientPID",
                 "kubelet has sufficient PID available"),
            cond("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
        ],
        "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {
            "machineID": _ids("machine/" + name), "systemUUID": _ids("uuid/" + name),
            "bootID": _ids("boot/" + name), "kernelVersion": "6.8.0-numalign-emulated",
            "osImage": f"numalign emulated node ({machine.name})",
            "containerRuntimeVersion": "emulated://1.0", "kubeletVersion": KUBELET_VERSION,
            "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64",
        },
    }


def node_object(name: str, machine: Machine, index: int, *,
                labels: Mapping[str, str] | None = None,
                max_pods: int = DEFAULT_MAX_PODS) -> JSON:
    all_labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": "amd64",
        LABEL_MACHINE: machine.name,
        LABEL_EMULATED: "true",
    }
    all_labels.update(labels or {})
    _, prefix = node_addresses(index)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": all_labels,
                     "annotations": {"node.alpha.kubernetes.io/ttl": "0"}},
        "spec": {"podCIDR": prefix + "0/24", "podCIDRs": [prefix + "0/24"]},
        "status": node_status(name, machine, index, max_pods=max_pods),
    }


def lease_object(name: str, node_uid: str | None, duration: int = 40) -> JSON:
    meta: JSON = {"name": name, "namespace": "kube-node-lease"}
    if node_uid:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": name,
                                    "uid": node_uid}]
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": meta,
        "spec": {"holderIdentity": name, "leaseDurationSeconds": duration,
                 "renewTime": now_micro()},
    }


def _container_id(pod_uid: str, name: str) -> str:
    return "emulated://" + hashlib.sha256(f"{pod_uid}/{name}".encode()).hexdigest()


def _image_id(image: str) -> str:
    repo = image.split("@", 1)[0]
    last = repo.rsplit("/", 1)[-1]
    if ":" in last:
        repo = repo[: len(repo) - len(last)] + last.split(":", 1)[0]
    if "/" not in repo:
        repo = "docker.io/library/" + repo
    elif "." not in repo.split("/", 1)[0] and ":" not in repo.split("/", 1)[0]:
        repo = "docker.io/" + repo
    return f"{repo}@sha256:{hashlib.sha256(image.encode()).hexdigest()}"


def _full_image(image: str) -> str:
    first = image.split("/", 1)[0]
    name = image
    if "/" not in image:
        name = "docker.io/library/" + image
    elif "." not in first and ":" not in first and first != "localhost":
        name = "docker.io/" + image
    last = name.rsplit("/", 1)[-1]
    if "@" not in name and ":" not in last:
        name += ":latest"
    return name


def _running_status(pod_uid: str, c: Mapping[str, Any], started: str) -> JSON:
    image = str(c.get("image") or "")
    return {
        "name": c.get("name"), "image": _full_image(image), "imageID": _image_id(image),
        "containerID": _container_id(pod_uid, str(c.get("name"))),
        "ready": True, "started": True, "restartCount": 0,
        "state": {"running": {"startedAt": started}}, "lastState": {},
    }


def _completed_status(pod_uid: str, c: Mapping[str, Any], started: str) -> JSON:
    image = str(c.get("image") or "")
    cid = _container_id(pod_uid, str(c.get("name")))
    return {
        "name": c.get("name"), "image": _full_image(image), "imageID": _image_id(image),
        "containerID": cid, "ready": False, "started": False, "restartCount": 0,
        "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": started,
                                 "finishedAt": started, "containerID": cid}},
        "lastState": {},
    }


def qos_class(pod: Mapping[str, Any]) -> str:
    spec = pod.get("spec") or {}
    containers = list(spec.get("containers") or []) + list(spec.get("initContainers") or [])
    any_set = False
    guaranteed = True
    for c in containers:
        res = c.get("resources") or {}
        req = res.get("requests") or {}
        lim = res.get("limits") or {}
        if req or lim:
            any_set = True
        for r in ("cpu", "memory"):
            limit = lim.get(r)
            if limit is None or str(req.get(r, limit)) != str(limit):
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def running_status(pod: Mapping[str, Any], host_ip: str, pod_ip: str,
                   scheduled_at: str | None = None) -> JSON:
    """The status a kubelet reports once all containers of ``pod`` started."""
    t = now_iso()
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    uid = str(meta.get("uid") or "")
    init_statuses = []
    for c in spec.get("initContainers") or []:
        if c.get("restartPolicy") == "Always":
            init_statuses.append(_running_status(uid, c, t))
        else:
            init_statuses.append(_completed_status(uid, c, t))
    host_network = bool(spec.get("hostNetwork"))
    ip = host_ip if host_network else pod_ip

    def cond(type_: str, when: str = t) -> JSON:
        return {"type": type_, "status": "True", "lastProbeTime": None,
                "lastTransitionTime": when}

    status: JSON = {
        "phase": "Running",
        "conditions": [
            cond("PodReadyToStartContainers"), cond("Initialized"), cond("Ready"),
            cond("ContainersReady"), cond("PodScheduled", scheduled_at or t),
        ],
        "hostIP": host_ip, "hostIPs": [{"ip": host_ip}],
        "podIP": ip, "podIPs": [{"ip": ip}],
        "startTime": t,
        "qosClass": qos_class(pod),
        "containerStatuses": [_running_status(uid, c, t) for c in spec.get("containers") or []],
    }
    if init_statuses:
        status["initContainerStatuses"] = init_statuses
    return status


def rejected_status(pod: Mapping[str, Any], reason: str, message: str,
                    scheduled_at: str | None = None) -> JSON:
    """The status a kubelet writes for a pod its admission rejected."""
    if not message.startswith(REJECTED_PREFIX):
        message = REJECTED_PREFIX + message
    status: JSON = {"phase": "Failed", "reason": reason, "message": message,
                    "qosClass": qos_class(pod)}
    if scheduled_at:
        status["conditions"] = [{"type": "PodScheduled", "status": "True",
                                 "lastProbeTime": None, "lastTransitionTime": scheduled_at}]
    return status


def scheduled_at(pod: Mapping[str, Any]) -> str | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "True":
            t = c.get("lastTransitionTime")
            return str(t) if t else None
    return None


def pod_event(pod: Mapping[str, Any], node: str, type_: str, reason: str, message: str,
              component: str = "kubelet") -> JSON:
    """A core/v1 Event on ``pod`` as the kubelet's recorder writes it."""
    meta = pod.get("metadata") or {}
    t = now_iso()
    name = str(meta.get("name"))
    suffix = hashlib.sha1(f"{meta.get('uid')}/{reason}/{now_micro()}".encode()).hexdigest()[:10]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.{suffix}", "namespace": meta.get("namespace")},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": name,
                           "namespace": meta.get("namespace"), "uid": meta.get("uid"),
                           "resourceVersion": meta.get("resourceVersion")},
        "reason": reason, "message": message, "type": type_,
        "source": {"component": component, "host": node},
        "reportingComponent": component, "reportingInstance": node,
        "firstTimestamp": t, "lastTimestamp": t, "count": 1,
    }
