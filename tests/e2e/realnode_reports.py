"""What the real node's parties report about its pods, read back by
tests/e2e/test_realnode_e2e.py: the kubelet's PodResources API, numalign's NodeTopology,
the NodeResourceTopology fingerprint and ``numalign explain``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from kubernetes import client

from numalign.agent import nrt
from numalign.agent import podfingerprint as pfp

# pod -> container -> (cpulist, {resource: sorted device ids})
Allocations = dict[str, dict[str, tuple[str, dict[str, list[str]]]]]


def podresources(node: Any, namespace: str) -> Allocations:
    """What the kubelet's PodResources API lists for ``namespace``: pod -> container ->
    (cpulist, {resource: sorted device ids})."""
    import asyncio

    from numalign.agent.podresources import PodResourcesClient
    from numalign.topology.quantity import format_cpulist

    async def read() -> Any:
        c = PodResourcesClient(str(node.pod_resources_socket))
        try:
            return await c.snapshot()
        finally:
            await c.close()

    snap = asyncio.run(read())
    return {p.name: {c.name: (format_cpulist(list(c.cpus)),
                              {d.resource: sorted(d.ids) for d in c.devices})
                     for c in p.containers}
            for p in snap.pods if p.namespace == namespace}


def nodetopology(k8s_client: Any, namespace: str) -> Allocations:
    """The same, as the real node's NodeTopology status shows it."""
    nt = client.CustomObjectsApi(k8s_client).get_cluster_custom_object(
        "numalign.io", "v1alpha1", "nodetopologies", "localhost")
    out: Allocations = {}
    for pod in (nt.get("status") or {}).get("admitted") or []:
        if pod.get("namespace") != namespace:
            continue
        out[pod["pod"]] = {
            c["name"]: (c.get("cpus") or "",
                        {r: sorted(ids) for r, ids in (c.get("devices") or {}).items()})
            for c in pod.get("containers") or []}
    return out


def nrt_fingerprint(k8s_client: Any, core: client.CoreV1Api, namespace: str,
                     exclusive: list[str]) -> bool:
    """Whether the real node's NodeResourceTopology fingerprint is that of the pods the
    scheduler plugin counts (its Dedicated informer: the node's pods not Pending; method
    with-exclusive-resources), ``exclusive`` of ``namespace`` among them."""
    nrt_obj = client.CustomObjectsApi(k8s_client).get_cluster_custom_object(
        "topology.node.k8s.io", "v1alpha2", "noderesourcetopologies", "localhost")
    pods = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=localhost").items
    entries = [pfp.pod_entry(k8s_client.sanitize_for_serialization(p)) for p in pods]
    counted = [e for e in entries if e.listed(pfp.INFORMER_DEDICATED)
               and e.exclusive(nrt.resource_names(nrt_obj))]
    assert {e.name for e in counted if e.namespace == namespace} <= set(exclusive)
    if {e.name for e in counted if e.namespace == namespace} != set(exclusive):
        return False
    attrs = {a["name"]: a["value"] for a in nrt_obj.get("attributes") or []}
    return bool(attrs.get(pfp.ATTRIBUTE) == pfp.sign((e.namespace, e.name) for e in counted))


def explain(kubeconfig: Path, namespace: str, name: str) -> dict[str, Any]:
    """``numalign explain POD -o json`` on the real node: the kubelet's decision beside the
    engine's replay. Prints one row of the engine-vs-kubelet table."""
    proc = subprocess.run([sys.executable, "-m", "numalign.cli", "explain", name, "-n",
                           namespace, "-o", "json"], capture_output=True, text=True,
                          env=dict(os.environ, KUBECONFIG=str(kubeconfig)), timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    kubelet = doc["kubelet"]
    print(f"[engine-vs-kubelet] {name}: kubelet admit={kubelet.get('admit')} "
          f"containers={kubelet.get('containers')}; engine admit={doc.get('admit')} "
          f"allocation={(doc.get('allocation') or {}).get('containers')}; "
          f"agree={kubelet.get('agree')}", flush=True)
    return doc
