"""``numalign explain`` on a real node: the kubelet's own decision (what its PodResources
API lists, as the agent publishes it in NodeTopology ``status.admitted``, or the pod's
``TopologyAffinityError``) beside the engine's replay on the same state, and where they
differ.

The replay uses the kubelet's settings (``status.kubelet``: Topology Manager policy,
scope and options), holds the kubelet's reserved CPUs and every other pod's allocation,
and is compared container by container, on what PodResources reports: admitted or not,
the NUMA nodes of the exclusive CPUs and devices (and memory, under a memory manager
policy other than None), the CPU ids and the device ids.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from numalign.api.names import REJECT_REASON
from numalign.topology.explain import Explanation
from numalign.topology.machine import Machine
from numalign.topology.quantity import parse_cpulist

JSON = dict[str, Any]
SOURCE = "the kubelet's configuration (NodeTopology status.kubelet)"


def kubelet_decision(pod: Mapping[str, Any], entry: Mapping[str, Any] | None) -> JSON:
    """What the kubelet decided: ``admit`` True (with its containers as published), False
    (Failed with TopologyAffinityError), or None (not reported: not admitted yet, or the
    agent cannot read the kubelet)."""
    st = pod.get("status") or {}
    if entry is not None:
        containers: JSON = {}
        for c in entry.get("containers") or []:
            if isinstance(c, Mapping) and c.get("name"):
                containers[str(c["name"])] = {
                    "cpus": parse_cpulist(str(c.get("cpus") or "")),
                    "devices": {str(r): sorted(str(i) for i in ids)
                                for r, ids in (c.get("devices") or {}).items()},
                    "memory": {str(z): b for z, b in (c.get("memory") or {}).items()},
                    "numaNodes": list(c.get("numaNodes") or []),
                }
        return {"admit": True, "numaNodes": list(entry.get("numaNodes") or []),
                "containers": containers}
    if st.get("phase") == "Failed" and st.get("reason") == REJECT_REASON:
        return {"admit": False, "reason": REJECT_REASON, "message": st.get("message")}
    return {"admit": None}


def _numa_of(machine: Machine, c: Mapping[str, Any], with_memory: bool) -> list[int]:
    cpu_numa = {cpu.id: cpu.numa for cpu in machine.cpus.values()}
    dev_numa = {(d.resource, d.id): d.numa_node for d in machine.devices}
    nodes = {cpu_numa[i] for i in c.get("cpus") or [] if i in cpu_numa}
    for r, ids in (c.get("devices") or {}).items():
        nodes |= {n for i in ids if (n := dev_numa.get((r, i))) is not None}
    if with_memory:
        for z in (c.get("memory") or {}):
            nodes |= {int(x) for x in str(z).split(",") if x.isdigit()}
    return sorted(nodes)


def compare(ex: Explanation, kubelet: JSON, machine: Machine,
            settings: Mapping[str, Any]) -> list[str]:
    """Lines saying where the engine's replay and the kubelet agree or differ (also put
    in ``kubelet["agree"]``: True, False, or None when there is nothing to compare)."""
    if kubelet.get("admit") is None:
        kubelet["agree"] = None
        return ["the kubelet has not reported this pod (PodResources lists admitted pods "
                "only; see NodeTopology status.kubelet.podResources if it is unreadable): "
                "nothing to compare yet"]
    diffs: list[str] = []
    if bool(kubelet["admit"]) != ex.admit:
        diffs.append(f"the kubelet {'admitted' if kubelet['admit'] else 'rejected'} the pod, "
                     f"the engine {'admits' if ex.admit else 'rejects'} it")
    elif ex.admit:
        with_memory = str(settings.get("memoryManagerPolicy") or "None") != "None"
        static_cpus = str(settings.get("cpuManagerPolicy") or "none") == "static"
        engine = ex.allocation.get("containers") or {}
        for name, kc in kubelet["containers"].items():
            ec = engine.get(name)
            if ec is None:
                diffs.append(f"container {name}: the engine has no allocation for it")
                continue
            # Without the static CPU manager the kubelet gives no exclusive CPUs.
            ec_view = {"cpus": sorted(ec.get("cpus") or []) if static_cpus else [],
                       "devices": {r: sorted(ids) for r, ids in (ec.get("devices") or {}).items()
                                   if ids},
                       "memory": ec.get("memory") or {}}
            k_numa = _numa_of(machine, kc, with_memory)
            e_numa = _numa_of(machine, ec_view, with_memory)
            if k_numa != e_numa:
                diffs.append(f"container {name}: NUMA nodes: kubelet {k_numa}, engine {e_numa}")
            if kc["cpus"] != ec_view["cpus"]:
                diffs.append(f"container {name}: CPUs: kubelet {kc['cpus']}, "
                             f"engine {ec_view['cpus']}")
            if kc["devices"] != ec_view["devices"]:
                diffs.append(f"container {name}: devices: kubelet {kc['devices']}, "
                             f"engine {ec_view['devices']}")
    kubelet["agree"] = not diffs
    if diffs:
        return [f"the engine DIFFERS from the kubelet: {d}" for d in diffs]
    what = ("admitted with the same CPUs, devices and NUMA nodes" if ex.admit
            else f"rejected ({kubelet.get('reason')})")
    return [f"the engine agrees with the kubelet: {what}"]

